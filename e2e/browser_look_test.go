package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
)

// The demo and the panel as a human sees them: with the system in dark mode
// both follow prefers-color-scheme, and every text keeps its contrast (axe's
// color-contrast rule runs on the colours the browser computed). An
// approval's words follow the app's state while it waits. With lapd gone,
// the panel says what is happening and what to do.
//
//	go test ./e2e -run 'TestBrowser(Dark|Offline)' -v

// bgOf is the computed background colour of the element elem selects.
func (b *browserTab) bgOf(elem string) string {
	b.t.Helper()
	return b.evalString(`getComputedStyle(` + elem + `).backgroundColor`)
}

func TestBrowserDark(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	tab := browserOpen(t, srv.URL+"/")
	tab.emulateMedia("prefers-color-scheme", "dark")
	tab.waitStatus("idle", 10*time.Second)

	// The page and the panel are both dark (the panel was always light).
	if bg := tab.bgOf(`document.documentElement`); bg != "rgb(13, 17, 23)" {
		t.Errorf("the demo's background in dark mode is %s", bg)
	}
	if bg := tab.bgOf(panelJS("panel")); bg != "rgb(22, 27, 34)" {
		t.Errorf("the panel's background in dark mode is %s, want the dark palette's", bg)
	}
	tab.axe("dark, idle")

	tab.click(panelJS("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	tab.axe("dark, waiting for the AI")

	// Every kind of feed line and an approval card, in dark.
	mc, args := connectModel(t, tab, srv.URL)
	browserOK(t, mc, "observe", args())
	browserOK(t, mc, "narrate", args("text", "Adding a task, then asking to clear the board."))
	browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Buy milk"}))
	browserCall(t, mc, "send_message", args("msg", map[string]any{"type": "resetDemo"}))
	pend := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "reason", "you asked for a fresh start", "approvalTimeoutMs", 0))
	cid, _ := pend["confirmId"].(string)
	tab.waitJS(`!!`+panelJS("approve-"+cid), 10*time.Second)
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Blocked: Reset the demo board')`, 10*time.Second)
	tab.click(panelJS("feed-details"))
	tab.axe("dark, approval and feed with details")

	// The card says what Approve will do now: the human adds a task while
	// the approval waits, and the count follows at once.
	card := func() string { return tab.evalString(panelJS("card-"+cid) + `.innerText`) }
	if c := card(); !strings.Contains(c, "Delete every task (4 tasks)") {
		t.Fatalf("card %q", c)
	}
	tab.eval(`(() => { const i = document.querySelector('#new-title'); i.value = 'Added while asked'; i.form.requestSubmit(); return true })()`, nil)
	tab.waitJS(`(`+panelJS("card-"+cid)+`).innerText.includes('Delete every task (5 tasks)')`, 5*time.Second)
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Waiting for your approval: Delete every task (5 tasks)')`, 5*time.Second)
	tab.click(panelJS("approve-" + cid))
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Approved by you: Delete every task (5 tasks)')`, 5*time.Second)

	// An app with one theme fixes the panel's: ui.theme 'light' stays light
	// in a dark system.
	tab.eval(`import('/agent/client.js').then((m) => {
	  const box = document.createElement('div'); box.id = 'light-box'; document.body.append(box)
	  window.__light = m.createAgent({ app: { name: 'light' }, getState: () => ({}), storage: null, autoRestore: false,
	    ui: { container: box, theme: 'light', shortcut: false } })
	  return true })`, nil)
	tab.waitJS(`!!document.querySelector('#light-box [data-lapd-panel]')`, 5*time.Second)
	if bg := tab.bgOf(`document.querySelector('#light-box [data-lapd-panel]').shadowRoot.querySelector('[data-testid=panel]')`); bg != "rgb(255, 255, 255)" {
		t.Errorf("a panel with theme 'light' in dark mode has background %s", bg)
	}
	tab.eval(`window.__light.destroy(), true`, nil)
	if p := tab.pageProblems(); len(p) > 0 {
		t.Errorf("the page reported errors: %v", p)
	}
}

// TestBrowserOffline: lapd goes away under a connected tab. The panel says
// what is happening and what the human can do; a Disconnect whose revoke
// cannot reach lapd says so instead of looking like a clean end; Connect
// then says lapd cannot be reached.
func TestBrowserOffline(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(panelJS("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	connectModel(t, tab, srv.URL)

	srv.stop(t)
	tab.waitStatus("reconnecting", 10*time.Second)
	tab.waitJS(`!!`+panelJS("retry")+` && `+panelJS("reconnecting")+`.textContent.includes('your approvals are kept')`, 5*time.Second)
	tab.click(panelJS("retry")) // an attempt at once; lapd is still down
	tab.waitStatus("reconnecting", 5*time.Second)
	tab.axe("reconnecting")

	tab.click(panelJS("disconnect"))
	tab.waitStatus("idle", 10*time.Second)
	tab.waitJS(`(`+panelJS("connect-section")+`).textContent.includes('could not be reached to end the AI')`, 10*time.Second)

	tab.click(panelJS("connect"))
	tab.waitStatus("error", 10*time.Second)
	if e := tab.evalString(panelJS("error") + `.textContent`); !strings.Contains(e, "lapd could not be reached") {
		t.Errorf("Connect with lapd down says %q", e)
	}
	if b := tab.evalString(panelJS("connect") + `.textContent`); b != "Connect again" {
		t.Errorf("the button after a failed connect reads %q", b)
	}
}

// TestBrowserCopy: the connect line reaches the clipboard whole with one
// click on Copy (a real mouse click, the page allowed the clipboard as a
// person's browser allows a click to write it); where the browser refuses,
// the panel says so under the line (not only to a screen reader) and
// leaves the line selected for the keyboard's copy.
func TestBrowserCopy(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	tab := browserOpen(t, srv.URL+"/")
	clipboard := func(setting cdpbrowser.PermissionSetting) {
		t.Helper()
		for _, perm := range []string{"clipboard-read", "clipboard-write"} {
			params := cdpbrowser.SetPermissionParams{Permission: &cdpbrowser.PermissionDescriptor{Name: perm}, Setting: setting, Origin: srv.URL}
			ctx, cancel := context.WithTimeout(tab.ctx, 10*time.Second)
			err := chromedp.FromContext(tab.ctx).Browser.Call(ctx, cdpbrowser.CommandSetPermission, params, nil)
			cancel()
			if err != nil {
				t.Fatalf("setting %s %s: %v", perm, setting, err)
			}
		}
	}
	clipboard(cdpbrowser.PermissionSettingGranted)
	tab.waitStatus("idle", 10*time.Second)
	tab.click(panelJS("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(panelJS("connect-line") + `.value`)

	r := tab.rect(panelJS("copy"))
	browserRun(t, tab.ctx, 10*time.Second, chromedp.MouseClickXY((r.Left+r.Right)/2, (r.Top+r.Bottom)/2))
	tab.waitJS(panelJS("copy")+`.textContent === 'Copied'`, 5*time.Second)
	got := browserRun(t, tab.ctx, 10*time.Second, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
	if got != line {
		t.Fatalf("the clipboard holds %q, want the connect line %q", got, line)
	}
	if tab.evalString(`String(!!`+panelJS("copy-failed")+`)`) != "false" {
		t.Error("a copy that worked shows the failure text")
	}

	// A browser that refuses the clipboard (a page served over plain HTTP
	// on a LAN address has no navigator.clipboard, and execCommand may say
	// no): the failure is shown under the line, the line selected.
	tab.eval(`Object.defineProperty(navigator, 'clipboard', { value: undefined, configurable: true }); document.execCommand = () => false; true`, nil)
	tab.click(panelJS("copy"))
	tab.waitJS(`!!`+panelJS("copy-failed"), 5*time.Second)
	if s := tab.evalString(panelJS("copy-failed") + `.textContent`); !strings.Contains(s, "Ctrl+C") {
		t.Errorf("the copy failure says %q", s)
	}
	if b := tab.evalString(panelJS("copy") + `.textContent`); b != "Copy" {
		t.Errorf("after a failed copy the button reads %q", b)
	}
	var sel struct {
		Focus   string
		Start   int
		End     int
		LineLen int
	}
	tab.eval(`(() => { const i = `+panelJS("connect-line")+`; return {Focus: `+browserPanel+`.activeElement === i ? 'line' : 'elsewhere', Start: i.selectionStart, End: i.selectionEnd, LineLen: i.value.length} })()`, &sel)
	if sel.Focus != "line" || sel.Start != 0 || sel.End != sel.LineLen {
		t.Errorf("after a failed copy the line is not focused and selected: %+v", sel)
	}
	tab.axe("copy failed")
}
