package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	mcpclient "github.com/mark3labs/mcp-go/client"
)

// TestBrowserChain is the whole chain, once per MCP transport: a real
// headless Chromium runs the demo Taskboard with lapd.js against a real
// `lapd serve`; mcp-go's client plays the model over /agent/mcp (http) or
// through `lapd mcp` (stdio).
//
//	go test ./e2e -run TestBrowserChain -v
func TestBrowserChain(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	for _, transport := range []string{"http", "stdio"} {
		t.Run(transport, func(t *testing.T) { browserChain(t, transport) })
	}
}

func browserChain(t *testing.T, transport string) {
	dataDir := t.TempDir()
	addr := browserFreeAddr(t)
	// A fixed port and data dir, so a second server can take over the tab.
	srv := startServer(t, dataDir, "--addr", addr, "--lap-rate", "600", "--grace", "60s")
	tab := browserOpen(t, srv.URL+"/")
	screenshots := transport == "http" // one set is enough

	// 1. The human clicks "Connect an AI"; the panel shows the connect line.
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)
	prefix := "Connect to my app with lapd: connect_session url=" + srv.URL + "/agent/lap/v1 token=agt_"
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("connect line %q, want prefix %q", line, prefix)
	}
	if screenshots {
		tab.shot("connect-line")
	}

	// 2. The model connects with the line and observes.
	var mc *mcpclient.Client
	if transport == "http" {
		mc = browserMCPHTTP(t, srv.URL)
	} else {
		mc = browserMCPStdio(t)
	}
	conn := browserOK(t, mc, "connect_session", map[string]any{"line": line})
	sess, _ := conn["session"].(string)
	if !strings.HasPrefix(sess, "s_") {
		t.Fatalf("connect_session: no session handle: %v", conn)
	}
	tab.waitStatus("active", 10*time.Second)
	args := func(kv ...any) map[string]any {
		m := map[string]any{"session": sess}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	obs := browserOK(t, mc, "observe", args())
	state, _ := obs["state"].(map[string]any)
	if tasks, _ := state["tasks"].([]any); len(tasks) != 3 {
		t.Fatalf("observe: want the 3 demo tasks, got %s", browserJSON(obs["state"]))
	}
	if !strings.Contains(browserJSON(obs["actions"]), `"addTask"`) || strings.Contains(browserJSON(obs["actions"]), `"resetDemo"`) {
		t.Fatalf("observe actions: %s", browserJSON(obs["actions"]))
	}

	// 3. narrate shows in the panel feed.
	narration := "Adding a task for the " + transport + " test"
	browserOK(t, mc, "narrate", args("text", narration))
	tab.waitJS(browserTestID("feed")+`.textContent.includes(`+browserJSON(narration)+`)`, 10*time.Second)

	// 4. send_message adds a task: the page shows it, the diff says so.
	title := "E2E task via " + transport
	sent := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": title}))
	if sent["status"] != "dispatched" || !browserHasDiff(sent["stateDiff"], "/tasks/3", title) {
		t.Fatalf("send_message addTask: %s", browserJSON(sent))
	}
	var shown bool
	tab.eval(`[...document.querySelectorAll('#board li.task .title')].some((e) => e.textContent === `+browserJSON(title)+`)`, &shown)
	if !shown {
		t.Fatalf("the page does not show %q after send_message returned", title)
	}

	// 5. Human-only is refused (an answer, not a failure), and the page
	// keeps its tasks.
	r := browserCall(t, mc, "send_message", args("msg", map[string]any{"type": "resetDemo"}))
	if r.IsError || r.SC["status"] != "rejected" || r.SC["reason"] != "human-only" || !strings.Contains(r.Text, "ask them") {
		t.Fatalf("resetDemo: want rejected human-only with advice, got %v %s", r.IsError, r.Text)
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 4`, 5*time.Second)

	// 6. wait_for_change returns when the human ticks a checkbox. The watch
	// is registered asynchronously, so the test keeps toggling (each toggle
	// is a change) until the call returns.
	wres := waitWhileTicking(t, tab, mc, args("path", "/tasks", "timeoutMs", 15000))
	if wres.IsError || wres.SC["status"] != "changed" || !strings.Contains(browserJSON(wres.SC["value"]), `"done"`) || wres.SC["stateAfter"] != nil {
		t.Fatalf("wait_for_change: %v %s", wres.IsError, wres.Text)
	}
	// 7. Confirmation, rejected in the panel. approvalTimeoutMs 0: return
	// pending-confirmation at once, then wait with get_confirm_result.
	pend := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "reason", "the test asks for it", "approvalTimeoutMs", 0))
	cid, _ := pend["confirmId"].(string)
	if pend["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("clearAll: %s", browserJSON(pend))
	}
	tab.waitJS(`!!`+browserTestID("reject-"+cid), 10*time.Second)
	// lapd sends the recorded approval back with its deadline (confirm-sync)
	// and lapd.js takes it, so the card says when it lapses on the first
	// proposal, not only after a reload.
	tab.waitJS(browserPanel+`.textContent.includes('If you do not answer, it is rejected')`, 10*time.Second)
	if screenshots {
		tab.shot("pending-approval")
	}
	tab.click(browserTestID("reject-" + cid))
	r = browserCall(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if r.IsError || r.SC["status"] != "rejected" || r.SC["reason"] != "user-cancelled" {
		t.Fatalf("get_confirm_result after reject: want rejected user-cancelled, got %v %s", r.IsError, r.Text)
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 4`, 5*time.Second)

	// 8. Confirmation, approved in the panel: the board is cleared.
	pend = browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "approvalTimeoutMs", 0))
	cid, _ = pend["confirmId"].(string)
	if pend["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("clearAll again: %s", browserJSON(pend))
	}
	tab.waitJS(`!!`+browserTestID("approve-"+cid), 10*time.Second)
	tab.click(browserTestID("approve-" + cid))
	got := browserOK(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if got["status"] != "confirmed" {
		t.Fatalf("get_confirm_result after approve: %s", browserJSON(got))
	}
	if after, _ := got["stateAfter"].(map[string]any); after != nil {
		if tasks, _ := after["tasks"].([]any); len(tasks) != 0 {
			t.Fatalf("stateAfter of clearAll: %s", browserJSON(after))
		}
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Write the report", "column": "doing"}))
	browserOK(t, mc, "narrate", args("text", "Cleared the board after your approval and added one task."))
	tab.waitJS(browserTestID("feed")+`.textContent.includes('Cleared the board')`, 10*time.Second)
	if screenshots {
		tab.shot("feed")
	}

	// wait_for_change without a path, on a board over 1 KiB (the model
	// adds 15 tasks in one batch): what changed since the model's last look
	// (the human adds tasks through the page's form), not the board.
	var many []any
	for i := range 15 {
		many = append(many, map[string]any{"type": "addTask", "title": fmt.Sprintf("Batch task %d with a title long enough to count", i+1)})
	}
	browserOK(t, mc, "send_message", args("msgs", many))
	n := 0
	wres = waitWhileHuman(t, tab, mc, args("timeoutMs", 15000), func() {
		n++
		tab.eval(fmt.Sprintf(`(() => { const i = document.querySelector('#new-title'); i.value = 'Human task %d'; i.form.requestSubmit(); return true })()`, n), nil)
	})
	if wres.IsError || wres.SC["status"] != "changed" || wres.SC["stateAfter"] != nil || !strings.Contains(browserJSON(wres.SC["stateDiff"]), `"Human task `) {
		t.Fatalf("wait_for_change without path: %v %s", wres.IsError, wres.Text)
	}

	// 9. Reload: the session is restored from sessionStorage (no new mint,
	// same connect line) and the model's session keeps working.
	browserRun(t, tab.ctx, 20*time.Second, chromedp.Reload())
	tab.waitJS(`!!window.__lapd && !!`+browserPanel, 10*time.Second)
	tab.waitStatus("active", 15*time.Second)
	if got := tab.evalString(`window.__lapd.connectLine`); got != line {
		t.Fatalf("connect line after reload %q, want the same %q", got, line)
	}
	if n := browserCount(srv.auditEvents(), "mint"); n != 1 {
		t.Fatalf("%d mints after a reload, want 1 (events %v)", n, srv.auditEvents())
	}
	// The demo keeps its board in memory, so the reloaded page starts from
	// the 3 demo tasks again; the model sees the new page through the same session.
	obs = browserOK(t, mc, "observe", args())
	if tasks, _ := obs["state"].(map[string]any)["tasks"].([]any); len(tasks) != 3 {
		t.Fatalf("observe after reload: want the reloaded page's 3 tasks, got %s", browserJSON(obs["state"]))
	}

	// 10. Server restart: SIGINT (graceful; tabs get 1012), then a new
	// server on the same port and data dir. The tab re-pairs by itself with
	// the same token inside the grace window.
	srv.stop(t)
	tab.waitJS(`window.__lapd.status === 'reconnecting'`, 10*time.Second)
	// The panel says what is going on and what the human can do.
	tab.waitJS(`!!`+browserTestID("retry")+` && `+browserTestID("reconnecting")+`.textContent.includes('keeps trying by itself')`, 5*time.Second)
	restart := time.Now()
	srv2 := startServer(t, dataDir, "--addr", addr, "--lap-rate", "600", "--grace", "60s")
	if srv2.URL != srv.URL {
		t.Fatalf("restarted on %s, want %s", srv2.URL, srv.URL)
	}
	// Try now: an attempt at once, instead of waiting out the backoff (the
	// tab may have re-paired by itself already).
	tab.eval(`(() => { const b = `+browserTestID("retry")+`; if (b) b.click(); return true })()`, nil)
	tab.waitStatus("active", 40*time.Second)
	t.Logf("%s: tab re-paired %v after the new server listened", transport, time.Since(restart).Round(time.Millisecond))
	tab.waitJS(`!`+browserTestID("retry"), 5*time.Second)
	if got := tab.evalString(`window.__lapd.connectLine`); got != line {
		t.Fatalf("the tab changed token across the restart: %q", got)
	}
	if transport == "http" {
		// The MCP session died with the old process: reconnect the client
		// and connect again with the same line.
		mc = browserMCPHTTP(t, srv2.URL)
		conn = browserOK(t, mc, "connect_session", map[string]any{"line": line})
		sess, _ = conn["session"].(string)
	}
	// Over stdio the bridge keeps its binding and simply calls again.
	sent = browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "After the restart"}))
	if !browserHasDiff(sent["stateDiff"], "/tasks/3", "After the restart") {
		t.Fatalf("send_message after restart: %s", browserJSON(sent))
	}
	tab.waitJS(`[...document.querySelectorAll('#board li.task .title')].some((e) => e.textContent === 'After the restart')`, 5*time.Second)

	// 11. Revoke: the model gets a clear isError, the panel says so.
	if transport == "http" {
		tab.click(browserTestID("disconnect")) // the human's Disconnect button
		tab.waitStatus("idle", 10*time.Second)
	} else {
		tid := tab.evalString(`window.__lapd.session.tid`)
		// An anonymous session is revoked with the tab's own secret (the
		// page's app code holds it; the LLM never does).
		secret := tab.evalString(`JSON.parse(sessionStorage.getItem('lapd:session')).tabSecret`)
		var out map[string]any
		if st := srv2.postJSON(t, "/agent/revoke", "", map[string]any{"tid": tid}, &out); st != 404 {
			t.Fatalf("revoke by tid alone: %d %v", st, out)
		}
		if st := srv2.postJSON(t, "/agent/revoke", "", map[string]any{"tid": tid, "tabSecret": secret}, &out); st != 200 {
			t.Fatalf("POST /agent/revoke: %d %v", st, out)
		}
		tab.waitStatus("idle", 10*time.Second)
		tab.waitJS(browserPanel+`.textContent.includes('The session was revoked')`, 5*time.Second)
	}
	tab.waitJS(`!!`+browserTestID("connect")+` && sessionStorage.getItem('lapd:session') === null`, 5*time.Second)
	if status := tab.evalString(browserTestID("status") + `.textContent`); status != "Not connected" {
		t.Fatalf("panel status after revoke: %q", status)
	}
	// The panel's Disconnect sends its revoke without waiting for it (and
	// the audit is written asynchronously): wait until the server has it.
	mcpEventually(t, "the revoke to reach the server", func() bool { return browserCount(srv2.auditEvents(), "revoke") == 1 })
	r = browserCall(t, mc, "observe", args())
	if c := r.code(); !r.IsError || (c != "revoked" && c != "auth-failed") || !strings.Contains(r.Text, "connect_session") {
		t.Fatalf("observe after revoke: want isError revoked/auth-failed saying what to do, got %v %q (code %q)", r.IsError, r.Text, c)
	}
	t.Logf("%s: after revoke the model reads: %s", transport, r.Text)
	if n := browserCount(srv2.auditEvents(), "revoke"); n != 1 {
		t.Errorf("audit: %d revoke entries, want 1", n)
	}
}
