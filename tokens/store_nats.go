package tokens

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/kvrep"
)

// NATSStore keeps records in a JetStream key-value bucket that every lapd
// of a cluster shares (lapd serve --nats). Key "t.<tid>" holds a record;
// key "h.<token hash>" holds its tid and exists only so that two nodes can
// never take the same hash (Create on it is the uniqueness check).
//
// Each node keeps a replica of the records in memory (a KV watch feeds it),
// so Get, FindByHash and the lists answer without a network round trip; a
// record the replica does not hold yet (created on another node a moment
// ago) is read from the bucket. Update is compare-and-set on the record's
// revision and retries on a conflict, so two nodes that race (claim, rotate,
// revoke) never lose a write. A record another node changed is seen here
// after the watch delivers it (about a millisecond on a LAN); until then
// Get may return the previous version — which is also why tokens.CachedStore
// is not needed in front of it. Creation order (ListByUID) is the order of
// a node-clock timestamp taken at Create. Safe for concurrent use.
type NATSStore struct {
	rep *kvrep.Replica[natsRecord]

	mu     sync.Mutex
	lastNs int64
	closed bool
}

// natsRecord is a record as stored: every field, hashes included.
type natsRecord struct {
	TID                string `json:"tid"`
	TokenHash          string `json:"hash"`
	UID                string `json:"uid,omitempty"`
	Status             Status `json:"status"`
	CreatedAt          int64  `json:"createdAt,omitempty"`
	ExpiresAt          int64  `json:"expiresAt,omitempty"`
	LastSeenAt         int64  `json:"lastSeenAt,omitempty"`
	PendingResumeUntil int64  `json:"pendingResumeUntil,omitempty"`
	Origin             string `json:"origin,omitempty"`
	Label              string `json:"label,omitempty"`
	TabHash            string `json:"tabHash,omitempty"`
	Used               bool   `json:"used,omitempty"`
	Seq                int64  `json:"seq"` // creation order
}

func (n natsRecord) record() Record {
	return Record{TID: n.TID, TokenHash: n.TokenHash, UID: n.UID, Status: n.Status, CreatedAt: n.CreatedAt,
		ExpiresAt: n.ExpiresAt, LastSeenAt: n.LastSeenAt, PendingResumeUntil: n.PendingResumeUntil,
		Origin: n.Origin, Label: n.Label, TabHash: n.TabHash, Used: n.Used}
}

func toNATS(r Record, seq int64) natsRecord {
	return natsRecord{TID: r.TID, TokenHash: r.TokenHash, UID: r.UID, Status: r.Status, CreatedAt: r.CreatedAt,
		ExpiresAt: r.ExpiresAt, LastSeenAt: r.LastSeenAt, PendingResumeUntil: r.PendingResumeUntil,
		Origin: r.Origin, Label: r.Label, TabHash: r.TabHash, Used: r.Used, Seq: seq}
}

var _ Store = (*NATSStore)(nil)

// DefaultNATSBucket is the bucket OpenNATS uses for an empty name.
const DefaultNATSBucket = "lapd_tokens"

// OpenNATS opens (creating it if needed) the token bucket on nc's JetStream
// and loads the replica; ctx bounds the loading. The store does not close
// nc.
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
	// OnRevoked, if set, is called with a record's tid when the bucket's
	// watch delivers it revoked: a revocation made by another node (also
	// one made while this node was cut off from NATS, delivered when it is
	// back), and every revoked record while the store opens. On the
	// watch's goroutine: it must return promptly.
	OnRevoked func(tid string)
}

// OpenNATSConfig is OpenNATS with the bucket's settings.
func OpenNATSConfig(ctx context.Context, nc *nats.Conn, cfg NATSConfig) (*NATSStore, error) {
	bucket := cfg.Bucket
	if bucket == "" {
		bucket = DefaultNATSBucket
	}
	rep, err := kvrep.Open(ctx, kvrep.Config[natsRecord]{
		Conn: nc, Bucket: bucket, Prefix: "t.",
		Replicas: cfg.Replicas,
		Index:    func(n natsRecord) string { return n.TokenHash },
		OnChange: func(_ string, n natsRecord, _ uint64, deleted bool) {
			if !deleted && n.Status == StatusRevoked && cfg.OnRevoked != nil {
				cfg.OnRevoked(n.TID)
			}
		},
		Decode: func(_ string, b []byte) (natsRecord, error) {
			var n natsRecord
			err := json.Unmarshal(b, &n)
			return n, err
		},
	})
	if err != nil {
		return nil, err
	}
	return &NATSStore{rep: rep}, nil
}

func tidKey(tid string) string   { return "t." + kvrep.Key(tid) }
func hashKey(hash string) string { return "h." + kvrep.Key(hash) }

func (s *NATSStore) seq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastNs = max(time.Now().UnixNano(), s.lastNs+1)
	return s.lastNs
}

// Create inserts rec; ErrExists if its tid or hash is taken (on any node).
func (s *NATSStore) Create(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := s.rep.Create(ctx, hashKey(rec.TokenHash), []byte(rec.TID), natsRecord{}); err != nil {
		if errors.Is(err, kvrep.ErrExists) {
			return ErrExists
		}
		return err
	}
	n := toNATS(rec, s.seq())
	b, _ := json.Marshal(n)
	if _, err := s.rep.Create(ctx, tidKey(rec.TID), b, n); err != nil {
		_ = s.rep.Delete(context.WithoutCancel(ctx), hashKey(rec.TokenHash), 0)
		if errors.Is(err, kvrep.ErrExists) {
			return ErrExists
		}
		return err
	}
	return nil
}

// Get returns the record for tid, or ErrNotFound.
func (s *NATSStore) Get(ctx context.Context, tid string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	it, ok, err := s.rep.Fetch(ctx, tidKey(tid))
	if err != nil {
		return Record{}, err
	}
	if !ok {
		return Record{}, ErrNotFound
	}
	return it.V.record(), nil
}

// FindByHash returns the record whose token hash is hash, or ErrNotFound.
func (s *NATSStore) FindByHash(ctx context.Context, hash string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	var found *natsRecord
	if it, ok := s.rep.Lookup(hash); ok {
		found = &it.V
	} else {
		// Not here yet: created or rotated on another node a moment ago?
		e, err := s.rep.KV.Get(ctx, hashKey(hash))
		if err != nil {
			if ctx.Err() != nil {
				return Record{}, ctx.Err()
			}
			return Record{}, ErrNotFound
		}
		it, ok, err := s.rep.Refresh(ctx, tidKey(string(e.Value())))
		if err != nil {
			return Record{}, err
		}
		if !ok {
			return Record{}, ErrNotFound
		}
		found = &it.V
	}
	if subtle.ConstantTimeCompare([]byte(found.TokenHash), []byte(hash)) != 1 {
		return Record{}, ErrNotFound
	}
	return found.record(), nil
}

// Update applies fn to a copy of tid's record and writes the result if the
// record is still at the revision fn saw; on a conflict (another node wrote
// it meanwhile) it re-reads and calls fn again. Changing TokenHash takes
// the new hash first (ErrExists if it is taken) and frees the old one after.
func (s *NATSStore) Update(ctx context.Context, tid string, fn func(*Record) error) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	key := tidKey(tid)
	it, ok, err := s.rep.Fetch(ctx, key)
	for {
		if err != nil {
			return Record{}, err
		}
		if !ok {
			return Record{}, ErrNotFound
		}
		cur := it.V.record()
		next := cur
		if err := fn(&next); err != nil {
			return cur, err
		}
		next.TID = cur.TID
		rotate := next.TokenHash != cur.TokenHash
		if rotate {
			if _, err := s.rep.Create(ctx, hashKey(next.TokenHash), []byte(tid), natsRecord{}); err != nil {
				if errors.Is(err, kvrep.ErrExists) {
					return cur, ErrExists
				}
				return cur, err
			}
		}
		n := toNATS(next, it.V.Seq)
		b, _ := json.Marshal(n)
		rev, err := s.rep.Update(ctx, key, b, n, it.Rev)
		if err == nil {
			if rotate {
				_ = s.rep.Delete(context.WithoutCancel(ctx), hashKey(cur.TokenHash), 0)
			}
			next.Rev = rev
			return next, nil
		}
		if rotate {
			_ = s.rep.Delete(context.WithoutCancel(ctx), hashKey(next.TokenHash), 0)
		}
		if !errors.Is(err, kvrep.ErrConflict) {
			return cur, err
		}
		it, ok, err = s.rep.Refresh(ctx, key)
	}
}

// ListByUID returns uid's records in creation order.
func (s *NATSStore) ListByUID(ctx context.Context, uid string) ([]Record, error) {
	return s.list(ctx, func(r *natsRecord) bool { return r.UID == uid })
}

// ListByStatus returns the records in any of statuses, in creation order.
func (s *NATSStore) ListByStatus(ctx context.Context, statuses ...Status) ([]Record, error) {
	return s.list(ctx, func(r *natsRecord) bool { return slices.Contains(statuses, r.Status) })
}

func (s *NATSStore) list(ctx context.Context, match func(*natsRecord) bool) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var ns []natsRecord
	s.rep.Range(func(_ string, it kvrep.Item[natsRecord]) {
		if match(&it.V) {
			ns = append(ns, it.V)
		}
	})
	slices.SortFunc(ns, func(a, b natsRecord) int { return cmp.Or(cmp.Compare(a.Seq, b.Seq), strings.Compare(a.TID, b.TID)) })
	out := make([]Record, len(ns))
	for i, n := range ns {
		out[i] = n.record()
	}
	return out, nil
}

// DeleteExpired removes records whose ExpiresAt is before beforeMs (each
// only if it did not change meanwhile) and returns how many this call
// removed.
func (s *NATSStore) DeleteExpired(ctx context.Context, beforeMs int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	type victim struct {
		key, hash string
		rev       uint64
	}
	var vs []victim
	s.rep.Range(func(k string, it kvrep.Item[natsRecord]) {
		if it.V.ExpiresAt < beforeMs {
			vs = append(vs, victim{k, it.V.TokenHash, it.Rev})
		}
	})
	n := 0
	for _, v := range vs {
		err := s.rep.Delete(ctx, v.key, v.rev)
		if errors.Is(err, kvrep.ErrConflict) {
			continue // changed meanwhile: the next sweep looks again
		}
		if err != nil {
			return n, err
		}
		_ = s.rep.Delete(ctx, hashKey(v.hash), 0)
		n++
	}
	return n, nil
}

// Close stops the replica's watcher. The NATS connection stays open.
func (s *NATSStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.rep.Close()
	return nil
}
