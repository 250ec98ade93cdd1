package confirm

import (
	"context"
	"slices"
	"sync"
)

// MemoryStore is a Store that keeps approvals (pending and answered) in
// memory: they are lost when the process exits. Safe for concurrent use.
type MemoryStore struct {
	mu     sync.Mutex
	seq    uint64
	rows   map[key]memRow
	closed bool
}

type memRow struct {
	p   Pending
	seq uint64
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{rows: make(map[key]memRow)} }

// Put inserts or replaces p.
func (s *MemoryStore) Put(ctx context.Context, p Pending) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	k := key{p.TID, p.ConfirmID}
	seq := s.rows[k].seq
	if seq == 0 {
		s.seq++
		seq = s.seq
	}
	s.rows[k] = memRow{p: clonePending(p), seq: seq}
	return nil
}

// Delete removes tid/confirmID; deleting a missing one is not an error.
func (s *MemoryStore) Delete(ctx context.Context, tid, confirmID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	delete(s.rows, key{tid, confirmID})
	return nil
}

// List returns every pending approval, oldest proposal first.
func (s *MemoryStore) List(ctx context.Context) ([]Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	rows := make([]memRow, 0, len(s.rows))
	for _, r := range s.rows {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b memRow) int {
		if c := cmpInt(a.p.ProposedAt, b.p.ProposedAt); c != 0 {
			return c
		}
		return cmpInt(a.seq, b.seq)
	})
	out := make([]Pending, len(rows))
	for i, r := range rows {
		out[i] = clonePending(r.p)
	}
	return out, nil
}

func clonePending(p Pending) Pending {
	p.Payload = slices.Clone(p.Payload)
	if p.Outcome != nil {
		r := *p.Outcome
		r.StateAfter = slices.Clone(r.StateAfter)
		p.Outcome = &r
	}
	return p
}

// Close makes later calls fail with ErrClosed.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
