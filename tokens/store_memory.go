package tokens

import (
	"cmp"
	"context"
	"crypto/subtle"
	"slices"
	"sync"
)

// MemoryStore is a Store in process memory: fast, and lost on restart. Use it
// in tests and for single-process deployments that accept that every tab must
// pair again after a restart. Safe for concurrent use.
type MemoryStore struct {
	mu     sync.RWMutex
	byTID  map[string]*memRecord
	byHash map[string]string // token hash → tid
	seq    uint64            // creation counter, for ListByUID order
}

type memRecord struct {
	rec Record
	seq uint64
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{byTID: map[string]*memRecord{}, byHash: map[string]string{}}
}

// Create inserts rec; ErrExists if its tid or hash is taken.
func (s *MemoryStore) Create(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byTID[rec.TID]; ok {
		return ErrExists
	}
	if _, ok := s.byHash[rec.TokenHash]; ok {
		return ErrExists
	}
	s.seq++
	s.byTID[rec.TID] = &memRecord{rec: rec, seq: s.seq}
	s.byHash[rec.TokenHash] = rec.TID
	return nil
}

// Get returns the record for tid, or ErrNotFound.
func (s *MemoryStore) Get(ctx context.Context, tid string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.byTID[tid]
	if !ok {
		return Record{}, ErrNotFound
	}
	return m.rec, nil
}

// FindByHash returns the record whose token hash is hash, or ErrNotFound.
func (s *MemoryStore) FindByHash(ctx context.Context, hash string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	tid, ok := s.byHash[hash]
	if !ok {
		return Record{}, ErrNotFound
	}
	m := s.byTID[tid]
	if subtle.ConstantTimeCompare([]byte(m.rec.TokenHash), []byte(hash)) != 1 {
		return Record{}, ErrNotFound
	}
	return m.rec, nil
}

// Update applies fn to a copy of tid's record under the store's write lock
// and keeps the result unless fn fails. Changing TokenHash re-indexes the
// record; ErrExists if the new hash is taken. The TID cannot change.
func (s *MemoryStore) Update(ctx context.Context, tid string, fn func(*Record) error) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.byTID[tid]
	if !ok {
		return Record{}, ErrNotFound
	}
	next := m.rec
	if err := fn(&next); err != nil {
		return m.rec, err
	}
	next.TID = tid
	if next.TokenHash != m.rec.TokenHash {
		if _, taken := s.byHash[next.TokenHash]; taken {
			return m.rec, ErrExists
		}
		delete(s.byHash, m.rec.TokenHash)
		s.byHash[next.TokenHash] = tid
	}
	m.rec = next
	return next, nil
}

// ListByUID returns uid's records in creation order.
func (s *MemoryStore) ListByUID(ctx context.Context, uid string) ([]Record, error) {
	return s.list(ctx, func(r *Record) bool { return r.UID == uid })
}

// ListByStatus returns the records in any of statuses, in creation order.
func (s *MemoryStore) ListByStatus(ctx context.Context, statuses ...Status) ([]Record, error) {
	return s.list(ctx, func(r *Record) bool { return slices.Contains(statuses, r.Status) })
}

func (s *MemoryStore) list(ctx context.Context, match func(*Record) bool) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	var ms []memRecord
	for _, m := range s.byTID {
		if match(&m.rec) {
			ms = append(ms, *m)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(ms, func(a, b memRecord) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]Record, len(ms))
	for i, m := range ms {
		out[i] = m.rec
	}
	return out, nil
}

// DeleteExpired removes records whose ExpiresAt is before beforeMs.
func (s *MemoryStore) DeleteExpired(ctx context.Context, beforeMs int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for tid, m := range s.byTID {
		if m.rec.ExpiresAt < beforeMs {
			delete(s.byTID, tid)
			delete(s.byHash, m.rec.TokenHash)
			n++
		}
	}
	return n, nil
}

// Close does nothing; a MemoryStore holds no outside resources.
func (s *MemoryStore) Close() error { return nil }
