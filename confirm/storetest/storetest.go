// Package storetest is the behavioural test suite every confirm.Store must
// pass. An implementation's test calls Run with a factory that returns a
// fresh, empty store:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) confirm.Store { return confirm.NewMemoryStore() })
//	}
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/lapd-dev/lapd/confirm"
)

// Factory returns a fresh, empty store. Run closes it.
type Factory func(t *testing.T) confirm.Store

func pending(tid, id string, at int64) confirm.Pending {
	return confirm.Pending{
		TID: tid, ConfirmID: id, Variant: "clearAll",
		Payload: json.RawMessage(`{"all":true}`), Intent: "Delete every task", Reason: "user asked",
		ProposedAt: at, ExpiresAt: at + 600_000,
	}
}

func equal(a, b confirm.Pending) bool {
	return a.TID == b.TID && a.ConfirmID == b.ConfirmID && a.Variant == b.Variant &&
		string(a.Payload) == string(b.Payload) && a.Intent == b.Intent && a.Reason == b.Reason &&
		a.ProposedAt == b.ProposedAt && a.ExpiresAt == b.ExpiresAt
}

func list(t *testing.T, s confirm.Store) []confirm.Pending {
	t.Helper()
	ps, err := s.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return ps
}

// Run runs the suite; each case gets its own store from newStore.
func Run(t *testing.T, newStore Factory) {
	open := func(t *testing.T) confirm.Store {
		s := newStore(t)
		t.Cleanup(func() { s.Close() })
		return s
	}

	t.Run("EmptyList", func(t *testing.T) {
		t.Parallel()
		if ps := list(t, open(t)); len(ps) != 0 {
			t.Fatalf("List on a new store = %v, want empty", ps)
		}
	})

	t.Run("PutListRoundTrip", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		want := pending("t1", "c1", 1000)
		if err := s.Put(t.Context(), want); err != nil {
			t.Fatalf("Put: %v", err)
		}
		ps := list(t, s)
		if len(ps) != 1 || !equal(ps[0], want) {
			t.Fatalf("List = %+v, want [%+v]", ps, want)
		}
	})

	t.Run("EmptyOptionalFields", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		want := confirm.Pending{TID: "t", ConfirmID: "c", Variant: "v", ProposedAt: 1, ExpiresAt: 2}
		if err := s.Put(t.Context(), want); err != nil {
			t.Fatalf("Put: %v", err)
		}
		ps := list(t, s)
		if len(ps) != 1 || !equal(ps[0], want) || ps[0].Payload != nil {
			t.Fatalf("List = %+v, want [%+v] with nil payload", ps, want)
		}
	})

	t.Run("AnswerRoundTrip", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		p := pending("t1", "c1", 1000)
		if err := s.Put(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		p.Outcome = &confirm.Resolution{Status: "confirmed", StateAfter: json.RawMessage(`{"n":1}`), Variant: "clearAll", ResolvedAt: 2000}
		if err := s.Put(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		ps := list(t, s)
		if len(ps) != 1 || !equal(ps[0], p) || ps[0].Outcome == nil {
			t.Fatalf("List = %+v, want the answered approval", ps)
		}
		if got := *ps[0].Outcome; got.Status != "confirmed" || string(got.StateAfter) != `{"n":1}` || got.Variant != "clearAll" || got.ResolvedAt != 2000 || got.Reason != "" {
			t.Fatalf("Outcome = %+v", got)
		}
		r := pending("t1", "c2", 1000)
		r.Outcome = &confirm.Resolution{Status: "rejected", Reason: "timeout", ResolvedAt: 3000}
		if err := s.Put(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		ps = list(t, s)
		if len(ps) != 2 || ps[1].Outcome == nil || ps[1].Outcome.Reason != "timeout" || ps[1].Outcome.StateAfter != nil {
			t.Fatalf("List = %+v", ps)
		}
		if ps[0].Outcome == ps[1].Outcome {
			t.Fatal("List shares Outcome values")
		}
	})

	t.Run("PutReplaces", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		p := pending("t1", "c1", 1000)
		if err := s.Put(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		p.Intent = "changed"
		if err := s.Put(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		ps := list(t, s)
		if len(ps) != 1 || ps[0].Intent != "changed" {
			t.Fatalf("List after replace = %+v, want one entry with the new intent", ps)
		}
	})

	t.Run("OrderOldestFirst", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		in := []confirm.Pending{pending("a", "3", 30), pending("b", "1", 10), pending("a", "2", 20), pending("a", "2b", 20)}
		for _, p := range in {
			if err := s.Put(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, p := range list(t, s) {
			got = append(got, p.ConfirmID)
		}
		if want := "[1 2 2b 3]"; fmt.Sprint(got) != want {
			t.Fatalf("order = %v, want %s (ProposedAt, then insertion)", got, want)
		}
	})

	t.Run("SameIDDifferentTID", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		for _, tid := range []string{"t1", "t2"} {
			if err := s.Put(t.Context(), pending(tid, "c", 1)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Delete(t.Context(), "t1", "c"); err != nil {
			t.Fatal(err)
		}
		ps := list(t, s)
		if len(ps) != 1 || ps[0].TID != "t2" {
			t.Fatalf("List = %+v, want only t2's approval", ps)
		}
	})

	t.Run("DeleteMissingIsNotAnError", func(t *testing.T) {
		t.Parallel()
		if err := open(t).Delete(t.Context(), "nope", "nope"); err != nil {
			t.Fatalf("Delete of a missing approval: %v", err)
		}
	})

	t.Run("CanceledContext", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := s.Put(ctx, pending("t", "c", 1)); err == nil {
			t.Fatal("Put with a canceled context succeeded")
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		s := open(t)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for j := range 10 {
					id := fmt.Sprintf("c%d-%d", i, j)
					if err := s.Put(context.Background(), pending("t", id, int64(j))); err != nil {
						t.Error(err)
						return
					}
					if j%2 == 0 {
						if err := s.Delete(context.Background(), "t", id); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		wg.Wait()
		if n := len(list(t, s)); n != 40 {
			t.Fatalf("after concurrent puts/deletes List has %d, want 40", n)
		}
	})
}
