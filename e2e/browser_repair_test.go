package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// recordFrames makes every later page load of the tab keep the text frames
// its WebSockets receive in window.__frames.
const recordFrames = `(() => {
  const WS = window.WebSocket
  window.__frames = []
  window.WebSocket = class extends WS {
    constructor (...a) {
      super(...a)
      this.addEventListener('message', (e) => { if (typeof e.data === 'string') window.__frames.push(e.data) })
    }
  }
})()`

// TestBrowserReloadBeforePaste: the human clicks "Connect an AI" and
// reloads the page before pasting the line into a chat. The tab re-pairs
// (the reference's re-pair makes the record active and pushes
// {t:'active'}), yet no model has the line: the panel must go on asking for
// it, not say an AI is connected. Once the model has used the line, a
// reload is a re-pair that stays active.
func TestBrowserReloadBeforePaste(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, t.TempDir(), "--grace", "60s")
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)
	if _, err := chromedp.Call(tab.ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: recordFrames}); err != nil {
		t.Fatal(err)
	}

	// 1. Reload before any model call: the re-pair's push says no model.
	browserRun(t, tab.ctx, 20*time.Second, chromedp.Reload())
	active := `(window.__frames || []).find((f) => JSON.parse(f).t === 'active') || ''`
	tab.waitJS(`!!(`+active+`)`, 10*time.Second)
	if f := tab.evalString(active); f != `{"t":"active","model":false}` {
		t.Fatalf("the re-pair before any model call pushed %s, want {\"t\":\"active\",\"model\":false}", f)
	}
	tab.waitStatus("pending-claude", 5*time.Second)
	if got := tab.evalString(browserTestID("connect-line") + `.value`); got != line {
		t.Fatalf("connect line after reload %q, want the same %q", got, line)
	}
	if txt := tab.evalString(browserPanel + `.textContent`); !strings.Contains(txt, "Paste this line into your AI chat") {
		t.Fatalf("after a reload before pasting, the panel does not ask for the line: %q", txt)
	}

	// 2. The model pastes the line: its first call activates the tab.
	mc := browserMCPHTTP(t, srv.URL)
	sc := browserOK(t, mc, "connect_session", map[string]any{"line": line})
	sess, _ := sc["session"].(string)
	tab.waitStatus("active", 10*time.Second)

	// 3. A reload now is the reference's re-pair: active at once.
	browserRun(t, tab.ctx, 20*time.Second, chromedp.Reload())
	tab.waitJS(`!!(`+active+`)`, 10*time.Second)
	if f := tab.evalString(active); f != `{"t":"active"}` {
		t.Fatalf("the re-pair after the model's call pushed %s, want {\"t\":\"active\"}", f)
	}
	tab.waitStatus("active", 5*time.Second)
	obs := browserOK(t, mc, "observe", map[string]any{"session": sess})
	if tasks, _ := obs["state"].(map[string]any)["tasks"].([]any); len(tasks) != 3 {
		t.Fatalf("observe after the second reload: %s", browserJSON(obs["state"]))
	}
}
