package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The admin console as an operator uses it: the real binary with
// --admin-addr and --admin-token, the demo Taskboard paired in one headless
// Chromium with a model connected over /agent/mcp, the console in another.
// The operator is refused with a wrong token, logs in, sees the tab and its
// calls, revokes it (the tab's panel says so), filters the audit trail and
// reads /metrics; the console is also checked at phone width.
//
//	go test ./e2e -run TestAdminConsole -v
//	LAPD_SCREENSHOTS=1 go test ./e2e -run TestAdminConsole   # rewrite docs/screenshots/admin-*.png

var adminRE = regexp.MustCompile(`admin listening on (http://[0-9.:]+)`)

// adminURL waits for the "admin listening on" log line.
func (s *server) adminURL(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := adminRE.FindStringSubmatch(s.stderr.String()); m != nil {
			return m[1]
		}
		select {
		case <-s.done:
			t.Fatalf("lapd exited:\n%s", s.stderr.String())
		case <-time.After(20 * time.Millisecond): // polling a log, not synchronising
		}
	}
	t.Fatalf("no admin listener in the log:\n%s", s.stderr.String())
	return ""
}

// adminOpen opens url in a fresh headless Chromium at w×h (no lapd.js on
// the page to wait for).
func adminOpen(t *testing.T, url string, w, h int64) *browserTab {
	t.Helper()
	needTool(t, "chromium", browserChromium)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(browserChromium), chromedp.UserDataDir(t.TempDir()), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-background-timer-throttling", true), chromedp.Flag("disable-renderer-backgrounding", true))
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	b := &browserTab{t: t, ctx: ctx}
	if w < 600 {
		browserRun(t, ctx, 10*time.Second, chromedp.EmulateViewport(w, h, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulatePortrait))
	} else {
		browserRun(t, ctx, 10*time.Second, chromedp.EmulateViewport(w, h))
	}
	browserRun(t, ctx, 20*time.Second, chromedp.Navigate(url))
	b.waitJS(`!!window.__lapdAdmin`, 10*time.Second)
	return b
}

// q selects an element of the console by data-testid.
func q(id string) string { return `document.querySelector('[data-testid="` + id + `"]')` }

// adminLogin types token into the log-in form and submits it.
func (b *browserTab) adminLogin(token string) {
	b.t.Helper()
	b.waitJS(`!`+q("login")+`.hidden`, 10*time.Second)
	b.eval(q("token")+`.value = ''`, nil)
	b.steps(chromedp.SendKeys(`[data-testid="token"]`, token),
		chromedp.Click(`[data-testid="login-submit"]`))
}

func httpGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestAdminConsole(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	const token = "e2e-admin-token-0123456789abcdef"
	srv := startServer(t, "", "--lap-rate", "600", "--admin-addr", "127.0.0.1:0", "--admin-token", token)
	admin := srv.adminURL(t)
	if strings.Contains(srv.stderr.String(), token) {
		t.Fatal("the admin token is in the log")
	}

	// Never on the public address.
	for _, p := range []string{"/metrics", "/admin/", "/admin/api/sessions", "/debug/pprof/"} {
		if st, _ := httpGet(t, srv.URL+p, token); st != 404 {
			t.Errorf("public %s: %d, want 404", p, st)
		}
	}

	// 1. The demo tab pairs and a model connects and observes.
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	mc, args := connectModel(t, tab, srv.URL)
	browserOK(t, mc, "observe", args())
	browserOK(t, mc, "narrate", args("text", "Looking around."))
	tid := tab.evalString(`window.__lapd.session.tid`)

	// 2. A wrong token is refused; the right one opens the console.
	con := adminOpen(t, admin+"/admin/", browserDesktopW, browserDesktopH)
	con.adminLogin("not-the-admin-token-at-all")
	con.waitJS(q("login-error")+`.textContent.includes('refused')`, 10*time.Second)
	if !con.evalBool(q("console") + `.hidden`) {
		t.Fatal("the console opened with a wrong token")
	}
	// Hidden means not shown: the empty console is not laid out under the
	// log-in form (its own display once overrode the hidden attribute).
	if con.evalBool(q("console") + `.getClientRects().length > 0`) {
		t.Error("the console's empty tiles and tables show under the log-in form")
	}
	con.adminLogin(token)
	con.waitJS(`!`+q("console")+`.hidden`, 10*time.Second)

	// 3. The paired demo tab is listed with its app, state and calls.
	row := `document.querySelector('[data-testid="session"][data-tid="` + tid + `"]')`
	con.waitJS(row+` && `+row+`.textContent.includes('taskboard') && `+row+`.textContent.includes('AI connected')`, 15*time.Second)
	text := con.evalString(row + `.innerText`)
	if !strings.Contains(text, "connected") || !strings.Contains(text, "anonymous") {
		t.Errorf("session row: %q", text)
	}
	con.waitJS(`Number(`+q("tile-tabs")+`.textContent) === 1`, 10*time.Second)
	// The model keeps working; the live chart shows its calls.
	deadline := time.Now().Add(30 * time.Second)
	for con.evalString(`String(Number(`+q("tile-calls")+`.textContent) > 0)`) != "true" {
		if time.Now().After(deadline) {
			t.Fatalf("calls/s stayed %q", con.evalString(q("tile-calls")+`.textContent`))
		}
		browserOK(t, mc, "observe", args())
	}
	for con.evalString(`String(window.__lapdAdmin.rates.filter((r) => r.calls > 0).length >= 4)`) != "true" {
		if time.Now().After(deadline) { // a few points on the chart for the screenshot
			t.Fatalf("the chart has %s", con.evalString(`JSON.stringify(window.__lapdAdmin.rates)`))
		}
		browserOK(t, mc, "observe", args())
	}
	con.shot("admin-console")
	con.axe("admin console")

	// On a phone: tiles two by two, sessions and audit as cards, nothing
	// wider than the screen.
	phone := adminOpen(t, admin+"/admin/", browserPhoneW, browserPhoneH)
	phone.adminLogin(token)
	phone.waitJS(`!`+q("console")+`.hidden && !!document.querySelector('[data-testid="session"] td') && document.querySelectorAll('[data-testid="audit-entry"]').length > 0`, 10*time.Second)
	var layout struct {
		Overflow  []string
		CardCells bool
	}
	phone.eval(`(() => ({ Overflow: [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1).map((e) => e.tagName + '.' + e.className + '[' + (e.dataset.testid || '') + ']').slice(0, 5),
	  CardCells: getComputedStyle(document.querySelector('[data-testid="session"] td')).display !== 'table-cell' }))()`, &layout)
	if len(layout.Overflow) > 0 || !layout.CardCells {
		t.Errorf("phone layout: %+v (want nothing past the right edge, table rows as cards)", layout)
	}
	if h := phone.rect(q("logout")).Height; h < 44 {
		t.Errorf("Log out is %v px high on a phone, want a 44 px target", h)
	}
	phone.shot("admin-console-390")
	phone.axe("admin console at 390 px")

	// 4. Revoke from the console (two clicks); the tab's panel says so and
	// the model is refused.
	btn := row + `.querySelector('[data-testid="revoke"]')`
	con.click(btn)
	con.waitJS(btn+`.textContent === 'Confirm revoke'`, 5*time.Second)
	con.click(btn)
	tab.waitJS(browserPanel+`.textContent.includes('The session was revoked')`, 10*time.Second)
	tab.waitStatus("idle", 10*time.Second)
	r := browserCall(t, mc, "observe", args())
	if !r.IsError {
		t.Errorf("observe after the console's revoke: %q", r.Text)
	}
	con.waitJS(q("toast")+`.textContent.includes('Revoked')`, 5*time.Second)

	// 5. Filter the audit trail: this session's entries, then only the
	// admin's own, which names the revoke.
	con.steps(chromedp.SendKeys(`[data-testid="filter-tid"]`, tid),
		chromedp.Click(`[data-testid="filter-apply"]`))
	con.waitJS(`[...document.querySelectorAll('[data-testid="audit-entry"]')].some((r) => r.dataset.event === 'revoke')`, 10*time.Second)
	var evs []string
	con.eval(`[...document.querySelectorAll('[data-testid="audit-entry"]')].map((r) => r.dataset.event)`, &evs)
	for _, want := range []string{"lap-call", "revoke", "admin", "disconnect"} {
		if !browserContains(evs, want) {
			t.Errorf("audit for %s lacks %s: %v", tid, want, evs)
		}
	}
	con.eval(q("filter-event")+`.value = 'admin'`, nil)
	con.steps(chromedp.Click(`[data-testid="filter-apply"]`))
	con.waitJS(`(() => { const r = [...document.querySelectorAll('[data-testid="audit-entry"]')]; return r.length === 1 && r[0].dataset.event === 'admin' && r[0].textContent.includes('action=revoke') })()`, 10*time.Second)
	con.shot("admin-audit")
	if p := con.pageProblems(); len(p) > 1 { // the wrong token's 401 is the one expected
		t.Errorf("the console reported errors: %v", p)
	}

	// 6. /metrics on the admin listener: the token is required, the calls
	// and the refusal are counted, nothing names the tid.
	if st, _ := httpGet(t, admin+"/metrics", ""); st != 401 {
		t.Errorf("/metrics without the token: %d", st)
	}
	// The counters fed by the audit stream follow its asynchronous writer
	// (a batch lingers up to 25 ms): scrape until they caught up.
	wants := []string{`lapd_requests_total{api="lap",code="200",route="/observe"}`, `lapd_refusals_total{reason="bad-token",surface="admin"} 2`,
		`lapd_admin_actions_total{action="revoke"} 1`, `lapd_audit_events_total{event="revoke"} 1`}
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var st int
		st, body = httpGet(t, admin+"/metrics", token)
		if st != 200 {
			t.Fatalf("/metrics: %d", st)
		}
		missing := false
		for _, want := range wants {
			missing = missing || !strings.Contains(body, want)
		}
		if !missing || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s; it has:\n%s", want, grepLines(body, strings.SplitN(want, "{", 2)[0]))
		}
	}
	if strings.Contains(body, tid) {
		t.Error("/metrics names a tid")
	}
	if st, _ := httpGet(t, admin+"/debug/pprof/cmdline", token); st != 200 {
		t.Errorf("pprof: %d", st)
	}
	if st, body := httpGet(t, admin+"/readyz", ""); st != 200 || !strings.Contains(body, `"status":"ready"`) {
		t.Errorf("readyz: %d %s", st, body)
	}

	// 7. lapd goes away: the console says so instead of showing its last
	// figures as if they were live.
	srv.stop(t)
	con.waitJS(q("meta")+`.textContent.includes('not answering') && `+q("meta")+`.classList.contains('down')`, 15*time.Second)
	con.waitJS(q("toast")+`.textContent.includes('not answering')`, 5*time.Second)

}

// Off by default: no admin listener, no admin routes; an admin address
// beyond loopback without a token, or on the public address, is refused.
func TestAdminListenerOffByDefault(t *testing.T) {
	srv := startServer(t, "")
	for _, p := range []string{"/metrics", "/admin/", "/debug/pprof/"} {
		if st, _ := httpGet(t, srv.URL+p, ""); st != 404 {
			t.Errorf("%s without --admin-addr: %d, want 404", p, st)
		}
	}
	if adminRE.MatchString(srv.stderr.String()) {
		t.Error("an admin listener started without --admin-addr")
	}
	for _, args := range [][]string{
		{"--admin-addr", "0.0.0.0:0"},
		{"--addr", "127.0.0.1:18999", "--admin-addr", "127.0.0.1:18999"},
		{"--admin-token", "0123456789abcdef0"},
	} {
		out, err := runCmd(t, append([]string{"serve", "--store", "memory"}, args...)...)
		if err == nil || !strings.Contains(out, "admin") {
			t.Errorf("lapd serve %v: err %v, output %q", args, err, out)
		}
	}
}

func (b *browserTab) evalBool(js string) bool {
	b.t.Helper()
	var v bool
	b.eval(js, &v)
	return v
}

func browserContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runCmd runs the lapd binary with args (bounded to 20 s) and returns its
// combined output.
func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lapdBin, args...)
	cmd.Env = append(os.Environ(), "LAPD_ADDR=", "LAPD_DATA_DIR=", "LAPD_ADMIN_ADDR=", "LAPD_ADMIN_TOKEN=")
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// steps runs chromedp actions in order, each within 10 s.
func (b *browserTab) steps(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	for _, a := range actions {
		browserRun(b.t, b.ctx, 10*time.Second, a)
	}
}

// grepLines returns the lines of s that begin with prefix.
func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
