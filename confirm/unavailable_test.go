package confirm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// downShared is a SharedStore over a MemoryStore that fails as the NATS
// bucket fails while NATS cannot answer: writes time out, reads find no
// responders.
type downShared struct {
	*MemoryStore
	down atomic.Bool
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

func (d *downShared) Answer(context.Context, Pending) (Resolution, bool, bool, error) {
	return Resolution{}, false, false, nil
}

func (d *downShared) Follow(func(Pending, bool)) {}

// A Propose the store did not answer records nothing, and says so in a way
// storeerr.Unavailable recognises; proposing the same approval once the
// store answers records it.
func TestProposeStoreUnavailable(t *testing.T) {
	t.Parallel()
	st := &downShared{MemoryStore: NewMemoryStore()}
	m, err := New(t.Context(), Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st.down.Store(true)
	p := Pending{TID: "t1", ConfirmID: "c1", Variant: "clearAll"}
	err = m.Propose(t.Context(), p)
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
	st := &downShared{MemoryStore: NewMemoryStore()}
	m, err := New(t.Context(), Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st.down.Store(true)
	_, err = m.Wait(t.Context(), "t1", "c-elsewhere")
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
