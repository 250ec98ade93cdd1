package pairing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memSink collects audit entries.
type memSink struct {
	mu      sync.Mutex
	entries []audit.Entry
	log     *audit.Log // flushed before reading
}

func (s *memSink) Write(_ context.Context, e audit.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries = append(s.entries, e)
	return nil
}
func (s *memSink) Close() error { return nil }
func (s *memSink) find(event string) []audit.Entry {
	if s.log != nil {
		_ = s.log.Flush(context.Background())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []audit.Entry
	for _, e := range s.entries {
		if e.Event == event {
			out = append(out, e)
		}
	}
	return out
}

// env is a registry served over real loopback HTTP with a real token manager.
type env struct {
	t      testing.TB
	tm     *tokens.Manager
	reg    *Registry
	srv    *httptest.Server
	sink   *memSink
	paired chan string // "tid repair=bool"
	closed chan string // tid
	logs   chan string // tid
	confs  chan ConfirmResolved
}

func newEnv(t testing.TB, mod func(*Config, *tokens.Config)) *env {
	t.Helper()
	e := &env{t: t, sink: &memSink{}, paired: make(chan string, 1024), closed: make(chan string, 1024),
		logs: make(chan string, 1024), confs: make(chan ConfirmResolved, 16)}
	tcfg := tokens.Config{Store: tokens.NewMemoryStore()}
	cfg := Config{Audit: audit.New(audit.Config{Sinks: []audit.Sink{e.sink}})}
	e.sink.log = cfg.Audit
	if mod != nil {
		mod(&cfg, &tcfg)
	}
	var err error
	if e.tm, err = tokens.NewManager(tcfg); err != nil {
		t.Fatal(err)
	}
	cfg.Tokens = e.tm
	if e.reg, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	e.reg.SetHooks(Hooks{
		OnPaired: func(tid string, repair bool) {
			if repair {
				tid += " repair"
			}
			e.paired <- tid
		},
		OnClosed:          func(tid string) { e.closed <- tid },
		OnLogAppend:       func(tid string, _ json.RawMessage, _ bool) { e.logs <- tid },
		OnConfirmResolved: func(_ string, r ConfirmResolved) { e.confs <- r },
	})
	e.srv = httptest.NewServer(e.reg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := e.reg.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		e.srv.Close()
		_ = e.sink.log.Close()
	})
	return e
}

func (e *env) url() string { return "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/agent/ws" }

func (e *env) mint(uid string) (token, tid string) {
	e.t.Helper()
	tok, rec, err := e.tm.Mint(context.Background(), uid, e.srv.URL, "")
	if err != nil {
		e.t.Fatal(err)
	}
	return tok, rec.TID
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recv waits for a value on ch (or fails the test after 10s).
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting")
	}
	var zero T
	return zero
}

// tab is a minimal scripted browser tab.
type tab struct {
	t      testing.TB
	ws     *websocket.Conn
	frames chan []byte
	done   chan struct{}
	err    error // set before done closes
}

type dialOpts struct {
	header       http.Header
	subprotocols []string
	noReader     bool
}

func (e *env) dialRaw(token string, o dialOpts) (*websocket.Conn, *http.Response, error) {
	u := e.url()
	if token != "" {
		u += "?token=" + token
	}
	return websocket.Dial(ctxT(e.t), u, &websocket.DialOptions{HTTPHeader: o.header, Subprotocols: o.subprotocols})
}

// dial connects (token in the query) and starts the tab's reader.
func (e *env) dial(token string, o dialOpts) *tab {
	e.t.Helper()
	ws, _, err := e.dialRaw(token, o)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	return e.wrap(ws, o)
}

func (e *env) wrap(ws *websocket.Conn, o dialOpts) *tab {
	ws.SetReadLimit(-1)
	tb := &tab{t: e.t, ws: ws, frames: make(chan []byte, 4096), done: make(chan struct{})}
	e.t.Cleanup(func() { ws.CloseNow(); <-tb.done })
	if o.noReader {
		close(tb.done)
		return tb
	}
	go func() {
		defer close(tb.done)
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				tb.err = err
				return
			}
			tb.frames <- b
		}
	}()
	return tb
}

// pair dials and completes hello/hello-ack.
func (e *env) pair(token string) *tab {
	e.t.Helper()
	tb := e.dial(token, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "appVersion": "1", "schemaHash": "h", "lapVersion": 2})
	tb.expect("hello-ack")
	recv(e.t, e.paired)
	return tb
}

func (tb *tab) send(v any) {
	tb.t.Helper()
	b, ok := v.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			tb.t.Fatal(err)
		}
	}
	if err := tb.ws.Write(ctxT(tb.t), websocket.MessageText, b); err != nil {
		tb.t.Fatalf("send: %v", err)
	}
}

// next returns the next frame, decoded.
func (tb *tab) next() map[string]any {
	tb.t.Helper()
	select {
	case b := <-tb.frames:
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			tb.t.Fatalf("server sent non-JSON %q", b)
		}
		return m
	case <-tb.done:
		// Frames read before the socket ended come first (select picks
		// among ready cases at random).
		select {
		case b := <-tb.frames:
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				tb.t.Fatalf("server sent non-JSON %q", b)
			}
			return m
		default:
		}
		tb.t.Fatalf("socket ended: %v", tb.err)
	case <-time.After(10 * time.Second):
		tb.t.Fatal("timed out waiting for a frame")
	}
	return nil
}

// expect returns the next frame and checks its t.
func (tb *tab) expect(typ string) map[string]any {
	tb.t.Helper()
	m := tb.next()
	if m["t"] != typ {
		tb.t.Fatalf("got frame %v, want t=%q", m, typ)
	}
	return m
}

// closeStatus waits for the socket to end (draining frames) and returns the
// close code the server sent.
func (tb *tab) closeStatus() websocket.StatusCode {
	tb.t.Helper()
	for {
		select {
		case <-tb.frames:
		case <-tb.done:
			return websocket.CloseStatus(tb.err)
		case <-time.After(15 * time.Second):
			tb.t.Fatal("timed out waiting for the socket to close")
			return 0
		}
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }
