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
	// dropped when the page went away: its Poll does not see the restored
	// page. So this waits with waitEval.
	tab.waitEval(`window.__kept === true && window.__shown.length === 1`, 10*time.Second)
	var persisted bool
	tab.eval(`window.__shown[0]`, &persisted)
	if !persisted {
		t.Fatal("the page was not restored from the back/forward cache (pageshow.persisted false)")
	}
	// Reconnected (a re-pair is active at once), and the panel shows it.
	tab.waitEval(`window.__lapd.status === 'active' && `+browserTestID("status")+`.getAttribute('data-status') === 'active'`, 15*time.Second)
	obs := browserOK(t, mc, "observe", map[string]any{"session": sess})
	state, _ := obs["state"].(map[string]any)
	if tasks, _ := state["tasks"].([]any); len(tasks) != 3 {
		t.Fatalf("observe after the page came back: %s", browserJSON(obs))
	}
	r := browserOK(t, mc, "send_message", map[string]any{"session": sess, "msg": map[string]any{"type": "addTask", "title": "after Back"}})
	if r["status"] != "dispatched" {
		t.Fatalf("send_message after the page came back: %s", browserJSON(r))
	}
	tab.waitEval(`[...document.querySelectorAll('#board li.task .title')].some((e) => e.textContent === 'after Back')`, 5*time.Second)
}
