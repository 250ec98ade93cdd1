package e2e

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserBackForwardCache: the user follows a link out of the app and
// comes back with the Back button. Chromium keeps the page in its
// back/forward cache — the JavaScript heap, lapd.js and its session
// included — and closes its WebSocket meanwhile. Restored, lapd.js
// reconnects by itself, and the model's next call reaches the page.
func TestBrowserBackForwardCache(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	tab := browserOpen(t, srv.URL+"/")
	mc, sess := browserConnectAI(t, tab, srv.URL)

	var ok bool
	tab.eval(`(() => {
  window.__kept = true // survives only a restore from the cache, not a reload
  window.__shown = []
  addEventListener('pageshow', (e) => window.__shown.push(e.persisted))
  return true
})()`, &ok)
	browserRun(t, tab.ctx, 10*time.Second, chromedp.Navigate(srv.URL+"/agent/client.js")) // away, same origin
	if _, err := chromedp.Run(tab.ctx, chromedp.Evaluate[any](`history.back()`)); err != nil {
		t.Fatalf("history.back: %v", err)
	}
	// The restored page keeps its own JavaScript context, which chromedp
	// dropped when the page went away: evaluations fail ("Cannot find
	// context") until it reports the page's context again, and its Poll
	// does not see the restored page. So this waits with Evaluate.
	until := func(js string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			v, err := chromedp.Run(tab.ctx, chromedp.Evaluate[bool](`!!(`+js+`)`))
			if err == nil && v {
				return
			}
			if time.Now().After(deadline) {
				st, _ := chromedp.Run(tab.ctx, chromedp.Evaluate[string](`window.__lapd ? window.__lapd.status : 'no agent'`))
				t.Fatalf("waiting %v for %s: %v, %v (agent status %s)", d, js, v, err, st)
			}
			time.Sleep(50 * time.Millisecond) // a poll: the browser sends no event for it
		}
	}
	until(`window.__kept === true && window.__shown.length === 1`, 10*time.Second)
	var persisted bool
	tab.eval(`window.__shown[0]`, &persisted)
	if !persisted {
		t.Fatal("the page was not restored from the back/forward cache (pageshow.persisted false)")
	}
	// Reconnected (a re-pair is active at once), and the panel shows it.
	until(`window.__lapd.status === 'active' && `+browserTestID("status")+`.getAttribute('data-status') === 'active'`, 15*time.Second)
	obs := browserOK(t, mc, "observe", map[string]any{"session": sess})
	state, _ := obs["state"].(map[string]any)
	if tasks, _ := state["tasks"].([]any); len(tasks) != 3 {
		t.Fatalf("observe after the page came back: %s", browserJSON(obs))
	}
	r := browserOK(t, mc, "send_message", map[string]any{"session": sess, "msg": map[string]any{"type": "addTask", "title": "after Back"}})
	if r["status"] != "dispatched" {
		t.Fatalf("send_message after the page came back: %s", browserJSON(r))
	}
	until(`[...document.querySelectorAll('#board li.task .title')].some((e) => e.textContent === 'after Back')`, 5*time.Second)
}
