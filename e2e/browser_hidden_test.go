package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
)

// TestBrowserHiddenTab: the user pastes the connect line into Claude in
// another tab of the same browser, so the app's tab is hidden while the
// model drives it — and a browser runs a hidden page's timers at most once
// a second (Chrome's default; the other browser tests turn that off). The
// test keeps the default, hides the app's tab behind a new foreground tab,
// and checks that the model's calls still work, the tab stays paired, and
// an approval asked for meanwhile shows in the tab's title.
// It measures (it does not assert) send_message end to end, shown and
// hidden, with a lapd built without -race:
//
//	go test ./e2e -run TestBrowserHiddenTab -v
func TestBrowserHiddenTab(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	// Not parallel: swapping the binary parallel tests start is safe while
	// this top-level test runs (as TestBrowserPerf).
	raceBin := lapdBin
	lapdBin = browserBuildPlain(t)
	t.Cleanup(func() { lapdBin = raceBin })

	srv := startServer(t, "", "--lap-rate", "100000", "--log-level", "info")
	tab := browserLaunch(t, srv.URL+"/", browserDesktopW, browserDesktopH, true)
	mc, sess := browserConnectAI(t, tab, srv.URL)

	const n = 20
	tasks := 3
	batch := func(label string) {
		t.Helper()
		d := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			start := time.Now()
			r := browserOK(t, mc, "send_message", map[string]any{"session": sess, "msg": map[string]any{"type": "addTask", "title": fmt.Sprintf("%s %d", label, i)}})
			d = append(d, time.Since(start))
			if r["status"] != "dispatched" {
				t.Fatalf("send_message while %s: %s", label, browserJSON(r))
			}
		}
		tasks += n
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		t.Logf("PERF send_message, tab %-7s over %d calls: p50 %v, p90 %v, min %v, max %v", label, n,
			d[n/2].Round(time.Millisecond), d[n*9/10].Round(time.Millisecond), d[0].Round(time.Millisecond), d[n-1].Round(time.Millisecond))
	}
	batch("shown")

	title := tab.evalString(`document.title`)
	// Another tab comes to the front of the same window: the app's page is
	// hidden, as when the user switches to Claude.
	f := false
	if _, err := chromedp.CallBrowser(tab.ctx, target.CreateTarget, target.CreateTargetParams{URL: "about:blank", NewWindow: &f, Background: &f}); err != nil {
		t.Fatalf("opening a tab in front: %v", err)
	}
	tab.waitJS(`document.visibilityState === 'hidden'`, 10*time.Second)
	obs := browserOK(t, mc, "observe", map[string]any{"session": sess})
	if !strings.Contains(browserJSON(obs["health"]), `"visible":false`) {
		t.Fatalf("observe of the hidden tab: health %s, want visible:false", browserJSON(obs["health"]))
	}
	batch("hidden")

	obs = browserOK(t, mc, "observe", map[string]any{"session": sess})
	state, _ := obs["state"].(map[string]any)
	if got, _ := state["tasks"].([]any); len(got) != tasks {
		t.Fatalf("the hidden page's state holds %d tasks, want %d", len(got), tasks)
	}
	if st := tab.evalString(`window.__lapd.status`); st != "active" {
		t.Fatalf("the hidden tab's agent is %q, want active", st)
	}

	// An approval while the page is hidden: the tab strip says so (the
	// page's title), and the title is the app's again once it is shown.
	r := browserOK(t, mc, "send_message", map[string]any{"session": sess, "msg": map[string]any{"type": "clearAll"}, "approvalTimeoutMs": 0})
	if r["status"] != "pending-confirmation" {
		t.Fatalf("clearAll: %s", browserJSON(r))
	}
	want := "(1) Approval needed · " + title
	tab.waitJS(`document.title === `+browserJSON(want), 10*time.Second)
	app := chromedp.FromContext(tab.ctx).Target.TargetID
	if _, err := chromedp.CallBrowser(tab.ctx, target.ActivateTarget, target.ActivateTargetParams{TargetID: app}); err != nil {
		t.Fatalf("bringing the app's tab to the front: %v", err)
	}
	tab.waitJS(`document.visibilityState === 'visible' && document.title === `+browserJSON(title), 10*time.Second)
}
