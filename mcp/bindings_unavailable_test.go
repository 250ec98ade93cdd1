package mcp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// fakeShared is a SharedBindings in memory (another node's view of the
// cluster's bucket) that fails, while down > 0, as the NATS bucket fails
// while NATS cannot answer; each failing call counts down once (down < 0:
// for ever). fail, if set, is returned by Put instead (a refusal).
type fakeShared struct {
	mu    sync.Mutex
	m     map[string][2]string
	down  int
	fail  error
	calls map[string]int
}

func newFakeShared() *fakeShared {
	return &fakeShared{m: map[string][2]string{}, calls: map[string]int{}}
}

func (f *fakeShared) setDown(n int) { f.mu.Lock(); f.down = n; f.mu.Unlock() }

func (f *fakeShared) count(op string) int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls[op] }

// failing counts op and reports whether it fails (f.mu held).
func (f *fakeShared) failing(op string) error {
	f.calls[op]++
	if f.down == 0 {
		return nil
	}
	if f.down > 0 {
		f.down--
	}
	return fmt.Errorf("kv %s: %w", op, nats.ErrNoResponders)
}

func (f *fakeShared) Put(_ context.Context, handle, base, token string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("put"); err != nil {
		return err
	}
	if f.fail != nil {
		return f.fail
	}
	f.m[handle] = [2]string{base, token}
	return nil
}

func (f *fakeShared) Get(_ context.Context, handle string) (string, string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("get"); err != nil {
		return "", "", false, err
	}
	v, ok := f.m[handle]
	return v[0], v[1], ok, nil
}

func (f *fakeShared) Delete(_ context.Context, handle string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("delete"); err != nil {
		return err
	}
	delete(f.m, handle)
	return nil
}

// seed binds handle as another node would.
func (f *fakeShared) seed(handle, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[handle] = [2]string{base, token}
}

func (f *fakeShared) has(handle string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.m[handle]
	return ok
}

// The bindings table says when the cluster's store did not answer
// (ErrBindingsUnavailable, recognised by storeerr.Unavailable) instead of
// binding a handle that works on this node only, or calling a handle bound
// elsewhere unknown; a refusal (not a timeout) is treated as before.
func TestBindingsSharedUnavailable(t *testing.T) {
	t.Parallel()
	sh := newFakeShared()
	tbl := NewBindings(BindingsConfig{Shared: sh})

	sh.setDown(1)
	_, err := tbl.Bind("", base, tokA)
	if !errors.Is(err, ErrBindingsUnavailable) || !storeerr.Unavailable(err) {
		t.Fatalf("Bind with the store down = %v, want ErrBindingsUnavailable", err)
	}
	if tbl.Len() != 0 {
		t.Fatalf("Bind with the store down left %d bindings here", tbl.Len())
	}

	sh.seed("s_elsewhere", tokB) // bound on another node
	sh.setDown(1)
	if _, _, err := tbl.Resolve("", "s_elsewhere"); !errors.Is(err, ErrBindingsUnavailable) || errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Resolve with the store down = %v, want ErrBindingsUnavailable, not unknown", err)
	}
	b, _, err := tbl.Resolve("", "s_elsewhere")
	if err != nil || b.Token != tokB {
		t.Fatalf("Resolve once the store answers = %+v, %v", b, err)
	}

	sh.setDown(1)
	if _, err := tbl.Remove("s_elsewhere"); !errors.Is(err, ErrBindingsUnavailable) {
		t.Fatalf("Remove with the store down = %v, want ErrBindingsUnavailable", err)
	}
	if !sh.has("s_elsewhere") {
		t.Fatal("the fake deleted while down")
	}
	if _, _, err := tbl.Resolve("", "s_elsewhere"); err != nil { // adopted back
		t.Fatal(err)
	}
	if ok, err := tbl.Remove("s_elsewhere"); !ok || err != nil || sh.has("s_elsewhere") {
		t.Fatalf("Remove again = %v, %v (still shared: %v)", ok, err, sh.has("s_elsewhere"))
	}

	sh.mu.Lock()
	sh.fail = errors.New("nats: permissions violation") // a refusal, not a timeout
	sh.mu.Unlock()
	if _, err := tbl.Bind("", base, tokA); err != nil {
		t.Fatalf("Bind with the store refusing = %v, want the local binding as before", err)
	}
}

// connect_session waits and retries while the cluster's bindings store
// does not answer, as LAP's 503 unavailable is retried; once the retries
// are spent it is an unavailable tool error with the same shape (retry in
// 2 s), and nothing is left bound or called.
func TestConnectBindingsUnavailable(t *testing.T) {
	t.Parallel()
	sh := newFakeShared()
	h := newHarness(t, func(c *Config) { c.Bindings.Shared = sh; c.MaxRetries = 3 })
	sh.setDown(1)
	s := h.connect(tokA)
	if w := h.after.got(); len(w) != 1 || w[0] != 2*time.Second {
		t.Fatalf("waits %v, want one of 2 s", w)
	}
	if !sh.has(s) {
		t.Fatal("the handle is not in the shared store")
	}

	sh.setDown(-1)
	out := h.call("connect_session", map[string]any{"url": base, "token": tokB})
	wantError(t, out, "unavailable", "temporary", "retry in 2 s")
	if e := out.SC["error"].(map[string]any); e["retryAfterMs"] != 2000.0 {
		t.Fatalf("error %v, want retryAfterMs 2000", e)
	}
	if n := sh.count("put"); n != 1+1+4 { // the first connect's two, then 1 + MaxRetries
		t.Fatalf("%d puts, want 6 (retries bounded by MaxRetries)", n)
	}
	if n := len(h.lap.callsTo("/observe")); n != 1 {
		t.Fatalf("%d /observe calls, want only the first connect's", n)
	}
	if n := h.exec.Bindings().Len(); n != 1 {
		t.Fatalf("%d bindings, want only the first connect's", n)
	}
}

// A tool call whose handle was bound on another node waits for the
// cluster's bindings store like a LAP 503 unavailable; if it never
// answers, the call fails unavailable, not "unknown session".
func TestResolveBindingsUnavailable(t *testing.T) {
	t.Parallel()
	sh := newFakeShared()
	h := newHarness(t, func(c *Config) { c.Bindings.Shared = sh; c.MaxRetries = 2 })
	sh.seed("s_elsewhere", tokA)
	sh.setDown(1)
	if out := h.call("list_actions", map[string]any{"session": "s_elsewhere"}); out.IsError {
		t.Fatal(out.Text)
	}
	if w := h.after.got(); len(w) != 1 || w[0] != 2*time.Second {
		t.Fatalf("waits %v, want one of 2 s", w)
	}
	sh.seed("s_other", tokB)
	sh.setDown(-1)
	wantError(t, h.call("list_actions", map[string]any{"session": "s_other"}), "unavailable", "retry in 2 s")
	if n := len(h.lap.callsTo("/actions")); n != 1 {
		t.Fatalf("%d /actions calls, want the first only", n)
	}
}

// disconnect_session whose delete the cluster's store did not take tries
// again (the handle adopted back from the store) until the handle is gone
// there too: it must not keep working on the other nodes.
func TestDisconnectBindingsUnavailable(t *testing.T) {
	t.Parallel()
	sh := newFakeShared()
	h := newHarness(t, func(c *Config) { c.Bindings.Shared = sh })
	s := h.connect(tokA)
	sh.setDown(1)
	out := h.call("disconnect_session", nil) // the caller's only binding, not named
	if out.IsError || out.SC["status"] != "disconnected" || out.SC["session"] != s {
		t.Fatalf("disconnect = %s %v", out.Text, out.SC)
	}
	if sh.has(s) {
		t.Fatal("the handle is still in the cluster's store")
	}
	if w := h.after.got(); len(w) != 1 || w[0] != 2*time.Second {
		t.Fatalf("waits %v, want one of 2 s", w)
	}
	if n := sh.count("delete"); n != 2 {
		t.Fatalf("%d deletes, want 2 (one failed, one retried)", n)
	}
}
