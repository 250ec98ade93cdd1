package examples_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/client"
	"github.com/lapd-dev/lapd/examples"
)

// fakeLapd is the smallest server lapd.js can talk to: mint, revoke and a
// WebSocket that hands every frame from the tab to the test. The real server
// is tested elsewhere; this test checks the page and the client in a real
// browser.
type fakeLapd struct {
	frames  chan map[string]any
	conns   chan *websocket.Conn
	mints   atomic.Int32
	wsTries atomic.Int32
	probes  atomic.Int32
}

func (f *fakeLapd) routes(srvURL func() string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/agent/client.js", client.Handler())
	mux.Handle("/demo/save", examples.SaveHandler())
	mux.Handle("/", examples.Handler())
	mux.HandleFunc("POST /agent/mint", func(w http.ResponseWriter, r *http.Request) {
		f.mints.Add(1)
		base := srvURL()
		_ = json.NewEncoder(w).Encode(map[string]any{
			"token": "agt_browsertest", "tid": "tid-1", "lapVersion": 2,
			"wsUrl": "ws" + strings.TrimPrefix(base, "http") + "/agent/ws", "lapUrl": base + "/agent/lap/v1",
			"expiresAt": time.Now().Add(time.Hour).UnixMilli(),
		})
	})
	mux.HandleFunc("POST /agent/revoke", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"status":"revoked"}`))
	})
	mux.HandleFunc("POST /agent/lap/v1/describe", func(w http.ResponseWriter, r *http.Request) {
		f.probes.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") != "Bearer agt_browsertest" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"auth-failed"}}`))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":"paused","reconnect":"pending"}}`))
	})
	mux.HandleFunc("/agent/ws", func(w http.ResponseWriter, r *http.Request) {
		f.wsTries.Add(1)
		// lapd.js carries the token as a sub-protocol entry, never in the URL.
		if !strings.Contains(r.Header.Get("Sec-WebSocket-Protocol"), "lapd.token.agt_browsertest") || r.URL.RawQuery != "" {
			http.Error(w, `{"error":{"code":"auth-failed"}}`, http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"lapd.v2"}})
		if err != nil {
			return
		}
		f.conns <- c
		for {
			_, data, err := c.Read(r.Context())
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal(data, &m) == nil {
				select {
				case f.frames <- m:
				case <-r.Context().Done():
					return
				}
			}
		}
	})
	return mux
}

func TestTaskboardInBrowser(t *testing.T) {
	browser := os.Getenv("LAPD_CHROMIUM") // .ci/run exports it
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if browser != "" {
			break
		}
		if p, err := exec.LookPath(name); err == nil {
			browser = p
		}
	}
	if browser == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is required when CI=true")
		}
		t.Skip("no chromium")
	}

	f := &fakeLapd{frames: make(chan map[string]any, 256), conns: make(chan *websocket.Conn, 4)}
	var srv *httptest.Server
	srv = httptest.NewServer(f.routes(func() string { return srv.URL }))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.Headless, chromedp.Flag("disable-gpu", true))...)
	defer cancelAlloc()
	bctx, cancelB := chromedp.NewContext(allocCtx)
	defer cancelB()

	evalStr := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("eval %s: %v", js, err)
		}
		return v
	}
	click := func(js string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](js+`.click(), true`)); err != nil {
			t.Fatalf("click %s: %v", js, err)
		}
	}
	waitJS := func(js string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			t.Fatalf("waiting for %s: %v", js, err)
		}
	}
	// LAPD_SCREENSHOT_DIR=/tmp/x go test -run Browser ./examples saves PNGs of the page.
	shot := func(name string) {
		if dir := os.Getenv("LAPD_SCREENSHOT_DIR"); dir != "" {
			if png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
			}
		}
	}
	next := func(typ string) map[string]any {
		t.Helper()
		for {
			select {
			case m := <-f.frames:
				if m["t"] == typ {
					return m
				}
			case <-ctx.Done():
				t.Fatalf("no %s frame", typ)
			}
		}
	}
	const panel = `document.querySelector('[data-lapd-panel]').shadowRoot`

	if _, err := chromedp.Run(bctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS(`window.__lapd && window.__lapd.status === 'idle' && !!` + panel + `.querySelector('[data-testid=connect]')`)
	click(panel + `.querySelector('[data-testid=connect]')`)

	conn := <-f.conns
	defer conn.CloseNow()
	hello := next("hello")
	if hello["appName"] != "taskboard" || hello["lapVersion"] != float64(2) {
		t.Fatalf("hello: %v", hello)
	}
	policy := hello["policy"].(map[string]any)["variants"].(map[string]any)
	if reset := policy["resetDemo"].(map[string]any); reset["humanOnly"] != true {
		t.Fatalf("policy resetDemo: %v", reset)
	}
	waitJS(`!!` + panel + `.querySelector('[data-testid=connect-line]')`)
	line := evalStr(panel + `.querySelector('[data-testid=connect-line]').value`)
	if want := "Connect to my app with lapd: connect_session url=" + srv.URL + "/agent/lap/v1 token=agt_browsertest"; line != want {
		t.Fatalf("connect line %q, want %q", line, want)
	}

	send := func(frame string) {
		t.Helper()
		if err := conn.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"t":"hello-ack","lapVersion":2,"minClientVersion":2,"heartbeatMs":15000}`)
	send(`{"t":"active"}`)
	waitJS(`window.__lapd.status === 'active'`)

	reply := func(id string) map[string]any {
		t.Helper()
		for {
			m := next("rpc-reply")
			if m["id"] == id {
				return m["result"].(map[string]any)
			}
		}
	}

	// An async action: the reply waits for the 150 ms save to land.
	send(`{"t":"rpc","id":"r1","tool":"send_message","args":{"msg":{"type":"save"}}}`)
	res := reply("r1")
	drain := res["drain"].(map[string]any)
	diff, _ := json.Marshal(res["stateDiff"])
	if res["status"] != "dispatched" || drain["timedOut"] != false || !strings.Contains(string(diff), `"/savedAt"`) {
		t.Fatalf("save: %v", res)
	}
	if d := drain["durationMs"].(float64); d < float64(examples.SaveDelay.Milliseconds()) {
		t.Fatalf("drain took %v ms, shorter than the save", d)
	}

	// Human-only stays with humans.
	send(`{"t":"rpc","id":"r2","tool":"send_message","args":{"msg":{"type":"resetDemo"}}}`)
	if res := reply("r2"); res["reason"] != "human-only" {
		t.Fatalf("resetDemo: %v", res)
	}

	// requiresConfirm: the panel shows Approve; clicking it runs the action and answers.
	send(`{"t":"rpc","id":"r3","tool":"send_message","args":{"msg":{"type":"clearAll"},"reason":"test"}}`)
	res = reply("r3")
	confirmID, _ := res["confirmId"].(string)
	if res["status"] != "pending-confirmation" || confirmID == "" {
		t.Fatalf("clearAll: %v", res)
	}
	approve := panel + `.querySelector('[data-testid="approve-` + confirmID + `"]')`
	waitJS(`!!` + approve)
	shot("approval")
	click(approve)
	resolved := next("confirm-resolved")
	if resolved["confirmId"] != confirmID || resolved["outcome"] != "confirmed" {
		t.Fatalf("confirm-resolved: %v", resolved)
	}
	if tasks := resolved["stateAfter"].(map[string]any)["tasks"].([]any); len(tasks) != 0 {
		t.Fatalf("tasks after clearAll: %v", tasks)
	}

	send(`{"t":"rpc","id":"r4","tool":"describe_visible_content","args":{}}`)
	res = reply("r4")
	out, _ := json.Marshal(res["outline"])
	if res["source"] != "data-agent" || !strings.Contains(string(out), `"name":"board"`) || !strings.Contains(string(out), `"actionVariant":"save"`) {
		t.Fatalf("describe_visible_content: %s %v", out, res["source"])
	}
	feed := evalStr(panel + `.querySelector('[data-testid=feed]').textContent`)
	if !strings.Contains(feed, "Done: Save the board (3 tasks)") || !strings.Contains(feed, "Blocked: Reset the demo board (humans only): only you can do this") {
		t.Fatalf("feed: %q", feed)
	}

	// A reload restores the session from sessionStorage: same token, no new mint.
	if _, err := chromedp.Run(bctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	conn2 := <-f.conns
	defer conn2.CloseNow()
	conn = conn2
	if h := next("hello"); h["appName"] != "taskboard" {
		t.Fatalf("hello after reload: %v", h)
	}
	if n := f.mints.Load(); n != 1 {
		t.Fatalf("%d mints, want 1 (reload must not mint)", n)
	}
	send(`{"t":"active"}`)
	waitJS(`window.__lapd.status === 'active'`)

	// Revoked by the server: no reconnect, session forgotten.
	conn.Close(4001, "revoked")
	waitJS(`window.__lapd.status === 'idle' && sessionStorage.getItem('lapd:session') === null`)

	// A token the server refuses before the upgrade: the browser only sees a
	// close without open; the client probes, gets 401 and stops at once.
	tries := f.wsTries.Load()
	evalStr(`sessionStorage.setItem('lapd:session', JSON.stringify({token: 'agt_bad', tid: 'x', lapUrl: '` + srv.URL + `/agent/lap/v1', wsUrl: 'ws` + strings.TrimPrefix(srv.URL, "http") + `/agent/ws', expiresAt: Date.now() + 60000})), 'ok'`)
	if _, err := chromedp.Run(bctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	waitJS(`window.__lapd && window.__lapd.status === 'error' && window.__lapd.error.code === 'auth-failed' && sessionStorage.getItem('lapd:session') === null`)
	if got := f.wsTries.Load() - tries; got != 1 {
		t.Fatalf("%d socket attempts with a refused token, want 1", got)
	}
	if f.probes.Load() != 1 {
		t.Fatalf("%d probes, want 1", f.probes.Load())
	}
	// The panel renders the client's status on its next frame, not with it.
	waitJS(panel + `.querySelector('[data-testid=status]').textContent.includes('auth-failed')`)
	shot("error")
}
