package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	mcpclient "github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// The browser suite drives the demo Taskboard (served by `lapd serve` at /)
// in a real headless Chromium, and the model side through mcp-go's real
// client, over /agent/mcp and over `lapd mcp` (stdio). Helpers here are
// prefixed with "browser" so they never collide with the other e2e files.

// browserChromium is the browser the suite drives: $LAPD_CHROMIUM (which
// .ci/run exports), else Debian's /usr/bin/chromium.
var browserChromium = func() string {
	if p := os.Getenv("LAPD_CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}()

// browserPanel is the panel's shadow root on the demo page.
const browserPanel = `document.querySelector('[data-lapd-panel]').shadowRoot`

// browserTestID returns JS selecting a panel element by data-testid.
func browserTestID(id string) string {
	return browserPanel + `.querySelector('[data-testid="` + id + `"]')`
}

// browserTab is one headless Chromium with one page.
type browserTab struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string // HTTP errors and console errors the page met
}

// Viewports: a desktop window and a phone (390 px wide, as an iPhone 12–15).
const (
	browserDesktopW, browserDesktopH = 1280, 800
	browserPhoneW, browserPhoneH     = 390, 844
)

// browserOpen starts a fresh headless Chromium (own profile dir) with a
// desktop viewport and opens url. The browser is closed on cleanup.
func browserOpen(t *testing.T, url string) *browserTab {
	t.Helper()
	return browserOpenSize(t, url, browserDesktopW, browserDesktopH)
}

// browserOpenSize is browserOpen with a viewport of w×h CSS pixels (a phone
// width also turns on touch and mobile emulation).
func browserOpenSize(t *testing.T, url string, w, h int64) *browserTab {
	t.Helper()
	return browserLaunch(t, url, w, h, false)
}

// browserLaunch is browserOpenSize; with realTimers the browser keeps its
// default throttling of a hidden page's timers (the other tests turn it off,
// so that their timing does not depend on the page being shown). extra
// options are appended to the browser's.
func browserLaunch(t *testing.T, url string, w, h int64, realTimers bool, extra ...chromedp.ExecAllocatorOption) *browserTab {
	t.Helper()
	needTool(t, "chromium", browserChromium)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browserChromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	if !realTimers {
		// A hidden or occluded page must not throttle the timers lapd.js uses.
		opts = append(opts, chromedp.Flag("disable-background-timer-throttling", true),
			chromedp.Flag("disable-renderer-backgrounding", true))
	}
	opts = append(opts, extra...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browserTab{t: t, ctx: ctx}
	// The first Run starts the browser and must use ctx itself: a derived
	// context with a deadline would close the browser when it is cancelled.
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if w < 600 {
		browserRun(t, ctx, 10*time.Second, chromedp.EmulateViewport(w, h, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulatePortrait))
	} else {
		browserRun(t, ctx, 10*time.Second, chromedp.EmulateViewport(w, h))
	}
	// Record what a browser-driving tool would report as errors: failed
	// requests (a missing favicon is one) and console errors.
	if err := chromedp.Listen(ctx, func(ev any) {
		var p string
		switch e := ev.(type) {
		case *network.EventResponseReceived:
			if e.Response != nil && e.Response.Status >= 400 {
				p = fmt.Sprintf("HTTP %d %s", e.Response.Status, e.Response.URL)
			}
		case *cdplog.EventEntryAdded:
			if e.Entry != nil && e.Entry.Level == cdplog.EntryLevelError {
				p = "console: " + e.Entry.Text
			}
		case *runtime.EventExceptionThrown:
			if e.ExceptionDetails != nil {
				p = "exception: " + e.ExceptionDetails.Text
			}
		}
		if p != "" {
			b.mu.Lock()
			b.problems = append(b.problems, p)
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	browserRun(t, ctx, 20*time.Second, chromedp.Navigate(url))
	b.waitJS(`!!window.__lapd && !!`+browserPanel, 10*time.Second)
	return b
}

// emulateMedia sets CSS media features for the page, as a system setting
// would (e.g. "prefers-color-scheme", "dark"; pairs of name and value).
func (b *browserTab) emulateMedia(nameValue ...string) {
	b.t.Helper()
	var feats []*emulation.MediaFeature
	for i := 0; i+1 < len(nameValue); i += 2 {
		feats = append(feats, &emulation.MediaFeature{Name: nameValue[i], Value: nameValue[i+1]})
	}
	browserRun(b.t, b.ctx, 10*time.Second, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: feats})
		return err
	}))
}

// pageProblems returns the HTTP and console errors seen so far.
func (b *browserTab) pageProblems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

// key presses keys (kb constants or text) with optional modifiers, on
// whatever has focus. Enter is sent as a keyboard sends it, one keyDown that
// carries the text and a keyUp (chromedp's KeyEvent adds a separate char
// event, which a page cannot cancel from keydown as it can a real keypress).
func (b *browserTab) key(keys string, mods ...chromedp.Modifier) {
	b.t.Helper()
	if keys == kb.Enter {
		var m int64
		for _, x := range mods {
			m |= int64(x)
		}
		down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: "Enter", Code: "Enter", Text: "\r", UnmodifiedText: "\r",
			WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13, Modifiers: m}
		up := down
		up.Type, up.Text, up.UnmodifiedText = input.DispatchKeyEventTypeKeyUp, "", ""
		browserRun(b.t, b.ctx, 10*time.Second, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, down); err != nil {
				return err
			}
			_, err := cdp.Call(ctx, t, input.DispatchKeyEvent, up)
			return err
		}))
		return
	}
	browserRun(b.t, b.ctx, 10*time.Second, chromedp.KeyEvent(keys, chromedp.KeyModifiers(mods...)))
}

// focused describes the element that has focus, looking into shadow roots:
// "panel:<data-testid>" inside the panel, "skip" on the skip link,
// "page:<tag>#<id>" elsewhere, "body" when nothing has focus.
func (b *browserTab) focused() string {
	b.t.Helper()
	return b.evalString(`(() => {
	  let a = document.activeElement
	  if (!a || a === document.body) return 'body'
	  if (a.hasAttribute('data-lapd-skip')) return 'skip'
	  if (a.hasAttribute('data-lapd-panel')) {
	    const f = a.shadowRoot.activeElement
	    return f ? 'panel:' + (f.getAttribute('data-testid') || f.tagName.toLowerCase()) : 'panel:host'
	  }
	  return 'page:' + a.tagName.toLowerCase() + (a.id ? '#' + a.id : '')
	})()`)
}

// tabTo presses Tab until focused() reports want, at most max times, and
// returns how many presses it took.
func (b *browserTab) tabTo(want string, max int) int {
	b.t.Helper()
	var seen []string
	for i := 1; i <= max; i++ {
		b.key(kb.Tab)
		f := b.focused()
		seen = append(seen, f)
		if f == want {
			return i
		}
	}
	b.t.Fatalf("%s not reached in %d Tabs; focus went %v", want, max, seen)
	return 0
}

// browserRun runs one chromedp action with a deadline and fails on error.
func browserRun[T any](t *testing.T, ctx context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// eval evaluates js and decodes its value into out (may be nil).
func (b *browserTab) eval(js string, out any) {
	b.t.Helper()
	raw := browserRun(b.t, b.ctx, 10*time.Second, chromedp.Evaluate[json.RawMessage](js))
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			b.t.Fatalf("eval %s: decoding %s: %v", js, raw, err)
		}
	}
}

func (b *browserTab) evalString(js string) string {
	b.t.Helper()
	var s string
	b.eval(js, &s)
	return s
}

// click clicks the element the JS expression selects (it must exist).
func (b *browserTab) click(elem string) {
	b.t.Helper()
	var ok bool
	b.eval(`(() => { const e = `+elem+`; if (!e) return false; e.click(); return true })()`, &ok)
	if !ok {
		b.t.Fatalf("click: no element for %s", elem)
	}
}

// waitJS polls the page until js is truthy. The page has no signal to wait
// on, so this is a poll with a deadline, not a sleep.
func (b *browserTab) waitJS(js string, d time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`!!(`+js+`)`, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		sctx, scancel := context.WithTimeout(b.ctx, 2*time.Second)
		defer scancel()
		status, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`window.__lapd ? window.__lapd.status + ' ' + JSON.stringify(window.__lapd.error) : 'no agent'`))
		feed, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`(`+browserTestID("feed")+` || {}).textContent || ''`))
		b.t.Fatalf("waiting %s for %s: %v (agent status %s; feed %q)", d, js, err, status, feed)
	}
}

// waitEval is waitJS polled from here with one evaluation at a time, for
// a page whose own timers do not run on time (a hidden page the browser
// throttles) or that chromedp's Poll does not follow (a page restored from
// the back/forward cache, whose context chromedp dropped when it went
// away: evaluations fail until it reports the context again).
func (b *browserTab) waitEval(js string, d time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for {
		v, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`!!(`+js+`)`))
		if err == nil && v {
			return
		}
		if time.Now().After(deadline) {
			st, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`window.__lapd ? window.__lapd.status : 'no agent'`))
			b.t.Fatalf("waiting %v for %s: %v, %v (agent status %s)", d, js, v, err, st)
		}
		time.Sleep(50 * time.Millisecond) // a poll: the browser sends no event for it
	}
}

// waitStatus waits until the agent (and the panel) show status.
func (b *browserTab) waitStatus(status string, d time.Duration) {
	b.t.Helper()
	b.waitJS(`window.__lapd.status === '`+status+`' && `+browserTestID("status")+`.getAttribute('data-status') === '`+status+`'`, d)
}

// shot saves a viewport screenshot as docs/screenshots/<name>.png when
// LAPD_SCREENSHOTS=1 or the file is missing (so CI runs leave the tree clean).
func (b *browserTab) shot(name string) {
	b.t.Helper()
	path := filepath.Join("..", "docs", "screenshots", name+".png")
	if _, err := os.Stat(path); err == nil && os.Getenv("LAPD_SCREENSHOTS") != "1" {
		return
	}
	png := browserRun(b.t, b.ctx, 10*time.Second, chromedp.CaptureScreenshot())
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("wrote %s", path)
}

// browserFreeAddr returns a loopback address with a port that was free a
// moment ago, for a server that must come back on the same port.
func browserFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// browserMCPHTTP connects mcp-go's Streamable HTTP client to /agent/mcp.
func browserMCPHTTP(t *testing.T, srvURL string) *mcpclient.Client {
	t.Helper()
	c, err := mcpclient.NewStreamableHttpClient(srvURL + "/agent/mcp")
	if err != nil {
		t.Fatal(err)
	}
	browserMCPInit(t, c, true)
	return c
}

// browserMCPStdio runs `lapd mcp` (the stdio bridge, with extra flags)
// under mcp-go's client.
func browserMCPStdio(t *testing.T, extra ...string) *mcpclient.Client {
	t.Helper()
	c, err := mcpclient.NewStdioMCPClient(lapdBin, []string{"LAPD_LOG_LEVEL=warn", "LAPD_TOOLS="}, append([]string{"mcp"}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	browserMCPInit(t, c, false)
	return c
}

func browserMCPInit(t *testing.T, c *mcpclient.Client, start bool) {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if start {
		if err := c.Start(ctx); err != nil {
			t.Fatalf("mcp start: %v", err)
		}
	}
	req := mcpgo.InitializeRequest{}
	req.Params.ClientInfo = mcpgo.Implementation{Name: "lapd-browser-e2e", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		t.Fatalf("mcp initialize: %v", err)
	}
}

// browserToolResult is a tool result as the model sees it.
type browserToolResult struct {
	IsError bool
	Text    string
	SC      map[string]any // structuredContent
	Raw     json.RawMessage
}

// code is structuredContent.error.code of an isError result.
func (r browserToolResult) code() string {
	if e, ok := r.SC["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

// browserCall calls one tool and fails the test on a protocol error (an
// isError result is returned, not failed).
func browserCall(t *testing.T, c *mcpclient.Client, tool string, args map[string]any) browserToolResult {
	t.Helper()
	r, err := browserTryCall(c, tool, args)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return r
}

func browserTryCall(c *mcpclient.Client, tool string, args map[string]any) (browserToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return browserToolResult{}, err
	}
	out := browserToolResult{IsError: res.IsError}
	for _, ct := range res.Content {
		if tc, ok := ct.(mcpgo.TextContent); ok {
			out.Text += tc.Text
		}
	}
	raw := res.RawStructuredContent
	if len(raw) == 0 && res.StructuredContent != nil {
		raw, _ = json.Marshal(res.StructuredContent)
	}
	out.Raw = raw
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.SC); err != nil {
			return out, fmt.Errorf("structuredContent %s: %v", raw, err)
		}
	}
	return out, nil
}

// browserOK calls a tool that must succeed.
func browserOK(t *testing.T, c *mcpclient.Client, tool string, args map[string]any) map[string]any {
	t.Helper()
	r := browserCall(t, c, tool, args)
	if r.IsError {
		t.Fatalf("%s(%v): isError: %s", tool, args, r.Text)
	}
	return r.SC
}

// browserConnectAI plays the human and the model on the demo page: Connect
// an AI in the panel, then connect_session with its connect line over
// /agent/mcp; it returns once the panel shows the AI connected.
func browserConnectAI(t *testing.T, tab *browserTab, srvURL string) (*mcpclient.Client, string) {
	t.Helper()
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)
	mc := browserMCPHTTP(t, srvURL)
	sc := browserOK(t, mc, "connect_session", map[string]any{"line": line})
	sess, _ := sc["session"].(string)
	if !strings.HasPrefix(sess, "s_") {
		t.Fatalf("connect_session: %s", browserJSON(sc))
	}
	tab.waitStatus("active", 10*time.Second)
	return mc, sess
}

// browserBuildPlain builds lapd without -race (for performance figures).
func browserBuildPlain(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lapd-plain")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/lapd")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func browserJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func browserHasDiff(diff any, path, title string) bool {
	ops, _ := diff.([]any)
	for _, o := range ops {
		m, _ := o.(map[string]any)
		if m["path"] == path && (m["op"] == "add" || m["op"] == "replace") {
			if v, ok := m["value"].(map[string]any); ok && v["title"] == title {
				return true
			}
		}
	}
	return false
}

func browserCount(events []string, name string) int {
	n := 0
	for _, e := range events {
		if e == name {
			n++
		}
	}
	return n
}

// waitWhileTicking calls wait_for_change with args and, as the human,
// toggles task 2's checkbox every 300 ms until the call returns (the watch
// is registered asynchronously, so one click could come too early; each
// toggle is a change). It fails the test after 20 s.
func waitWhileTicking(t *testing.T, tab *browserTab, mc *mcpclient.Client, args map[string]any) browserToolResult {
	t.Helper()
	return waitWhileHuman(t, tab, mc, args, func() {
		tab.click(`document.querySelector('#board li[data-task-id="2"] input[type=checkbox]')`)
	})
}

// waitWhileHuman is waitWhileTicking with another human act, done every
// 300 ms until the call returns.
func waitWhileHuman(t *testing.T, tab *browserTab, mc *mcpclient.Client, args map[string]any, act func()) browserToolResult {
	t.Helper()
	waited := make(chan browserToolResult, 1)
	go func() {
		res, err := browserTryCall(mc, "wait_for_change", args)
		if err != nil {
			res = browserToolResult{IsError: true, Text: err.Error()}
		}
		waited <- res
	}()
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case res := <-waited:
			return res
		case <-tick.C:
			act()
		case <-deadline:
			t.Fatal("wait_for_change did not return after the checkbox was clicked")
		}
	}
}
