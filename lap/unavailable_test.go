package lap_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lapd-dev/lapd/internal/syncbuf"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

// downStore fails as a token store on NATS fails while JetStream elects a
// stream leader: no responders, or a request that times out.
type downStore struct {
	tokens.Store
	down atomic.Bool
}

func (d *downStore) Create(ctx context.Context, rec tokens.Record) error {
	if d.down.Load() {
		return fmt.Errorf("kv create: %w", nats.ErrNoResponders)
	}
	return d.Store.Create(ctx, rec)
}

func (d *downStore) FindByHash(ctx context.Context, hash string) (tokens.Record, error) {
	if d.down.Load() {
		return tokens.Record{}, fmt.Errorf("kv get: %w", context.DeadlineExceeded)
	}
	return d.Store.FindByHash(ctx, hash)
}

// A token store that does not answer is a 503 unavailable with
// Retry-After (retry in a few seconds), not a 500: for mint and for the
// gate's token check; once it answers again, so does lapd.
func TestTokenStoreUnavailable(t *testing.T) {
	t.Parallel()
	var ds *downStore
	e := newEnv(t, func(c *envCfg) {
		c.wrapStore = func(s tokens.Store) tokens.Store { ds = &downStore{Store: s}; return ds }
	})
	token, _ := e.mint()
	ds.down.Store(true)
	r := e.do("POST", "/agent/mint", "", "")
	if r.status != 503 || r.code() != lap.CodeUnavailable || r.header.Get("Retry-After") != "2" {
		t.Fatalf("mint with the store down = %d %s (Retry-After %q), want 503 unavailable, Retry-After 2", r.status, r.body, r.header.Get("Retry-After"))
	}
	r = e.lapCall(token, "/observe", "{}")
	if r.status != 503 || r.code() != lap.CodeUnavailable {
		t.Fatalf("a call whose token check finds the store down = %d %s, want 503 unavailable", r.status, r.body)
	}
	ds.down.Store(false)
	if token, _ := e.mint(); token == "" {
		t.Fatal("mint after the store came back")
	}
}

func TestUnavailableClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{tokens.ErrNotFound, false},
		{fmt.Errorf("x: %w", nats.ErrNoResponders), true},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{nats.ErrConnectionClosed, true},
		{fmt.Errorf("disk full"), false},
		// The approvals store fails the same way on NATS; its refusals
		// are not "unavailable".
		{fmt.Errorf("confirm: persist approval: %w", nats.ErrTimeout), true},
		{fmt.Errorf("confirm: read approval c-1 from the shared store: %w", nats.ErrNoResponders), true},
		{confirm.ErrDuplicate, false},
		{fmt.Errorf("%w (limit 1000)", confirm.ErrTooManyPending), false},
		{confirm.ErrUnknown, false},
		{confirm.ErrClosed, false},
	} {
		if got := tokens.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// downConfirmStore fails as the approvals bucket fails while NATS cannot
// answer. As a SharedStore (shared true) it also serves Get, the read a
// node makes for an approval it does not hold.
type downConfirmStore struct {
	*confirm.MemoryStore
	down atomic.Bool
}

func (d *downConfirmStore) Put(ctx context.Context, p confirm.Pending) error {
	if d.down.Load() {
		return fmt.Errorf("kv put: %w", nats.ErrTimeout)
	}
	return d.MemoryStore.Put(ctx, p)
}

// sharedDownStore is downConfirmStore as a cluster's shared store.
type sharedDownStore struct{ *downConfirmStore }

func (s sharedDownStore) Get(ctx context.Context, tid, id string) (confirm.Pending, bool, error) {
	if s.down.Load() {
		return confirm.Pending{}, false, fmt.Errorf("kv get: %w", nats.ErrNoResponders)
	}
	ps, err := s.List(ctx)
	for _, p := range ps {
		if p.TID == tid && p.ConfirmID == id {
			return p, true, err
		}
	}
	return confirm.Pending{}, false, err
}

func (s sharedDownStore) Answer(context.Context, confirm.Pending) (confirm.Resolution, bool, bool, error) {
	return confirm.Resolution{}, false, false, nil
}

func (s sharedDownStore) Follow(func(confirm.Pending, bool)) {}

func wantUnavailable(t *testing.T, r resp, what string) {
	t.Helper()
	if r.status != 503 || r.code() != lap.CodeUnavailable || r.header.Get("Retry-After") != "2" || r.json(t)["error"].(map[string]any)["retryAfterMs"] != 2000.0 {
		t.Fatalf("%s = %d %s (Retry-After %q), want 503 unavailable, retryAfterMs 2000, Retry-After 2", what, r.status, r.body, r.header.Get("Retry-After"))
	}
}

// An approval lapd could not record because the approvals store did not
// answer is a 503 unavailable (not 500), taken back from the tab
// (confirm-expire, reason unavailable) and recorded nowhere; the retry the
// 503 asks for (same idempotencyKey: the tab answers the same confirmId
// from its memory, without showing it again) records it and shows it to
// the human again (confirm-sync), who can then approve it.
func TestProposeStoreUnavailable(t *testing.T) {
	t.Parallel()
	ds := &downConfirmStore{MemoryStore: confirm.NewMemoryStore()}
	e := newEnv(t, func(c *envCfg) { c.conf.Store = ds })
	token, tid, tab := e.paired(lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	ds.down.Store(true)
	body := `{"msg":{"type":"clearAll"},"idempotencyKey":"k1","approvalTimeoutMs":0}`
	wantUnavailable(t, e.lapCall(token, "/message", body), "/message whose approval the store could not record")
	f, err := tab.WaitFor(ctxT(t), "confirm-expire")
	if err != nil {
		t.Fatal(err)
	}
	var exp struct{ ConfirmID, Reason string }
	_ = json.Unmarshal(f.Raw, &exp)
	if exp.ConfirmID == "" || exp.Reason != lap.CodeUnavailable {
		t.Fatalf("confirm-expire %s, want the approval's id with reason unavailable", f.Raw)
	}
	if p := e.cm.PendingFor(tid); len(p) != 0 {
		t.Errorf("pending after the failed proposal: %+v", p)
	}
	if ps, _ := ds.List(context.Background()); len(ps) != 0 {
		t.Errorf("stored after the failed proposal: %+v", ps)
	}
	if n := len(e.sink.events(audit.EventConfirmProposed)); n != 0 {
		t.Errorf("%d confirm-proposed audited for an approval never recorded", n)
	}

	ds.down.Store(false)
	r := e.lapCall(token, "/message", body)
	if r.status != 200 || r.json(t)["status"] != "pending-confirmation" || r.json(t)["confirmId"] != exp.ConfirmID {
		t.Fatalf("retry = %d %s, want pending-confirmation for %s", r.status, r.body, exp.ConfirmID)
	}
	if f, err := tab.WaitFor(ctxT(t), "confirm-sync"); err != nil || !strings.Contains(string(f.Raw), exp.ConfirmID) {
		t.Fatalf("the retried approval was not shown again: %s %v", f.Raw, err)
	}
	if got := tab.PendingConfirms(); len(got) != 1 || got[0] != exp.ConfirmID {
		t.Fatalf("the tab shows %v, want [%s]", got, exp.ConfirmID)
	}
	if err := tab.Approve(ctxT(t), exp.ConfirmID); err != nil {
		t.Fatal(err)
	}
	r = e.lapCall(token, "/confirm-result", `{"confirmId":"`+exp.ConfirmID+`","timeoutMs":5000}`)
	if r.status != 200 || r.json(t)["status"] != "confirmed" {
		t.Fatalf("confirm-result after approving = %d %s, want confirmed", r.status, r.body)
	}
}

// A confirm-result poll for an approval this node does not hold reads the
// cluster's store; when the store does not answer, that is 503
// unavailable, not 400 "unknown confirmId" (the id may well exist).
func TestConfirmResultStoreUnavailable(t *testing.T) {
	t.Parallel()
	ds := &downConfirmStore{MemoryStore: confirm.NewMemoryStore()}
	e := newEnv(t, func(c *envCfg) { c.conf.Store = sharedDownStore{ds} })
	token, _, _ := e.paired(lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	ds.down.Store(true)
	wantUnavailable(t, e.lapCall(token, "/confirm-result", `{"confirmId":"c-elsewhere","timeoutMs":5000}`), "confirm-result with the store down")
	ds.down.Store(false)
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"c-elsewhere","timeoutMs":5000}`); r.status != 400 || r.code() != lap.CodeInvalid {
		t.Fatalf("confirm-result of an id the store does not hold = %d %s, want 400 invalid", r.status, r.body)
	}
}

// fullStore fails as the SQLite token store fails on a full disk.
type fullStore struct{ tokens.Store }

func (fullStore) Create(context.Context, tokens.Record) error {
	return errors.New("tokens: insert: database or disk is full (13)")
}

// A store that fails for good (disk full, read-only, corrupt) answers 500
// internal, and the log says why: an operator whose disk filled up saw
// "mint failed" answers and not one log line.
func TestStoreFailureIsLogged(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	e := newEnv(t, func(c *envCfg) {
		c.wrapStore = func(s tokens.Store) tokens.Store { return fullStore{s} }
		c.lap.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	r := e.do("POST", "/agent/mint", "", "")
	if r.status != 500 || r.code() != lap.CodeInternal {
		t.Fatalf("mint on a full disk = %d %s, want 500 internal", r.status, r.body)
	}
	if strings.Contains(string(r.body), "disk") {
		t.Errorf("the store's own error reached the caller: %s", r.body)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "database or disk is full") || !strings.Contains(l, "/agent/mint") {
		t.Errorf("log after a failed mint:\n%s\nwant an ERROR line with the endpoint and the store's error", l)
	}
}
