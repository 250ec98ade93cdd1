package tokens_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lapd-dev/lapd/tokens"
)

// countingStore counts the calls that reach the store behind a cache.
type countingStore struct {
	tokens.Store
	mu                   sync.Mutex
	gets, finds, updates int
}

func (s *countingStore) Get(ctx context.Context, tid string) (tokens.Record, error) {
	s.mu.Lock()
	s.gets++
	s.mu.Unlock()
	return s.Store.Get(ctx, tid)
}

func (s *countingStore) FindByHash(ctx context.Context, h string) (tokens.Record, error) {
	s.mu.Lock()
	s.finds++
	s.mu.Unlock()
	return s.Store.FindByHash(ctx, h)
}

func (s *countingStore) Update(ctx context.Context, tid string, fn func(*tokens.Record) error) (tokens.Record, error) {
	s.mu.Lock()
	s.updates++
	s.mu.Unlock()
	return s.Store.Update(ctx, tid, fn)
}

func (s *countingStore) counts() (int, int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets, s.finds, s.updates
}

// TestCachedStoreHotPath: the LAP gate's reads and touches of one token,
// a thousand times within MaxAge, reach the store once each and write
// LastSeenAt once per FlushEvery.
func TestCachedStoreHotPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		next := &countingStore{Store: tokens.NewMemoryStore()}
		c := tokens.NewCachedStore(next, tokens.CacheConfig{MaxAge: time.Second, FlushEvery: 5 * time.Second})
		m, err := tokens.NewManager(tokens.Config{Store: c})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		tok, rec, err := m.Mint(ctx, "", "http://o", "")
		if err != nil {
			t.Fatal(err)
		}
		for range 1000 {
			if _, err := m.Verify(ctx, tok); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Get(ctx, rec.TID); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond / 2)
			if err := m.Touch(ctx, rec.TID); err != nil {
				t.Fatal(err)
			}
		}
		gets, finds, updates := next.counts()
		if gets != 0 || finds != 0 || updates != 0 {
			t.Errorf("within MaxAge the store saw %d gets, %d finds, %d updates; want none (Mint cached the record)", gets, finds, updates)
		}
		got, _ := m.Get(ctx, rec.TID)
		if want := rec.LastSeenAt + 500; got.LastSeenAt != want {
			t.Errorf("LastSeenAt read back %d, want %d", got.LastSeenAt, want)
		}
		time.Sleep(5 * time.Second) // one flush
		synctest.Wait()
		if _, _, updates := next.counts(); updates != 1 {
			t.Errorf("%d LastSeenAt writes after one FlushEvery, want 1", updates)
		}
		stored, _ := next.Store.Get(ctx, rec.TID)
		if stored.LastSeenAt != rec.LastSeenAt+500 {
			t.Errorf("stored LastSeenAt %d, want %d", stored.LastSeenAt, rec.LastSeenAt+500)
		}
		// Past MaxAge a read goes to the store again.
		time.Sleep(time.Second + time.Millisecond)
		if _, err := m.Verify(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if _, finds, _ := next.counts(); finds != 1 {
			t.Errorf("%d finds after MaxAge, want 1", finds)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCachedStoreStaleAtMostMaxAge: two caches over one store stand for two
// lapd processes on one database. A revoke through one is refused by the
// other within MaxAge, and at once after Invalidate.
func TestCachedStoreStaleAtMostMaxAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := tokens.NewMemoryStore()
		a := tokens.NewCachedStore(shared, tokens.CacheConfig{MaxAge: time.Second})
		b := tokens.NewCachedStore(nopClose{shared}, tokens.CacheConfig{MaxAge: time.Second})
		ma, _ := tokens.NewManager(tokens.Config{Store: a})
		mb, _ := tokens.NewManager(tokens.Config{Store: b})
		ctx := t.Context()
		tok, rec, _ := ma.Mint(ctx, "alice", "http://o", "")
		if _, err := mb.Verify(ctx, tok); err != nil { // b caches it
			t.Fatal(err)
		}
		if _, err := ma.Revoke(ctx, rec.TID, tokens.Owner{UID: "alice"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ma.Verify(ctx, tok); !errors.Is(err, tokens.ErrRevoked) {
			t.Errorf("the revoking process reads %v, want ErrRevoked at once", err)
		}
		if _, err := mb.Verify(ctx, tok); err != nil {
			t.Errorf("the other process within MaxAge: %v (a cached read is allowed to be stale)", err)
		}
		time.Sleep(time.Second + time.Millisecond)
		if _, err := mb.Verify(ctx, tok); !errors.Is(err, tokens.ErrRevoked) {
			t.Errorf("the other process after MaxAge reads %v, want ErrRevoked", err)
		}

		tok2, rec2, _ := ma.Mint(ctx, "alice", "http://o", "")
		if _, err := mb.Verify(ctx, tok2); err != nil {
			t.Fatal(err)
		}
		if _, err := ma.Revoke(ctx, rec2.TID, tokens.Owner{UID: "alice"}); err != nil {
			t.Fatal(err)
		}
		b.Invalidate(ctx, rec2.TID)
		if _, err := mb.Verify(ctx, tok2); !errors.Is(err, tokens.ErrRevoked) {
			t.Errorf("after Invalidate: %v, want ErrRevoked", err)
		}
		a.Close()
		b.Close()
	})
}

// TestCachedStoreCloseFlushesAndIdleEvicts: Close writes LastSeenAt kept in
// memory; records unused for IdleEvict are forgotten.
func TestCachedStoreCloseFlushesAndIdleEvicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		next := &countingStore{Store: tokens.NewMemoryStore()}
		c := tokens.NewCachedStore(nopClose{next}, tokens.CacheConfig{FlushEvery: time.Minute, IdleEvict: 10 * time.Minute})
		m, _ := tokens.NewManager(tokens.Config{Store: c})
		ctx := t.Context()
		_, rec, _ := m.Mint(ctx, "", "http://o", "")
		_, idle, _ := m.Mint(ctx, "", "http://o", "")
		time.Sleep(time.Second)
		_ = m.Touch(ctx, rec.TID)
		time.Sleep(11 * time.Minute) // flushes every minute; idle goes
		synctest.Wait()
		gets, _, _ := next.counts()
		if _, err := c.Get(ctx, idle.TID); err != nil {
			t.Fatal(err)
		}
		if g, _, _ := next.counts(); g != gets+1 {
			t.Errorf("an idle record was still cached after IdleEvict")
		}
		_ = m.Touch(ctx, rec.TID) // pending again
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		stored, _ := next.Store.Get(ctx, rec.TID)
		if stored.LastSeenAt != m.Now() {
			t.Errorf("after Close the store has LastSeenAt %d, want %d", stored.LastSeenAt, m.Now())
		}
	})
}

// nopClose keeps Close from closing a store shared by two caches.
type nopClose struct{ tokens.Store }

func (nopClose) Close() error { return nil }
