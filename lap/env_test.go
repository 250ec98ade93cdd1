package lap_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memSink captures audit entries.
type memSink struct {
	mu  sync.Mutex
	es  []audit.Entry
	log *audit.Log // flushed before reading
}

func (s *memSink) Write(_ context.Context, e audit.Entry) error {
	s.mu.Lock()
	s.es = append(s.es, e)
	s.mu.Unlock()
	return nil
}
func (s *memSink) Close() error { return nil }

func (s *memSink) events(name string) []audit.Entry {
	if s.log != nil {
		_ = s.log.Flush(context.Background())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []audit.Entry
	for _, e := range s.es {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

type envCfg struct {
	lap       lap.Config
	pair      pairing.Config
	tok       tokens.Config
	conf      confirm.Config
	audit     audit.Config // Sinks are set by newEnv
	noAnon    bool
	wrapStore func(tokens.Store) tokens.Store // optional: wraps the memory token store
}

// env is a real lapd stack on a loopback httptest server.
type env struct {
	t    testing.TB
	srv  *httptest.Server
	lap  *lap.Server
	tm   *tokens.Manager
	reg  *pairing.Registry
	cm   *confirm.Manager
	sink *memSink
}

func newEnv(t *testing.T, mods ...func(*envCfg)) *env { return newEnvTB(t, mods...) }

func newEnvTB(t testing.TB, mods ...func(*envCfg)) *env {
	t.Helper()
	var c envCfg
	for _, m := range mods {
		m(&c)
	}
	e := &env{t: t, sink: &memSink{}}
	c.audit.Sinks = []audit.Sink{e.sink}
	al := audit.New(c.audit)
	e.sink.log = al
	c.tok.Store = tokens.NewMemoryStore()
	if c.wrapStore != nil {
		c.tok.Store = c.wrapStore(c.tok.Store)
	}
	tm, err := tokens.NewManager(c.tok)
	if err != nil {
		t.Fatal(err)
	}
	c.pair.Tokens, c.pair.Audit = tm, al
	reg, err := pairing.New(c.pair)
	if err != nil {
		t.Fatal(err)
	}
	var srv *lap.Server
	c.conf.OnExpire = func(p confirm.Pending) {
		if srv != nil {
			srv.OnConfirmExpire(p)
		}
	}
	cm, err := confirm.New(context.Background(), c.conf)
	if err != nil {
		t.Fatal(err)
	}
	c.lap.Tokens, c.lap.Registry, c.lap.Confirm, c.lap.Audit = tm, reg, cm, al
	c.lap.AllowAnonymous = !c.noAnon
	srv, err = lap.New(c.lap)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/agent/ws", reg)
	mux.Handle("/agent/", srv.Handler())
	e.srv = httptest.NewServer(mux)
	e.lap, e.tm, e.reg, e.cm = srv, tm, reg, cm
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = reg.Shutdown(ctx)
		e.srv.Close()
		_ = cm.Close()
		_ = c.tok.Store.Close()
		_ = al.Close()
	})
	return e
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// resp is a decoded HTTP response.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

func (r resp) code() string {
	var m struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &m)
	return m.Error.Code
}

func (e *env) do(method, path, token, body string, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, b}
}

func (e *env) lapCall(token, route, body string) resp {
	e.t.Helper()
	return e.do("POST", "/agent/lap/v1"+route, token, body)
}

// mint returns a fresh token and tid (anonymous mint).
func (e *env) mint() (string, string) {
	e.t.Helper()
	r := e.do("POST", "/agent/mint", "", "")
	if r.status != 200 {
		e.t.Fatalf("mint: %d %s", r.status, r.body)
	}
	m := r.json(e.t)
	return m["token"].(string), m["tid"].(string)
}

func (e *env) dial(token string, opts ...lapdtest.Option) *lapdtest.Tab {
	e.t.Helper()
	tab, err := lapdtest.Dial(ctxT(e.t), e.srv.URL+"/agent/ws", token, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(tab.Abort)
	return tab
}

// paired mints and connects a tab.
func (e *env) paired(opts ...lapdtest.Option) (token, tid string, tab *lapdtest.Tab) {
	e.t.Helper()
	token, tid = e.mint()
	return token, tid, e.dial(token, opts...)
}
