package lapd_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/mcp"
	"github.com/lapd-dev/lapd/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// start runs a lapd on a loopback server; the returned stop shuts both down.
func start(t *testing.T, cfg lapd.Config) (*lapd.Server, *httptest.Server, func()) {
	t.Helper()
	a, err := lapd.New(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		srv.Close()
	}
	t.Cleanup(stop)
	return a, srv, stop
}

func post(t *testing.T, url, token, body string, hdr ...string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return res.StatusCode, res.Header, m
}

func mint(t *testing.T, base string) (string, string) {
	t.Helper()
	st, _, m := post(t, base+"/agent/mint", "", "")
	if st != 200 {
		t.Fatalf("mint: %d %v", st, m)
	}
	return m["token"].(string), m["tid"].(string)
}

func TestHealthzAndRefusals(t *testing.T) {
	t.Parallel()
	// An origin as a person types it is compared as a browser sends it.
	a, srv, _ := start(t, lapd.Config{AllowAnonymous: true, Origins: []string{" HTTPS://OK.example:443/"}})
	res, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != `{"status":"ok","tabs":0}` {
		t.Errorf("healthz: %d %s", res.StatusCode, b)
	}
	token, _ := mint(t, srv.URL)
	// bad token: refused before the upgrade
	_, err = lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", "agt_nope")
	var de *lapdtest.DialError
	if !errors.As(err, &de) || de.Status != 401 || !strings.Contains(string(de.Body), "auth-failed") {
		t.Errorf("bad token dial: %v", err)
	}
	// CSWSH: a foreign Origin is refused
	_, err = lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", token, lapdtest.WithOrigin("https://evil.example"))
	if !errors.As(err, &de) || de.Status != 403 {
		t.Errorf("evil origin dial: %v", err)
	}
	tab, err := lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", token, lapdtest.WithOrigin("https://ok.example"))
	if err != nil {
		t.Fatalf("allowed origin: %v", err)
	}
	defer tab.Abort()
	if st, _, m := post(t, srv.URL+"/agent/lap/v1/state", token, `{"path":"/count"}`); st != 200 || m["state"] != float64(0) {
		t.Errorf("state: %d %v", st, m)
	}
	res, _ = http.Get(srv.URL + "/healthz")
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != `{"status":"ok","tabs":1}` {
		t.Errorf("healthz with a tab: %s", b)
	}
	a.LAP().Drain()
	res, _ = http.Get(srv.URL + "/healthz")
	res.Body.Close()
	if res.StatusCode != 503 {
		t.Errorf("healthz while draining: %d", res.StatusCode)
	}
}

func TestRestartKeepsSessions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := lapd.Config{DataDir: dir, AllowAnonymous: true, AuditSQLite: true, Grace: time.Minute}
	_, srv1, stop1 := start(t, cfg)
	token, tid := mint(t, srv1.URL)
	tab, err := lapdtest.Dial(ctxT(t), srv1.URL+"/agent/ws", token)
	if err != nil {
		t.Fatal(err)
	}
	if st, _, _ := post(t, srv1.URL+"/agent/lap/v1/actions", token, ""); st != 200 {
		t.Fatalf("first call: %d", st)
	}
	stop1()
	<-tab.Done()
	if got := tab.CloseStatus(); got != 1012 {
		t.Errorf("tab closed with %d, want 1012", got)
	}
	tab.Abort()

	a2, srv2, _ := start(t, cfg)
	rec, err := a2.Tokens().Get(ctxT(t), tid)
	if err != nil {
		t.Fatalf("record lost across restart: %v", err)
	}
	t.Logf("after restart: %s", rec.Status)
	tab2, err := lapdtest.Dial(ctxT(t), srv2.URL+"/agent/ws", token)
	if err != nil {
		t.Fatalf("re-pair after restart: %v", err)
	}
	defer tab2.Abort()
	if st, _, m := post(t, srv2.URL+"/agent/lap/v1/state", token, `{"path":"/count"}`); st != 200 {
		t.Errorf("LAP after restart: %d %v", st, m)
	}
}

func TestShutdownAnswersInFlight(t *testing.T) {
	t.Parallel()
	a, srv, _ := start(t, lapd.Config{AllowAnonymous: true})
	token, _ := mint(t, srv.URL)
	entered := make(chan struct{})
	release := make(chan struct{})
	tab, err := lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", token, lapdtest.WithHandler("list_actions", func(json.RawMessage) (any, *lapdtest.RPCError) {
		close(entered)
		<-release
		return map[string]any{"actions": []any{}}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	done := make(chan int, 1)
	go func() {
		st, _, _ := post(t, srv.URL+"/agent/lap/v1/actions", token, "")
		done <- st
	}()
	<-entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- a.Shutdown(ctx)
	}()
	// new calls are refused while the first is still running
	for !a.LAP().Draining() {
		time.Sleep(time.Millisecond) // Shutdown starts on another goroutine
	}
	if st, _, m := post(t, srv.URL+"/agent/lap/v1/state", token, ""); st != 503 {
		t.Errorf("during shutdown: %d %v", st, m)
	}
	close(release)
	if st := <-done; st != 200 {
		t.Errorf("in-flight call: %d", st)
	}
	if err := <-shut; err != nil {
		t.Error(err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// Handler serves what `lapd serve` serves: client, MCP endpoint, demo.
func TestHandlerServesEverything(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{AllowAnonymous: true, Demo: true})
	for path, want := range map[string]string{
		"/agent/client.js":   "createAgent",
		"/agent/client.d.ts": "createAgent",
		"/":                  "Taskboard",
	} {
		if st, body := get(t, srv.URL+path); st != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 200 with %q", path, st, want)
		}
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	st, _, m := post(t, srv.URL+"/agent/mcp", "", init, "Content-Type", "application/json", "Accept", "application/json, text/event-stream")
	if st != 200 || m["result"] == nil {
		t.Errorf("MCP initialize: %d %v", st, m)
	}

	// Without Demo and with DisableMCP, both are gone.
	_, srv2, _ := start(t, lapd.Config{AllowAnonymous: true, DisableMCP: true})
	if st, _ := get(t, srv2.URL+"/"); st != 404 {
		t.Errorf("GET / without Demo: %d", st)
	}
	if st, _, _ := post(t, srv2.URL+"/agent/mcp", "", init, "Content-Type", "application/json"); st != 404 {
		t.Errorf("POST /agent/mcp with DisableMCP: %d", st)
	}
}

// Under another prefix every route moves, and mint hands out matching URLs.
func TestPrefix(t *testing.T) {
	t.Parallel()
	a, srv, _ := start(t, lapd.Config{AllowAnonymous: true, Prefix: "/x/lapd/"})
	if a.Prefix() != "/x/lapd" {
		t.Errorf("Prefix() = %q", a.Prefix())
	}
	sess, err := lapdtest.Mint(ctxT(t), nil, srv.URL+"/x/lapd/mint")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(sess.WSURL, "/x/lapd/ws") || sess.LapURL != srv.URL+"/x/lapd/lap/v1" {
		t.Errorf("mint URLs: ws %q lap %q", sess.WSURL, sess.LapURL)
	}
	tab, err := sess.Pair(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	if st, _, m := post(t, sess.LapURL+"/state", sess.Token, `{"path":"/count"}`); st != 200 || m["state"] != float64(0) {
		t.Errorf("LAP under the prefix: %d %v", st, m)
	}
	if st, body := get(t, srv.URL+"/x/lapd/client.js"); st != 200 || !strings.Contains(body, "createAgent") {
		t.Errorf("client.js under the prefix: %d", st)
	}
	if st, _, _ := post(t, srv.URL+"/agent/mint", "", ""); st != 404 {
		t.Errorf("/agent/mint under another prefix: %d, want 404", st)
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]lapd.Config{
		"demo needs /agent":     {Demo: true, Prefix: "/other"},
		"bad prefix":            {Prefix: "/a/{x}"},
		"unknown store":         {Store: "redis"},
		"sqlite needs data dir": {Store: "sqlite"},
		"audit sqlite, memory":  {AuditSQLite: true},
		"wildcard origin":       {Origins: []string{"*"}},
		"origin with a path":    {Origins: []string{"https://a.example/app"}},
		"origin, no scheme":     {Origins: []string{"a.example"}},
	} {
		if s, err := lapd.New(ctxT(t), cfg); err == nil {
			s.Shutdown(ctxT(t))
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// Revoke from the host app's own code closes the tab and stops the token.
func TestRevoke(t *testing.T) {
	t.Parallel()
	a, srv, _ := start(t, lapd.Config{AllowAnonymous: true})
	token, tid := mint(t, srv.URL)
	tab, err := lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", token)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	if err := a.Revoke(ctxT(t), tid); err != nil {
		t.Fatal(err)
	}
	<-tab.Done()
	if got := tab.CloseStatus(); got != 4001 {
		t.Errorf("tab closed with %d, want 4001", got)
	}
	if st, _, _ := post(t, srv.URL+"/agent/lap/v1/state", token, ""); st != 403 {
		t.Errorf("LAP after revoke: %d, want 403", st)
	}
	if err := a.Revoke(ctxT(t), "nope"); !errors.Is(err, tokens.ErrForbidden) {
		t.Errorf("revoking an unknown tid: %v", err)
	}
}

// ownStore is the app's own token store (here a memory store that records
// whether lapd closed it).
type ownStore struct {
	tokens.Store
	closed atomic.Bool
}

func (s *ownStore) Close() error { s.closed.Store(true); return s.Store.Close() }

type ownConfirmStore struct {
	confirm.Store
	closed atomic.Bool
}

func (s *ownConfirmStore) Close() error { s.closed.Store(true); return s.Store.Close() }

// memSink is the app's own audit sink.
type memSink struct {
	mu     sync.Mutex
	es     []audit.Entry
	closed bool
}

func (s *memSink) Write(_ context.Context, e audit.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.es = append(s.es, e)
	return nil
}

func (s *memSink) Close() error { s.mu.Lock(); s.closed = true; s.mu.Unlock(); return nil }

// The implementation options: the app's own token and approval stores,
// audit sink, and an identity that reads the app's own session cookie.
func TestOwnImplementations(t *testing.T) {
	t.Parallel()
	sessions := map[string]string{"s-alice": "alice"} // the app's session table
	id := lap.IdentityFunc(func(r *http.Request) (string, error) {
		c, err := r.Cookie("sid")
		if err != nil {
			return "", nil // not logged in: anonymous
		}
		return sessions[c.Value], nil
	})
	ts := &ownStore{Store: tokens.NewMemoryStore()}
	cs := &ownConfirmStore{Store: confirm.NewMemoryStore()}
	sink := &memSink{}
	a, srv, stop := start(t, lapd.Config{Identity: id, TokenStore: ts, ConfirmStore: cs, AuditSinks: []audit.Sink{sink}})

	if st, _, m := post(t, srv.URL+"/agent/mint", "", ""); st != 401 {
		t.Errorf("mint without the app's session: %d %v, want 401", st, m)
	}
	st, _, m := post(t, srv.URL+"/agent/mint", "", "", "Cookie", "sid=s-alice")
	if st != 200 {
		t.Fatalf("mint as alice: %d %v", st, m)
	}
	rec, err := ts.Get(ctxT(t), m["tid"].(string))
	if err != nil || rec.UID != "alice" {
		t.Errorf("the app's store has %+v, %v; want alice's record", rec, err)
	}
	if _, err := a.Tokens().Get(ctxT(t), rec.TID); err != nil {
		t.Errorf("Tokens() does not read the app's store: %v", err)
	}
	stop()
	if ts.closed.Load() || cs.closed.Load() {
		t.Error("Shutdown closed a store the app passed in")
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	var mints []string
	for _, e := range sink.es {
		if e.Event == audit.EventMint {
			mints = append(mints, e.UID)
		}
	}
	if len(mints) != 1 || mints[0] != "alice" || !sink.closed {
		t.Errorf("the app's sink: mints %v, closed %v; want [alice], closed", mints, sink.closed)
	}
}

// Prefix "/" puts every route at the root of the handler.
func TestRootPrefix(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{AllowAnonymous: true, Prefix: "/"})
	sess, err := lapdtest.Mint(ctxT(t), nil, srv.URL+"/mint")
	if err != nil {
		t.Fatal(err)
	}
	if sess.LapURL != srv.URL+"/lap/v1" || !strings.HasSuffix(sess.WSURL, srv.URL[len("http"):]+"/ws") {
		t.Errorf("mint URLs at the root: %q %q", sess.LapURL, sess.WSURL)
	}
	tab, err := sess.Pair(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	if st, body := get(t, srv.URL+"/healthz"); st != 200 || body != `{"status":"ok","tabs":1}` {
		t.Errorf("healthz: %d %s", st, body)
	}
	if st, _ := get(t, srv.URL+"/client.js"); st != 200 {
		t.Errorf("client.js at the root: %d", st)
	}
}

// Config.MCPTools picks the tools /agent/mcp lists: the core six by
// default, all 16 with mcp.ToolsAll.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	for set, want := range map[mcp.ToolSet]int{mcp.ToolsCore: 6, mcp.ToolsAll: 16} {
		_, srv, _ := start(t, lapd.Config{MCPTools: set})
		hdr := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "MCP-Protocol-Version", "2025-11-25"}
		init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
		st, h, _ := post(t, srv.URL+"/agent/mcp", "", init, hdr...)
		if st != 200 {
			t.Fatalf("initialize: %d", st)
		}
		st, _, m := post(t, srv.URL+"/agent/mcp", "", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`, append(hdr, "Mcp-Session-Id", h.Get("Mcp-Session-Id"))...)
		tools, _ := m["result"].(map[string]any)["tools"].([]any)
		if st != 200 || len(tools) != want {
			t.Errorf("%v: tools/list %d, %d tools, want %d", set, st, len(tools), want)
		}
	}
}

// Config.MCPNoFastPath turns the /agent/mcp fast path off; it is on by
// default.
func TestMCPFastPathConfig(t *testing.T) {
	t.Parallel()
	for _, off := range []bool{false, true} {
		s, _, _ := start(t, lapd.Config{MCPNoFastPath: off})
		if got := s.MCP().FastPath(); got == off {
			t.Errorf("MCPNoFastPath %v: fast path %v", off, got)
		}
	}
}

// A tab answers every LAP call with two frames (the reply and the
// log-append). Those answers are not counted in the socket's inbound rates
// (pairing/frame.go), so with the LAP rate raised the tab's socket is not
// throttled below it: counted at the pairing defaults (200 frames/s, burst
// 1,000), they held a single agent to 100 calls a second.
func TestTabAnswersFollowLAPRate(t *testing.T) {
	t.Parallel()
	s := lapdtest.NewServer(lapd.Config{LAPRate: 1e9, LAPBurst: 1 << 20})
	defer s.Close()
	ctx := ctxT(t)
	tab, sess, err := s.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	c := lap.NewHTTPClient(s.Client())
	for i := range 1000 {
		if _, err := c.Call(ctx, sess.LapURL, sess.Token, "/observe", nil); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := s.Lapd.Stats().Pairing.Throttled; n != 0 {
		t.Fatalf("%d inbound frames throttled under a LAP rate of 1e9/s", n)
	}
}

// Config.MCPSessions reaches the MCP endpoint: with room for one stateful
// session, a second client's initialize makes room by evicting the first
// (which then gets 404), as a full table does.
func TestMCPSessionLimits(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{MCPSessions: lapd.MCPSessionLimits{Max: 1}})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	hdr := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "MCP-Protocol-Version", "2025-06-18"}
	session := func() string {
		t.Helper()
		st, h, b := do(t, "POST", srv.URL+"/agent/mcp", "", init, hdr...)
		if st != 200 || h.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize: %d %s (session %q)", st, b, h.Get("Mcp-Session-Id"))
		}
		return h.Get("Mcp-Session-Id")
	}
	first, second := session(), session()
	if st, _, b := do(t, "POST", srv.URL+"/agent/mcp", "", list, append(hdr, "Mcp-Session-Id", second)...); st != 200 {
		t.Errorf("tools/list on the new session: %d %s", st, b)
	}
	if st, _, b := do(t, "POST", srv.URL+"/agent/mcp", "", list, append(hdr, "Mcp-Session-Id", first)...); st != http.StatusNotFound {
		t.Errorf("tools/list on the session evicted by MCPSessions.Max 1: %d %s, want 404", st, b)
	}
}

// lapd.db removed or replaced under a running lapd: SQLite writes on into
// the unlinked file, and at the next start the run's tokens, approvals and
// audit were gone while /readyz had said ready all along. Now /readyz says
// not ready and what to do, without the data directory's path or lapd's
// pid: /readyz answers whoever reaches the port (the log names them).
func TestReadyzNoticesTheDatabaseFileGone(t *testing.T) {
	t.Parallel()
	for _, replace := range []bool{false, true} {
		dir := t.TempDir()
		_, srv, _ := start(t, lapd.Config{DataDir: dir, AllowAnonymous: true})
		readyz := func() (int, string) {
			res, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, string(b)
		}
		if st, body := readyz(); st != 200 || !strings.Contains(body, `"name":"database","ok":true`) || strings.Contains(body, filepath.ToSlash(dir)) {
			t.Fatalf("readyz at start (the data directory's path must not show): %d %s", st, body)
		}
		db := filepath.Join(dir, "lapd.db")
		if err := os.Rename(db, db+".moved"); err != nil {
			t.Fatal(err)
		}
		want := "was removed"
		if replace {
			if err := os.WriteFile(db, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			want = "was replaced"
		}
		st, body := readyz()
		if st != 503 || !strings.Contains(body, `"name":"database","ok":false`) || !strings.Contains(body, want) {
			t.Errorf("readyz with lapd.db gone (replaced %v): %d %s", replace, st, body)
		}
		if strings.Contains(body, filepath.ToSlash(dir)) || strings.Contains(body, "/proc/"+strconv.Itoa(os.Getpid())) {
			t.Errorf("readyz names the data directory or lapd's pid to an unauthenticated caller: %s", body)
		}
	}
}

// Behind a TLS proxy (--public-url https://…, --trust-proxy 1) a page on
// lapd's public origin got 403 forbidden-origin from /agent/mcp while mint
// took the same request: the endpoint judged same-origin from the Host with
// the scheme of the hop to lapd (http). The public origin is lapd's own.
func TestMCPAllowsThePublicOrigin(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{PublicURL: "https://app.example.com", TrustProxy: 1, AllowAnonymous: true})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	hdr := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream",
		"X-Forwarded-Proto", "https", "X-Forwarded-For", "203.0.113.7"}
	if st, _, b := do(t, "POST", srv.URL+"/agent/mcp", "app.example.com", init, append(hdr, "Origin", "https://app.example.com")...); st != 200 {
		t.Errorf("initialize from the public origin: %d %s", st, b)
	}
	if st, _, b := do(t, "POST", srv.URL+"/agent/mcp", "app.example.com", init, append(hdr, "Origin", "https://evil.example")...); st != http.StatusForbidden {
		t.Errorf("initialize from a foreign origin: %d %s", st, b)
	}
}
