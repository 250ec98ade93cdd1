package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	mcpclient "github.com/mark3labs/mcp-go/client"
)

// The panel as people use it: by keyboard (and so by screen reader) on a
// desktop, by touch on a 390 px phone, with an accessibility audit (axe-core)
// at each step and a feed that speaks the human's language. Both drive the
// real binary, the demo Taskboard and lapd.js in headless Chromium, and the
// model side through mcp-go over /agent/mcp.
//
//	go test ./e2e -run 'TestBrowser(Keyboard|Phone)' -v
//	LAPD_SCREENSHOTS=1 go test ./e2e -run 'TestBrowserChain/^http$' && LAPD_SCREENSHOTS=1 go test ./e2e -run TestBrowserPhone   # rewrite docs/screenshots

// panelJS evaluates to the element with data-testid id in the panel.
func panelJS(id string) string { return browserTestID(id) }

// rect is an element's bounding box in CSS pixels.
type rect struct{ Top, Bottom, Left, Right, Width, Height float64 }

func (b *browserTab) rect(elem string) rect {
	b.t.Helper()
	var r rect
	b.eval(`(() => { const r = (`+elem+`).getBoundingClientRect(); return {Top: r.top, Bottom: r.bottom, Left: r.left, Right: r.right, Width: r.width, Height: r.height} })()`, &r)
	return r
}

// feedText is the feed as the human reads it.
func (b *browserTab) feedText() string {
	b.t.Helper()
	return b.evalString(panelJS("feed") + `.innerText`)
}

// connectModel connects mcp-go over /agent/mcp with the panel's connect line.
func connectModel(t *testing.T, tab *browserTab, srvURL string) (*mcpclient.Client, func(kv ...any) map[string]any) {
	t.Helper()
	line := tab.evalString(panelJS("connect-line") + `.value`)
	if !strings.HasPrefix(line, "Connect to my app with lapd: connect_session url="+srvURL) {
		t.Fatalf("connect line %q", line)
	}
	mc := browserMCPHTTP(t, srvURL)
	conn := browserOK(t, mc, "connect_session", map[string]any{"line": line})
	sess, _ := conn["session"].(string)
	tab.waitStatus("active", 10*time.Second)
	return mc, func(kv ...any) map[string]any {
		m := map[string]any{"session": sess}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
}

func TestBrowserKeyboard(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600", "--tools", "all") // describe_recent_actions
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.axe("idle")

	// The page loads without an error a browser-driving tool would report
	// (a missing favicon was one), and a fresh board is not "unsaved".
	if p := tab.pageProblems(); len(p) > 0 {
		t.Errorf("the page reported errors on load: %v", p)
	}
	if s := tab.evalString(`document.querySelector('#save-status').textContent`); strings.Contains(s, "Unsaved") {
		t.Errorf("a fresh board says %q", s)
	}

	// 1. The first Tab stop is the skip link; Enter lands on Connect.
	if n := tab.tabTo("skip", 1); n != 1 {
		t.Fatalf("skip link after %d Tabs", n)
	}
	tab.key(kb.Enter)
	if f := tab.focused(); f != "panel:connect" {
		t.Fatalf("after the skip link, focus is on %s (status %s), want the Connect button", f, tab.evalString(`window.__lapd.status`))
	}
	// 2. Enter connects; focus moves on to Copy (not to the page's body).
	tab.key(kb.Enter)
	tab.waitStatus("pending-claude", 10*time.Second)
	tab.waitJS(`document.activeElement.shadowRoot && document.activeElement.shadowRoot.activeElement && document.activeElement.shadowRoot.activeElement.dataset.testid === 'copy'`, 5*time.Second)
	title := tab.evalString(panelJS("status") + `.textContent`)
	if title != "Waiting for the AI" {
		t.Errorf("title %q", title)
	}
	// The title and the connect line are not cut: the line is one
	// scrollable line, and there is no Disconnect before an AI connected.
	var layout struct{ TitleCut, LineWraps, Disconnect, Cancel bool }
	tab.eval(`(() => { const r = `+browserPanel+`; const t = r.querySelector('[data-testid=status]'); const l = r.querySelector('[data-testid=connect-line]');
	  return {TitleCut: t.scrollWidth > t.clientWidth + 1, LineWraps: l.getBoundingClientRect().height > 48,
	    Disconnect: !!r.querySelector('[data-testid=disconnect]'), Cancel: !!r.querySelector('[data-testid=cancel]')} })()`, &layout)
	if layout.TitleCut || layout.LineWraps || layout.Disconnect || !layout.Cancel {
		t.Errorf("connect state layout: %+v (want the title whole, the line on one line, Cancel and no Disconnect)", layout)
	}
	tab.axe("waiting for the AI")

	// 3. Every Tab stop in the panel shows a focus ring. The live region is
	// marked, to check later that it is never rebuilt.
	checkTabStops(t, tab, "waiting for the AI")
	tab.eval(panelJS("announcer")+`.dataset.mark = 'first'`, nil)

	// 4. The model connects and acts; the feed says what happened in the
	// human's words, with relative times; JSON paths only under "Show details".
	mc, args := connectModel(t, tab, srv.URL)
	browserOK(t, mc, "observe", args())
	browserOK(t, mc, "narrate", args("text", "I will add your shopping first."))
	browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Buy milk"}))
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Add "Buy milk" to todo')`, 10*time.Second)
	// On a 1280 px desktop the open panel leaves the board's columns alone,
	// however tall they grow: the demo makes room with the panel host's
	// data-layout/data-state.
	if p, b := tab.rect(panelJS("panel")), tab.rect(`document.getElementById('board')`); p.Left < b.Right {
		t.Errorf("the open panel %+v covers the board %+v", p, b)
	}
	feed := tab.feedText()
	for _, want := range []string{"Done: Add \"Buy milk\" to todo", "AI: I will add your shopping first.", "Looked at the app", "just now"} {
		if !strings.Contains(feed, want) {
			t.Errorf("feed lacks %q:\n%s", want, feed)
		}
	}
	for _, bad := range []string{"/tasks", "/nextId", "changes:", "Add a task to a column"} {
		if strings.Contains(feed, bad) {
			t.Errorf("feed shows %q to the human:\n%s", bad, feed)
		}
	}
	if a := tab.evalString(panelJS("announcer") + `.textContent`); !strings.Contains(a, `Add "Buy milk" to todo`) {
		t.Errorf("the live region did not announce the dispatch: %q", a)
	}
	tab.click(panelJS("feed-details"))
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('/tasks/3 added')`, 5*time.Second)
	tab.click(panelJS("feed-details"))

	// The server refuses a human-only action before it reaches the tab; the
	// feed shows it, and so does describe_recent_actions {kind:"blocked"}.
	// A refusal is an answer (isError false) with a status and a reason.
	r := browserCall(t, mc, "send_message", args("msg", map[string]any{"type": "resetDemo"}))
	if r.IsError || r.SC["status"] != "rejected" || r.SC["reason"] != "human-only" {
		t.Fatalf("resetDemo: %v %s", r.IsError, r.Text)
	}
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Blocked: Reset the demo board')`, 10*time.Second)
	recent := browserOK(t, mc, "describe_recent_actions", args("kind", "blocked"))
	if !strings.Contains(browserJSON(recent), `resetDemo`) {
		t.Errorf("describe_recent_actions blocked: %s", browserJSON(recent))
	}

	// 5. An approval: the human is typing in the page; Alt+Shift+A takes
	// them to Approve, Enter approves, focus stays in the panel, Escape
	// goes back to the input.
	pend := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "reason", "you asked for a clean board", "approvalTimeoutMs", 0))
	cid, _ := pend["confirmId"].(string)
	tab.waitJS(`!!`+panelJS("approve-"+cid), 10*time.Second)
	card := tab.evalString(panelJS("card-"+cid) + `.innerText`)
	if !strings.Contains(card, "Delete every task (4 tasks)") || !strings.Contains(card, "Why: you asked for a clean board") {
		t.Errorf("approval card: %q", card)
	}
	tab.waitJS(`(`+panelJS("announcer")+`).textContent.includes('Approval needed: Delete every task (4 tasks)')`, 5*time.Second)
	// The card covers the right of the board; the page can scroll every
	// column above it.
	tab.eval(`window.scrollTo(0, document.documentElement.scrollHeight)`, nil)
	if p, col := tab.rect(browserPanel+`.querySelector('.p')`), tab.rect(`[...document.querySelectorAll('#board section.column')].at(-1)`); col.Bottom > p.Top+0.5 {
		t.Errorf("with an approval waiting, the last column (bottom %v) stays under the panel (top %v) when scrolled to the end", col.Bottom, p.Top)
	}
	tab.eval(`window.scrollTo(0, 0)`, nil)
	tab.eval(`document.querySelector('#new-title').focus()`, nil)
	tab.key("a", chromedp.ModifierAlt, chromedp.ModifierShift)
	if f := tab.focused(); f != "panel:approve-"+cid {
		t.Fatalf("Alt+Shift+A moved focus to %s, want Approve", f)
	}
	if v := tab.evalString(`document.querySelector('#new-title').value`); v != "" {
		t.Errorf("the shortcut typed %q into the page", v)
	}
	tab.key(kb.Enter)
	got := browserOK(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if got["status"] != "confirmed" {
		t.Fatalf("get_confirm_result: %s", browserJSON(got))
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	tab.waitJS(`!`+panelJS("approve-"+cid), 5*time.Second)
	if f := tab.focused(); !strings.HasPrefix(f, "panel:") {
		t.Errorf("after Approve focus went to %s, want it kept in the panel", f)
	}
	// The proposal's line is updated in place.
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Approved by you: Delete every task (4 tasks)')`, 5*time.Second)
	feed = tab.feedText()
	if strings.Contains(feed, "Waiting for your approval") || strings.Count(feed, "Delete every task") != 1 {
		t.Errorf("the approval's feed line was not updated in place:\n%s", feed)
	}
	tab.key(kb.Escape)
	if f := tab.focused(); f != "page:input#new-title" {
		t.Errorf("Escape went to %s, want back to the input", f)
	}

	// 6. Rejecting by keyboard: shortcut, Tab to Reject, Enter.
	browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Keep me"}))
	pend = browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "approvalTimeoutMs", 0))
	cid2, _ := pend["confirmId"].(string)
	tab.waitJS(`!!`+panelJS("approve-"+cid2), 10*time.Second)
	tab.key("a", chromedp.ModifierAlt, chromedp.ModifierShift)
	tab.tabTo("panel:reject-"+cid2, 1)
	tab.key(kb.Enter)
	r = browserCall(t, mc, "get_confirm_result", args("confirmId", cid2, "timeoutMs", 10000))
	if r.IsError || r.SC["status"] != "rejected" || r.SC["reason"] != "user-cancelled" {
		t.Fatalf("after Reject: %v %s", r.IsError, r.Text)
	}
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Rejected by you: Delete every task (1 task)')`, 5*time.Second)
	if f := tab.focused(); !strings.HasPrefix(f, "panel:") {
		t.Errorf("after Reject focus went to %s", f)
	}
	checkTabStops(t, tab, "after approvals")
	if m := tab.evalString(panelJS("announcer") + `.dataset.mark || ''`); m != "first" {
		t.Error("the live region was rebuilt: announcements made meanwhile may not have been read")
	}
	tab.axe("after approvals, with a feed")
	if p := tab.pageProblems(); len(p) > 0 {
		t.Errorf("the page reported errors: %v", p)
	}
}

// checkTabStops Tabs through the panel from its bar and fails on a stop
// without a visible focus ring.
func checkTabStops(t *testing.T, tab *browserTab, when string) {
	t.Helper()
	tab.eval(browserTestID("toggle")+`.focus()`, nil)
	var stops []string
	for i := 0; i < 20; i++ {
		f := tab.focused()
		if !strings.HasPrefix(f, "panel:") {
			break
		}
		var ring string
		tab.eval(`(() => { const e = `+browserPanel+`.activeElement; const s = getComputedStyle(e); return s.outlineStyle + ' ' + s.outlineWidth })()`, &ring)
		if strings.HasPrefix(ring, "none") || strings.HasSuffix(ring, " 0px") {
			t.Errorf("%s: Tab stop %s has no focus ring (%s)", when, f, ring)
		}
		stops = append(stops, f)
		tab.key(kb.Tab)
	}
	t.Logf("panel Tab stops %s: %v", when, stops)
}

func TestBrowserPhone(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	tab := browserOpenSize(t, srv.URL+"/", browserPhoneW, browserPhoneH)
	tab.waitStatus("idle", 10*time.Second)
	const vh = float64(browserPhoneH)

	// 1. Collapsed to one line at the bottom, full width; the page keeps
	// room to scroll its end above it.
	bar := tab.rect(browserPanel + `.querySelector('.p')`)
	if bar.Height > 64 || bar.Width != float64(browserPhoneW) || bar.Bottom != vh {
		t.Fatalf("collapsed sheet %+v, want one line (≤ 64 px) across the bottom", bar)
	}
	tab.axe("phone, collapsed")
	checkEndVisible := func(when string) {
		t.Helper()
		tab.eval(`window.scrollTo(0, document.documentElement.scrollHeight)`, nil)
		sheet := tab.rect(browserPanel + `.querySelector('.p')`)
		last := tab.rect(`[...document.querySelectorAll('#board section.column')].at(-1)`)
		if last.Bottom > sheet.Top+0.5 {
			t.Errorf("%s: the end of the board (bottom %v) stays under the sheet (top %v) when scrolled to the end", when, last.Bottom, sheet.Top)
		}
	}
	checkEndVisible("collapsed")
	targets := func(when string) {
		t.Helper()
		var small []string
		tab.eval(`[...`+browserPanel+`.querySelectorAll('button, input, summary')].filter((e) => e.offsetParent !== null)
		  .map((e) => { const r = e.getBoundingClientRect(); return (r.width < 44 || r.height < 44) && e.tagName !== 'INPUT' ? (e.dataset.testid || e.textContent) + ' ' + Math.round(r.width) + 'x' + Math.round(r.height) : '' }).filter(Boolean)`, &small)
		if len(small) > 0 {
			t.Errorf("%s: targets under 44×44 px: %v", when, small)
		}
	}
	targets("collapsed")
	// The demo's own controls are phone targets too: buttons, selects and
	// each task's checkbox (through its label).
	var small []string
	tab.eval(`[...document.querySelectorAll('.toolbar button, #new-title, #board select, #board label.check')].map((e) => {
	  const r = e.getBoundingClientRect(); return r.width < 44 || r.height < 44 ? (e.id || e.className || e.tagName) + ' ' + Math.round(r.width) + 'x' + Math.round(r.height) : '' }).filter(Boolean)`, &small)
	if len(small) > 0 {
		t.Errorf("demo controls under 44×44 px on a phone: %v", small)
	}
	if n := tab.evalString(`String(document.querySelectorAll('#board label.check input[type=checkbox]').length)`); n != "3" {
		t.Errorf("%s task checkboxes inside their tap-target labels, want 3", n)
	}

	// 2. Open it, connect.
	tab.click(panelJS("toggle"))
	tab.waitJS(`!!`+panelJS("connect")+` && `+panelJS("connect")+`.offsetParent !== null`, 5*time.Second)
	targets("open, idle")
	tab.click(panelJS("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	if h := tab.rect(panelJS("connect-line")).Height; h > 48 {
		t.Errorf("the connect line is %v px high: it wraps", h)
	}
	targets("waiting for the AI")
	tab.axe("phone, waiting for the AI")
	tab.shot("connect-line-390")

	// 3. Folded while the line waits to be pasted, the bar says there is
	// something to do in it, in one line.
	tab.click(panelJS("toggle"))
	if s := tab.evalString(panelJS("status") + `.textContent`); s != "Waiting for the AI · copy the line" {
		t.Errorf("the folded bar waiting for the paste says %q", s)
	}
	var cut bool
	tab.eval(`(() => { const e = `+panelJS("status")+`; return e.scrollWidth > e.clientWidth + 1 })()`, &cut)
	if cut {
		t.Error("the folded bar's text is cut at 390 px")
	}

	// 4. The model fills the board to 6 tasks and asks to clear it. The
	// collapsed sheet says so in one line with a badge, and hides nothing.
	mc, args := connectModel(t, tab, srv.URL)
	for _, title := range []string{"Buy milk", "Call the plumber", "Book the dentist"} {
		browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": title}))
	}
	browserOK(t, mc, "narrate", args("text", "The board is full; I will ask to clear it."))
	pend := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "reason", "you asked for a fresh start", "approvalTimeoutMs", 0))
	cid, _ := pend["confirmId"].(string)
	tab.waitJS(`!`+panelJS("badge")+`.hidden`, 10*time.Second)
	if s := tab.evalString(panelJS("status") + `.textContent`); s != "Approve? Delete every task (6 tasks)" {
		t.Errorf("collapsed title %q", s)
	}
	if b := tab.evalString(panelJS("badge") + `.textContent`); !strings.HasPrefix(b, "1") {
		t.Errorf("badge %q", b)
	}
	if h := tab.rect(browserPanel + `.querySelector('.p')`).Height; h > 64 {
		t.Errorf("an approval grew the collapsed sheet to %v px", h)
	}
	checkEndVisible("collapsed, approval pending")
	tab.eval(`window.scrollTo(0, 0)`, nil)
	tab.shot("pending-approval-390")

	// 5. Opened, the sheet takes at most half the screen; the card, with
	// 44 px buttons, says what will happen; the page can still bring every
	// task above the sheet.
	tab.click(panelJS("toggle"))
	tab.waitJS(panelJS("approve-"+cid)+`.offsetParent !== null`, 5*time.Second)
	if h := tab.rect(browserPanel + `.querySelector('.p')`).Height; h > vh/2+1 {
		t.Errorf("the open sheet is %v px high, more than half of %v", h, vh)
	}
	card := tab.evalString(panelJS("card-"+cid) + `.innerText`)
	if !strings.Contains(card, "Delete every task (6 tasks)") {
		t.Errorf("card %q", card)
	}
	targets("approval open")
	tab.axe("phone, approval open")
	checkEndVisible("open, approval pending")
	tab.eval(`window.scrollTo(0, 0)`, nil)
	tab.shot("pending-approval-open-390")

	tab.click(panelJS("approve-" + cid))
	got := browserOK(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if got["status"] != "confirmed" {
		t.Fatalf("get_confirm_result: %s", browserJSON(got))
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Plan the week", "column": "doing"}))
	browserOK(t, mc, "narrate", args("text", "Cleared the board after your approval and added one task."))
	tab.waitJS(`(`+panelJS("feed")+`).innerText.includes('Cleared the board')`, 10*time.Second)
	feed := tab.feedText()
	for _, want := range []string{"Approved by you: Delete every task (6 tasks)", `Done: Add "Plan the week" to doing`} {
		if !strings.Contains(feed, want) {
			t.Errorf("feed lacks %q:\n%s", want, feed)
		}
	}
	tab.axe("phone, feed")
	tab.eval(`window.scrollTo(0, 0)`, nil)
	tab.shot("feed-390")
	if p := tab.pageProblems(); len(p) > 0 {
		t.Errorf("the page reported errors: %v", p)
	}
}
