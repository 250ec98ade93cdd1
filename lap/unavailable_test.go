package lap_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/lap"
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
	} {
		if got := tokens.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
