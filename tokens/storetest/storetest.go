// Package storetest is the behavioural test suite every tokens.Store must
// pass. An implementation's test calls Run with a factory that returns a
// fresh, empty store:
//
//	func TestMemoryStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) tokens.Store { return tokens.NewMemoryStore() })
//	}
//
// Run closes every store it gets.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/lapd-dev/lapd/tokens"
)

// record returns a complete record whose fields all differ from the zero value.
func record(tid, uid string, createdAt int64) tokens.Record {
	_, hash := tokens.Generate()
	_, tabHash := tokens.GenerateTabSecret()
	return tokens.Record{
		TID: tid, TokenHash: hash, UID: uid, Status: tokens.StatusActive,
		CreatedAt: createdAt, ExpiresAt: createdAt + 86_400_000, LastSeenAt: createdAt + 1,
		PendingResumeUntil: createdAt + 60_000, Origin: "https://app.example", Label: "label " + tid,
		TabHash: tabHash, Used: true,
	}
}

func mustCreate(t *testing.T, s tokens.Store, recs ...tokens.Record) {
	t.Helper()
	for _, r := range recs {
		if err := s.Create(t.Context(), r); err != nil {
			t.Fatalf("Create(%s): %v", r.TID, err)
		}
	}
}

func mustGet(t *testing.T, s tokens.Store, tid string) tokens.Record {
	t.Helper()
	r, err := s.Get(t.Context(), tid)
	if err != nil {
		t.Fatalf("Get(%s): %v", tid, err)
	}
	return r
}

func tids(recs []tokens.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.TID
	}
	return out
}

// Run runs the suite; each case gets its own store from newStore.
func Run(t *testing.T, newStore func(t *testing.T) tokens.Store) {
	open := func(t *testing.T) tokens.Store {
		s := newStore(t)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	}

	t.Run("CreateGetFind", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		want := record("t1", "alice", 1000)
		mustCreate(t, s, want)
		if got := mustGet(t, s, "t1"); got != want {
			t.Errorf("Get = %+v, want %+v", got, want)
		}
		got, err := s.FindByHash(t.Context(), want.TokenHash)
		if err != nil || got != want {
			t.Errorf("FindByHash = %+v, %v; want %+v", got, err, want)
		}
	})

	t.Run("ZeroFieldsRoundTrip", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		want := tokens.Record{TID: "anon", TokenHash: "h", Status: tokens.StatusAwaitingWS}
		mustCreate(t, s, want)
		if got := mustGet(t, s, "anon"); got != want {
			t.Errorf("Get = %+v, want %+v", got, want)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		mustCreate(t, s, record("t1", "alice", 1000))
		ctx := t.Context()
		if _, err := s.Get(ctx, "nope"); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
		}
		_, h := tokens.Generate()
		if _, err := s.FindByHash(ctx, h); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("FindByHash(unknown) = %v, want ErrNotFound", err)
		}
		called := false
		if _, err := s.Update(ctx, "nope", func(*tokens.Record) error { called = true; return nil }); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Update(unknown) = %v, want ErrNotFound", err)
		}
		if called {
			t.Error("Update(unknown) called fn")
		}
	})

	t.Run("Exists", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		a := record("t1", "alice", 1000)
		mustCreate(t, s, a)
		tests := []struct {
			name string
			rec  tokens.Record
		}{
			{"same tid", record("t1", "bob", 2000)},
			{"same hash", func() tokens.Record { r := record("t2", "bob", 2000); r.TokenHash = a.TokenHash; return r }()},
		}
		for _, tt := range tests {
			if err := s.Create(t.Context(), tt.rec); !errors.Is(err, tokens.ErrExists) {
				t.Errorf("Create(%s) = %v, want ErrExists", tt.name, err)
			}
		}
		if got := mustGet(t, s, "t1"); got != a {
			t.Errorf("after refused creates, Get = %+v, want %+v", got, a)
		}
		if _, err := s.Get(t.Context(), "t2"); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("refused record was stored: %v", err)
		}
	})

	t.Run("Update", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		mustCreate(t, s, record("t1", "alice", 1000))
		got, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error {
			r.Status = tokens.StatusPendingResume
			r.LastSeenAt = 5000
			r.TID = "ignored"
			return nil
		})
		if err != nil {
			t.Fatalf("Update: %v", err)
		}
		if got.Status != tokens.StatusPendingResume || got.LastSeenAt != 5000 || got.TID != "t1" {
			t.Errorf("Update returned %+v", got)
		}
		// Rev is only Update's answer (Get leaves it 0).
		if stored := mustGet(t, s, "t1"); stored.Rev != 0 || stored != withRev(got, 0) {
			t.Errorf("stored %+v, Update returned %+v", stored, got)
		}
		// A store that keeps revisions gives every write a higher one.
		again, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.LastSeenAt = 6000; return nil })
		if err != nil {
			t.Fatalf("Update: %v", err)
		}
		if got.Rev != 0 && again.Rev <= got.Rev || got.Rev == 0 && again.Rev != 0 {
			t.Errorf("revisions of two Updates: %d then %d, want growing (or 0 in a store without them)", got.Rev, again.Rev)
		}
	})

	t.Run("UpdateErrorLeavesRecord", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		want := record("t1", "alice", 1000)
		mustCreate(t, s, want)
		boom := errors.New("boom")
		_, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error {
			r.Status = tokens.StatusRevoked
			r.TokenHash = "changed"
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Update = %v, want fn's error", err)
		}
		if got := mustGet(t, s, "t1"); got != want {
			t.Errorf("after failed Update, Get = %+v, want %+v", got, want)
		}
		if _, err := s.FindByHash(t.Context(), want.TokenHash); err != nil {
			t.Errorf("old hash lost: %v", err)
		}
	})

	t.Run("UpdateRotatesHash", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		old := record("t1", "alice", 1000)
		other := record("t2", "alice", 1001)
		mustCreate(t, s, old, other)
		_, newHash := tokens.Generate()
		if _, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.TokenHash = newHash; return nil }); err != nil {
			t.Fatalf("Update: %v", err)
		}
		if _, err := s.FindByHash(t.Context(), old.TokenHash); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("FindByHash(old hash) = %v, want ErrNotFound", err)
		}
		if r, err := s.FindByHash(t.Context(), newHash); err != nil || r.TID != "t1" {
			t.Errorf("FindByHash(new hash) = %+v, %v", r, err)
		}
		_, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.TokenHash = other.TokenHash; return nil })
		if !errors.Is(err, tokens.ErrExists) {
			t.Errorf("Update to a taken hash = %v, want ErrExists", err)
		}
		if r := mustGet(t, s, "t1"); r.TokenHash != newHash {
			t.Errorf("hash after refused rotation = %q, want %q", r.TokenHash, newHash)
		}
	})

	t.Run("ConcurrentUpdates", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		r := record("t1", "alice", 0)
		r.LastSeenAt = 0
		mustCreate(t, s, r)
		const workers, each = 20, 10
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		for range workers {
			wg.Go(func() {
				for range each {
					_, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.LastSeenAt++; return nil })
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Update: %v", err)
		}
		if got := mustGet(t, s, "t1").LastSeenAt; got != workers*each {
			t.Errorf("LastSeenAt = %d after %d increments: writes were lost", got, workers*each)
		}
	})

	t.Run("ListByUID", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		// Creation order, not CreatedAt order, decides.
		mustCreate(t, s,
			record("a1", "alice", 3000), record("b1", "bob", 1000), record("n1", "", 1000),
			record("a2", "alice", 1000), record("a3", "alice", 2000), record("n2", "", 500))
		tests := []struct {
			uid  string
			want []string
		}{
			{"alice", []string{"a1", "a2", "a3"}},
			{"bob", []string{"b1"}},
			{"", []string{"n1", "n2"}},
			{"carol", nil},
		}
		for _, tt := range tests {
			recs, err := s.ListByUID(t.Context(), tt.uid)
			if err != nil {
				t.Fatalf("ListByUID(%q): %v", tt.uid, err)
			}
			if got := tids(recs); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("ListByUID(%q) = %v, want %v", tt.uid, got, tt.want)
			}
		}
	})

	t.Run("ListByStatus", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		with := func(r tokens.Record, st tokens.Status) tokens.Record { r.Status = st; return r }
		mustCreate(t, s,
			with(record("a", "u", 1), tokens.StatusActive), with(record("b", "u", 1), tokens.StatusRevoked),
			with(record("c", "", 1), tokens.StatusAwaitingClaude), with(record("d", "v", 1), tokens.StatusPendingResume),
			with(record("e", "", 1), tokens.StatusActive))
		tests := []struct {
			statuses []tokens.Status
			want     []string
		}{
			{[]tokens.Status{tokens.StatusActive, tokens.StatusAwaitingClaude}, []string{"a", "c", "e"}},
			{[]tokens.Status{tokens.StatusPendingResume}, []string{"d"}},
			{[]tokens.Status{tokens.StatusAwaitingWS}, nil},
			{nil, nil},
		}
		for _, tt := range tests {
			recs, err := s.ListByStatus(t.Context(), tt.statuses...)
			if err != nil {
				t.Fatalf("ListByStatus(%v): %v", tt.statuses, err)
			}
			if got := tids(recs); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("ListByStatus(%v) = %v, want %v", tt.statuses, got, tt.want)
			}
		}
	})

	t.Run("DeleteExpired", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		var recs []tokens.Record
		for i, exp := range []int64{10, 20, 30} {
			r := record(fmt.Sprint("t", i), "alice", 0)
			r.ExpiresAt = exp
			recs = append(recs, r)
		}
		mustCreate(t, s, recs...)
		n, err := s.DeleteExpired(t.Context(), 20)
		if err != nil || n != 1 {
			t.Fatalf("DeleteExpired(20) = %d, %v; want 1 (strictly before)", n, err)
		}
		if _, err := s.Get(t.Context(), "t0"); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Get(deleted) = %v, want ErrNotFound", err)
		}
		if _, err := s.FindByHash(t.Context(), recs[0].TokenHash); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("FindByHash(deleted) = %v, want ErrNotFound", err)
		}
		mustGet(t, s, "t1")
		if n, err := s.DeleteExpired(t.Context(), 1000); err != nil || n != 2 {
			t.Errorf("DeleteExpired(1000) = %d, %v; want 2", n, err)
		}
		if n, err := s.DeleteExpired(t.Context(), 1000); err != nil || n != 0 {
			t.Errorf("DeleteExpired on an empty store = %d, %v", n, err)
		}
		// A deleted record's tid and hash can be used again.
		mustCreate(t, s, recs[0])
	})

	t.Run("CancelledContext", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		r := record("t1", "alice", 1000)
		mustCreate(t, s, r)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		calls := map[string]func() error{
			"Create":        func() error { return s.Create(ctx, record("t2", "alice", 1)) },
			"Get":           func() error { _, err := s.Get(ctx, "t1"); return err },
			"FindByHash":    func() error { _, err := s.FindByHash(ctx, r.TokenHash); return err },
			"Update":        func() error { _, err := s.Update(ctx, "t1", func(*tokens.Record) error { return nil }); return err },
			"ListByUID":     func() error { _, err := s.ListByUID(ctx, "alice"); return err },
			"DeleteExpired": func() error { _, err := s.DeleteExpired(ctx, 1<<62); return err },
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, context.Canceled) {
				t.Errorf("%s with a cancelled context = %v, want context.Canceled", name, err)
			}
		}
		if got := mustGet(t, s, "t1"); got != r {
			t.Errorf("record changed by cancelled calls: %+v", got)
		}
	})
}

func withRev(r tokens.Record, rev uint64) tokens.Record { r.Rev = rev; return r }
