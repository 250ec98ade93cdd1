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

// TestBrowserHiddenTabThrottled: a hidden page whose timers the browser
// runs about once a minute (Chrome's intensive wake-up throttling, after 5
// minutes hidden; Safari every 40 s) sends lapd.js's heartbeat that rarely.
// The server must not take that silence for a dead tab while the page said
// it is hidden (PROTOCOL.md: two minutes and a half), or an idle hidden tab
// is closed and reconnected every minute or two. Chromium is started with
// the throttling forced on after 10 s hidden (not 5 minutes), and lapd with
// a 5 s heartbeat, so a visible tab would be closed after 12.5 s of
// silence. Without the server's allowance the tab is closed (4408) and
// reconnects (checked). It takes about 100 s.
func TestBrowserHiddenTabThrottled(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "", "--heartbeat", "5s")
	tab := browserLaunch(t, srv.URL+"/", browserDesktopW, browserDesktopH, true,
		chromedp.Flag("enable-features", "IntensiveWakeUpThrottling:grace_period_seconds/10"),
		chromedp.Flag("intensive-wake-up-throttling-policy", "1"))
	mc, sess := browserConnectAI(t, tab, srv.URL)
	tab.eval(`(() => {
  window.__pings = []; window.__sockets = new Set()
  const send = WebSocket.prototype.send
  WebSocket.prototype.send = function (d) {
    if (typeof d === 'string' && d.includes('"t":"ping"')) { window.__pings.push(Date.now()); window.__sockets.add(this) }
    return send.call(this, d)
  }
  return true
})()`, nil)
	f := false
	if _, err := chromedp.CallBrowser(tab.ctx, target.CreateTarget, target.CreateTargetParams{URL: "about:blank", NewWindow: &f, Background: &f}); err != nil {
		t.Fatalf("opening a tab in front: %v", err)
	}
	tab.waitJS(`document.visibilityState === 'hidden'`, 10*time.Second)
	// The heartbeat's timer becomes throttled once it has fired five times
	// and the page has been hidden 10 s: then two pings 25 s apart or more
	// (twice what a visible tab may be silent), on the one socket.
	gap := `(() => { const p = window.__pings; let g = 0; for (let i = 1; i < p.length; i++) g = Math.max(g, p[i] - p[i - 1]); return g })()`
	tab.waitEval(gap+` >= 25000 && window.__sockets.size === 1 && window.__lapd.status === 'active'`, 150*time.Second)
	var g float64
	tab.eval(gap, &g)
	obs := browserOK(t, mc, "observe", map[string]any{"session": sess})
	h := browserJSON(obs["health"])
	if !strings.Contains(h, `"visible":false`) || !strings.Contains(h, `"reconnects":0`) || !strings.Contains(h, `"connected":true`) {
		t.Fatalf("after %.0f s between two heartbeats of the hidden tab: health %s, want connected, hidden, no reconnect", g/1000, h)
	}
	t.Logf("the hidden tab stayed paired through %.0f s between two heartbeats (a visible one is closed after 12.5 s)", g/1000)
}
