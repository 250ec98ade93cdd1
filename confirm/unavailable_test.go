package confirm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// downShared is a SharedStore over a MemoryStore that fails as the NATS
// bucket fails while NATS cannot answer: writes time out, reads find no
// responders.
type downShared struct {
	*MemoryStore
	down       atomic.Bool
	answerDown atomic.Int32 // Answer calls still to fail
	answers    atomic.Int32 // Answer calls made
}

func (d *downShared) Put(ctx context.Context, p Pending) error {
	if d.down.Load() {
		return fmt.Errorf("kv put: %w", nats.ErrTimeout)
	}
	return d.MemoryStore.Put(ctx, p)
}

func (d *downShared) Get(ctx context.Context, tid, id string) (Pending, bool, error) {
	if d.down.Load() {
		return Pending{}, false, fmt.Errorf("kv get: %w", nats.ErrNoResponders)
	}
	ps, err := d.List(ctx)
	for _, p := range ps {
		if p.TID == tid && p.ConfirmID == id {
			return p, true, err
		}
	}
	return Pending{}, false, err
}

// Answer fails while answerDown > 0 (counting down), else stores the
// outcome unless one is stored (first wins, as NATSStore's compare-and-set).
func (d *downShared) Answer(ctx context.Context, p Pending) (Resolution, bool, bool, error) {
	d.answers.Add(1)
	if d.answerDown.Load() > 0 {
		d.answerDown.Add(-1)
		return Resolution{}, false, false, fmt.Errorf("kv update: %w", nats.ErrTimeout)
	}
	cur, ok, err := d.Get(ctx, p.TID, p.ConfirmID)
	if err != nil || !ok {
		return Resolution{}, false, false, err
	}
	if cur.Outcome != nil {
		return *cur.Outcome, false, true, nil
	}
	return *p.Outcome, true, true, d.MemoryStore.Put(ctx, p)
}

func (d *downShared) Follow(func(Pending, bool)) {}

// newDown is a Manager on a downShared store (answering, to begin with).
// The caller closes it.
func newDown(t *testing.T) (*Manager, *downShared) {
	t.Helper()
	st := &downShared{MemoryStore: NewMemoryStore()}
	m, err := New(t.Context(), Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return m, st
}

// A Propose the store did not answer records nothing, and says so in a way
// storeerr.Unavailable recognises; proposing the same approval once the
// store answers records it.
func TestProposeStoreUnavailable(t *testing.T) {
	t.Parallel()
	m, st := newDown(t)
	defer m.Close()
	st.down.Store(true)
	p := Pending{TID: "t1", ConfirmID: "c1", Variant: "clearAll"}
	err := m.Propose(t.Context(), p)
	if !storeerr.Unavailable(err) {
		t.Fatalf("Propose with the store down = %v, want an error storeerr.Unavailable recognises", err)
	}
	if got := m.PendingFor("t1"); len(got) != 0 || m.Stats().Pending != 0 || m.Stats().PendingBytes != 0 {
		t.Fatalf("after a failed Propose: pending %+v, stats %+v", got, m.Stats())
	}
	st.down.Store(false)
	if err := m.Propose(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if got := m.PendingFor("t1"); len(got) != 1 {
		t.Fatalf("pending %+v after the retry", got)
	}
}

// Wait for an id this node does not hold reads the shared store: when the
// store does not answer, Wait says so instead of ErrUnknown; when it
// answers that there is no such id, ErrUnknown.
func TestWaitStoreUnavailable(t *testing.T) {
	t.Parallel()
	m, st := newDown(t)
	defer m.Close()
	st.down.Store(true)
	_, err := m.Wait(t.Context(), "t1", "c-elsewhere")
	if !storeerr.Unavailable(err) || errors.Is(err, ErrUnknown) {
		t.Fatalf("Wait with the store down = %v, want the store's error, not ErrUnknown", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := m.Wait(ctx, "t1", "c-elsewhere"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("Wait with its ctx done and the store down = %v, want ErrUnknown (as before: the caller's ctx ended, not the store)", err)
	}
	st.down.Store(false)
	if _, err := m.Wait(t.Context(), "t1", "c-elsewhere"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("Wait for an id the store does not hold = %v, want ErrUnknown", err)
	}
}

// An answer this node recorded while the shared store did not answer (the
// human's click, on the node that holds the tab) is sent to the store again
// every 2 s until it lands, so the other nodes learn it instead of seeing
// the approval expire; Close ends the retries.
func TestAnswerSentAgainWhenStoreUnavailable(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		m, st := newDown(t)
		if err := m.Propose(t.Context(), Pending{TID: "t1", ConfirmID: "c1", Variant: "clearAll"}); err != nil {
			t.Fatal(err)
		}
		st.answerDown.Store(2)
		if _, was := m.Resolve(t.Context(), "t1", "c1", Resolution{Status: StatusConfirmed}); !was {
			t.Fatal("Resolve: not pending")
		}
		if r, err := m.Wait(t.Context(), "t1", "c1"); err != nil || r.Status != StatusConfirmed {
			t.Fatalf("this node's answer = %+v, %v", r, err)
		}
		stored := func() *Resolution {
			p, _, _ := st.Get(t.Context(), "t1", "c1")
			return p.Outcome
		}
		if o := stored(); o != nil || st.answers.Load() != 1 {
			t.Fatalf("stored %+v after %d Answer calls, want nothing after 1", o, st.answers.Load())
		}
		time.Sleep(answerRetry)
		synctest.Wait()
		if o := stored(); o != nil || st.answers.Load() != 2 {
			t.Fatalf("stored %+v after %d Answer calls, want nothing after 2 (the store is still down)", o, st.answers.Load())
		}
		time.Sleep(answerRetry)
		synctest.Wait()
		if o := stored(); o == nil || o.Status != StatusConfirmed || st.answers.Load() != 3 {
			t.Fatalf("stored %+v after %d Answer calls, want confirmed after 3", o, st.answers.Load())
		}

		// A retry pending at Close is not made.
		if err := m.Propose(t.Context(), Pending{TID: "t1", ConfirmID: "c2", Variant: "clearAll"}); err != nil {
			t.Fatal(err)
		}
		st.answerDown.Store(100)
		m.Resolve(t.Context(), "t1", "c2", Resolution{Status: StatusRejected, Reason: ReasonUserCancelled})
		n := st.answers.Load()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * answerRetry)
		synctest.Wait()
		if st.answers.Load() != n {
			t.Fatalf("%d Answer calls after Close, want none", st.answers.Load()-n)
		}
	})
}
