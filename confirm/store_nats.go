package confirm

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/kvrep"
)

// SharedStore is a Store that several lapd processes use at once (a
// cluster). A Manager over one follows the other processes' writes: an
// approval proposed on one node can be answered on the node that holds the
// tab, waited for on a third, and re-delivered by whichever node the tab
// reconnects to. NATSStore implements it.
type SharedStore interface {
	Store
	// Get reads one approval (pending or answered); ok false if there is
	// none.
	Get(ctx context.Context, tid, confirmID string) (p Pending, ok bool, err error)
	// Answer stores p.Outcome unless the approval already has one, with
	// compare-and-set, so that of two nodes answering at once (the human's
	// click on one, the expiry timer on another) exactly one wins. It
	// returns the outcome that stands and whether it is p's; ok false if
	// the approval is not in the store (never proposed, or dropped).
	Answer(ctx context.Context, p Pending) (stands Resolution, won, ok bool, err error)
	// Follow calls fn for every change any process makes (this one's
	// included), in order, from one goroutine, until Close. deleted: the
	// approval went (p has only TID and ConfirmID).
	Follow(fn func(p Pending, deleted bool))
}

// NATSStore keeps approvals in a JetStream key-value bucket shared by
// every lapd of a cluster: key "c.<tid>.<confirmId>" (each part as-is when
// it is made of [A-Za-z0-9_-], else base64url after "="). Each node keeps
// a replica in memory, fed by a KV watch. Safe for concurrent use.
type NATSStore struct {
	rep *kvrep.Replica[natsPending]

	mu      sync.Mutex
	follow  []func(Pending, bool)
	lastNs  int64
	closed  bool
	closeMu sync.Once
}

// natsPending is an approval as stored.
type natsPending struct {
	TID        string          `json:"tid"`
	ConfirmID  string          `json:"confirmId"`
	Variant    string          `json:"variant"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Intent     string          `json:"intent,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	ProposedAt int64           `json:"proposedAt"`
	ExpiresAt  int64           `json:"expiresAt"`
	Seq        int64           `json:"seq"`
	Outcome    *natsOutcome    `json:"outcome,omitempty"`
}

type natsOutcome struct {
	Status     string          `json:"status"`
	Reason     string          `json:"reason,omitempty"`
	StateAfter json.RawMessage `json:"stateAfter,omitempty"`
	Variant    string          `json:"variant,omitempty"`
	ResolvedAt int64           `json:"resolvedAt"`
}

func (n natsPending) pending() Pending {
	p := Pending{TID: n.TID, ConfirmID: n.ConfirmID, Variant: n.Variant, Payload: slices.Clone(n.Payload),
		Intent: n.Intent, Reason: n.Reason, ProposedAt: n.ProposedAt, ExpiresAt: n.ExpiresAt}
	if o := n.Outcome; o != nil {
		p.Outcome = &Resolution{Status: o.Status, Reason: o.Reason, StateAfter: slices.Clone(o.StateAfter), Variant: o.Variant, ResolvedAt: o.ResolvedAt}
	}
	return p
}

func toNATSPending(p Pending, seq int64) natsPending {
	n := natsPending{TID: p.TID, ConfirmID: p.ConfirmID, Variant: p.Variant, Payload: p.Payload, Intent: p.Intent,
		Reason: p.Reason, ProposedAt: p.ProposedAt, ExpiresAt: p.ExpiresAt, Seq: seq}
	if r := p.Outcome; r != nil {
		n.Outcome = &natsOutcome{Status: r.Status, Reason: r.Reason, StateAfter: r.StateAfter, Variant: r.Variant, ResolvedAt: r.ResolvedAt}
	}
	return n
}

var _ SharedStore = (*NATSStore)(nil)

// DefaultNATSBucket is the bucket OpenNATS uses for an empty name.
const DefaultNATSBucket = "lapd_confirm"

// OpenNATS opens (creating it if needed) the approvals bucket on nc's
// JetStream and loads the replica; ctx bounds the loading. The store does
// not close nc.
func OpenNATS(ctx context.Context, nc *nats.Conn, bucket string) (*NATSStore, error) {
	return OpenNATSConfig(ctx, nc, NATSConfig{Bucket: bucket})
}

// NATSConfig configures OpenNATSConfig.
type NATSConfig struct {
	Bucket string // default DefaultNATSBucket
	// Replicas of the bucket on a JetStream cluster: N > 0 creates it with
	// N or updates it to N, and fails if the servers cannot; 0 creates a
	// missing bucket with 1 and keeps an existing one's.
	Replicas int
}

// OpenNATSConfig is OpenNATS with the bucket's settings.
func OpenNATSConfig(ctx context.Context, nc *nats.Conn, cfg NATSConfig) (*NATSStore, error) {
	bucket := cfg.Bucket
	if bucket == "" {
		bucket = DefaultNATSBucket
	}
	s := &NATSStore{}
	rep, err := kvrep.Open(ctx, kvrep.Config[natsPending]{
		Conn: nc, Bucket: bucket, Prefix: "c.",
		Replicas: cfg.Replicas,
		Decode: func(_ string, b []byte) (natsPending, error) {
			var n natsPending
			err := json.Unmarshal(b, &n)
			return n, err
		},
		OnChange: s.changed,
	})
	if err != nil {
		return nil, err
	}
	s.rep = rep
	return s, nil
}

func pendingKey(tid, id string) string { return "c." + kvrep.Key(tid) + "." + kvrep.Key(id) }

// splitKey recovers tid and confirmId from a key (for deletes).
func splitKey(key string) (tid, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, "c.")
	if !ok {
		return "", "", false
	}
	a, b, ok := strings.Cut(rest, ".")
	if !ok {
		return "", "", false
	}
	return kvrep.Unkey(a), kvrep.Unkey(b), true
}

func (s *NATSStore) changed(key string, n natsPending, _ uint64, deleted bool) {
	s.mu.Lock()
	fs := s.follow
	s.mu.Unlock()
	if len(fs) == 0 {
		return
	}
	var p Pending
	if deleted {
		tid, id, ok := splitKey(key)
		if !ok {
			return
		}
		p = Pending{TID: tid, ConfirmID: id}
	} else {
		p = n.pending()
	}
	for _, f := range fs {
		f(p, deleted)
	}
}

func (s *NATSStore) seq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastNs = max(time.Now().UnixNano(), s.lastNs+1)
	return s.lastNs
}

// Put inserts or replaces p (its insertion order is kept on replace).
func (s *NATSStore) Put(ctx context.Context, p Pending) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	key := pendingKey(p.TID, p.ConfirmID)
	var seq int64
	if it, ok := s.rep.Get(key); ok {
		seq = it.V.Seq
	} else {
		seq = s.seq()
	}
	n := toNATSPending(p, seq)
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	_, err = s.rep.Put(ctx, key, b, n)
	return err
}

// Delete removes tid/confirmID; deleting a missing one is not an error.
func (s *NATSStore) Delete(ctx context.Context, tid, confirmID string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.rep.Delete(ctx, pendingKey(tid, confirmID), 0)
}

// List returns every approval the replica holds, oldest proposal first.
func (s *NATSStore) List(ctx context.Context) ([]Pending, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	var ns []natsPending
	s.rep.Range(func(_ string, it kvrep.Item[natsPending]) { ns = append(ns, it.V) })
	slices.SortFunc(ns, func(a, b natsPending) int {
		if c := cmpInt(a.ProposedAt, b.ProposedAt); c != 0 {
			return c
		}
		return cmpInt(a.Seq, b.Seq)
	})
	out := make([]Pending, len(ns))
	for i, n := range ns {
		out[i] = n.pending()
	}
	return out, nil
}

// Get reads tid/confirmID from the replica, or from the bucket when the
// replica does not hold it (yet).
func (s *NATSStore) Get(ctx context.Context, tid, confirmID string) (Pending, bool, error) {
	if err := s.check(ctx); err != nil {
		return Pending{}, false, err
	}
	it, ok, err := s.rep.Fetch(ctx, pendingKey(tid, confirmID))
	if err != nil || !ok {
		return Pending{}, false, err
	}
	return it.V.pending(), true, nil
}

// Answer stores p.Outcome with compare-and-set (see SharedStore).
func (s *NATSStore) Answer(ctx context.Context, p Pending) (Resolution, bool, bool, error) {
	if err := s.check(ctx); err != nil {
		return Resolution{}, false, false, err
	}
	if p.Outcome == nil {
		return Resolution{}, false, false, errors.New("confirm: Answer without an outcome")
	}
	key := pendingKey(p.TID, p.ConfirmID)
	it, ok, err := s.rep.Fetch(ctx, key)
	for {
		if err != nil {
			return Resolution{}, false, false, err
		}
		if !ok {
			return Resolution{}, false, false, nil
		}
		if it.V.Outcome != nil {
			return *it.V.pending().Outcome, false, true, nil
		}
		n := it.V
		n.Outcome = toNATSPending(p, 0).Outcome
		b, merr := json.Marshal(n)
		if merr != nil {
			return Resolution{}, false, false, merr
		}
		_, err = s.rep.Update(ctx, key, b, n, it.Rev)
		if err == nil {
			return *p.Outcome, true, true, nil
		}
		if !errors.Is(err, kvrep.ErrConflict) {
			return Resolution{}, false, false, err
		}
		it, ok, err = s.rep.Refresh(ctx, key)
	}
}

// Follow registers fn (see SharedStore).
func (s *NATSStore) Follow(fn func(p Pending, deleted bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.follow = append(s.follow, fn)
}

func (s *NATSStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Close stops the replica's watcher; later calls fail with ErrClosed. The
// NATS connection stays open.
func (s *NATSStore) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeMu.Do(s.rep.Close)
	return nil
}
