// Package kvrep keeps a decoded, in-memory replica of the keys under one
// prefix of a JetStream key-value bucket, for lapd's cluster stores
// (tokens.NATSStore, confirm.NATSStore).
//
// Reads are served from memory, so a lapd node answers Verify and Get
// without a network round trip; writes go to the bucket with compare-and-set
// on the key's revision and are applied to the local replica at once (a
// node reads its own writes). Other nodes' writes arrive through a KV watch,
// in revision order, usually within a millisecond; a key the replica does
// not hold yet is read from the bucket (Fetch), so a record created on one
// node is found on another at once. What can be stale, for at most that
// watch delay, is a key the replica already holds; Update's compare-and-set
// catches it (ErrConflict, then the caller re-reads with Refresh).
//
// While the connection to NATS is down (reconnecting), a write or a read
// from the bucket fails at once with nats.ErrDisconnected instead of
// waiting for JetStream's request timeout (5 s): nats.go would buffer the
// request and time out, and a node cut off from NATS made every LAP call
// wait those 5 s for its best-effort LastSeenAt touch. Reads from memory go
// on.
//
// Deletes leave markers in the bucket's stream; a janitor purges markers
// older than an hour, once an hour.
package kvrep

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict: the key changed since the revision the write was based on.
var ErrConflict = errors.New("kvrep: the key changed meanwhile")

// ErrExists: Create of a key that exists.
var ErrExists = errors.New("kvrep: key exists")

// Item is a replicated value and the revision it was written at.
type Item[T any] struct {
	V   T
	Rev uint64
}

// Config configures a Replica.
type Config[T any] struct {
	Conn   *nats.Conn
	Bucket string // created if missing (file storage, history 1)
	Prefix string // replicate keys starting with Prefix (e.g. "t."); others are only written
	Decode func(key string, b []byte) (T, error)
	// OnChange, if set, is called for every change of a replicated key
	// made by any node (this one included), after the replica has it, on
	// the watcher goroutine, in revision order. deleted=true: v is zero.
	OnChange func(key string, v T, rev uint64, deleted bool)
	// Replicas of the bucket's stream (JetStream clustering): N > 0 makes
	// the bucket have N (created so, or updated to N), and fails when the
	// servers cannot; 0 creates a missing bucket with 1 and leaves an
	// existing one's as they are (see Bucket).
	Replicas int
	// Index, if set, names each value under a second key (e.g. a token
	// hash) that Lookup finds; "" = not indexed.
	Index func(v T) string
}

// Bucket creates or updates the bucket cfg describes and binds it, with
// replicas copies of its stream: N > 0 is a requirement (created with N, or
// an existing bucket updated to N; an error that names the bucket and N if
// the servers refuse, e.g. more replicas than JetStream servers); 0 keeps
// an existing bucket's replicas (so a node started without the setting
// never scales down a bucket others asked for) and creates a missing one
// with 1. With 0, an update refused for another reason (a bucket made with
// other settings, a user allowed to read the bucket's config but not to
// change it) binds the bucket as it is.
func Bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, replicas int) (jetstream.KeyValue, error) {
	cfg.Replicas = max(replicas, 1)
	if replicas <= 0 {
		if st, err := js.Stream(ctx, "KV_"+cfg.Bucket); err == nil {
			cfg.Replicas = max(st.CachedInfo().Config.Replicas, 1)
		}
	}
	kv, err := Create(ctx, js, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateOrUpdateKeyValue(ctx, cfg) })
	if err == nil {
		return kv, nil
	}
	if replicas > 0 {
		return nil, fmt.Errorf("kvrep: bucket %s with %d replicas: %w", cfg.Bucket, replicas, err)
	}
	if kv, err2 := js.KeyValue(ctx, cfg.Bucket); err2 == nil {
		return kv, nil
	}
	return nil, fmt.Errorf("kvrep: bucket %s: %w", cfg.Bucket, err)
}

// createTimeouts are the attempts Create makes: a create is answered in
// milliseconds, or not at all.
var createTimeouts = []time.Duration{2 * time.Second, 5 * time.Second, 5 * time.Second}

// Create sends an idempotent JetStream create-or-update request (create
// calls js.CreateOrUpdateKeyValue or js.CreateOrUpdateStream) until
// JetStream answers it, at most three times. On a JetStream cluster, when
// several clients create the same stream at once (lapd nodes started
// together), nats-server answers only one of them: the others get no
// answer and time out although the stream now exists (nats-io/nats.go#949).
// Sent again, the request updates the stream to the same config, which is
// answered. Any other error, ctx's end, or a timeout that comes from a
// request NATS refused this user (it is not answered either), ends it.
func Create[T any](ctx context.Context, js jetstream.JetStream, create func(context.Context) (T, error)) (T, error) {
	var v T
	var err error
	for _, d := range createTimeouts {
		actx, cancel := context.WithTimeout(ctx, d)
		v, err = create(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) ||
			errors.Is(js.Conn().LastError(), nats.ErrPermissionViolation) {
			break
		}
	}
	return v, err
}

// Replica is the replica. Safe for concurrent use.
type Replica[T any] struct {
	cfg Config[T]
	KV  jetstream.KeyValue
	w   jetstream.KeyWatcher

	mu    sync.RWMutex
	items map[string]Item[T]
	tomb  map[string]uint64 // deleted keys → the delete's revision, until the watch passes it
	index map[string]string // Config.Index(value) → key
	done  chan struct{}
	stop  context.CancelFunc // the watcher's context
	wg    sync.WaitGroup
}

// Open binds (or creates) the bucket and loads the replica; it returns
// once every key under Prefix is in memory, or ctx is done.
func Open[T any](ctx context.Context, cfg Config[T]) (*Replica[T], error) {
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	kv, err := Bucket(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Bucket, History: 1, Storage: jetstream.FileStorage}, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	r := &Replica[T]{cfg: cfg, KV: kv, items: map[string]Item[T]{}, tomb: map[string]uint64{}, index: map[string]string{}, done: make(chan struct{})}
	// The watcher's own context outlives Open's: it runs until Close.
	wctx, stop := context.WithCancel(context.Background())
	w, err := kv.Watch(wctx, cfg.Prefix+">")
	if err != nil {
		stop()
		return nil, fmt.Errorf("kvrep: watch %s: %w", cfg.Bucket, err)
	}
	r.w, r.stop = w, stop
	loaded := make(chan struct{})
	r.wg.Add(2)
	go r.watch(loaded)
	go r.janitor()
	select {
	case <-loaded:
		return r, nil
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("kvrep: loading %s: %w", cfg.Bucket, ctx.Err())
	}
}

func (r *Replica[T]) watch(loaded chan struct{}) {
	defer r.wg.Done()
	first := true
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case e, ok = <-r.w.Updates():
		case <-r.done:
			return
		}
		if !ok {
			return
		}
		if e == nil { // the initial values are all in
			if first {
				first = false
				close(loaded)
			}
			continue
		}
		deleted := e.Operation() != jetstream.KeyValuePut
		var v T
		if !deleted {
			var err error
			if v, err = r.cfg.Decode(e.Key(), e.Value()); err != nil {
				continue // not ours to read (a newer lapd's value); skip it
			}
		}
		if r.apply(e.Key(), v, e.Revision(), deleted, true) && r.cfg.OnChange != nil {
			r.cfg.OnChange(e.Key(), v, e.Revision(), deleted)
		}
	}
}

// apply records a value (or a delete) at rev unless the replica already has
// a newer one. It reports whether the replica changed.
func (r *Replica[T]) apply(key string, v T, rev uint64, deleted, fromWatch bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.tomb[key]; ok {
		if rev < t {
			return false
		}
		if fromWatch {
			delete(r.tomb, key)
		}
	}
	if cur, ok := r.items[key]; ok && cur.Rev >= rev {
		return false
	}
	if cur, ok := r.items[key]; ok && r.cfg.Index != nil {
		if ix := r.cfg.Index(cur.V); ix != "" && r.index[ix] == key {
			delete(r.index, ix)
		}
	}
	if deleted {
		_, had := r.items[key]
		delete(r.items, key)
		if !fromWatch {
			r.tomb[key] = rev
		}
		return had || fromWatch
	}
	r.items[key] = Item[T]{V: v, Rev: rev}
	if r.cfg.Index != nil {
		if ix := r.cfg.Index(v); ix != "" {
			r.index[ix] = key
		}
	}
	return true
}

// Lookup finds the value whose Config.Index is ix, in memory.
func (r *Replica[T]) Lookup(ix string) (Item[T], bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	key, ok := r.index[ix]
	if !ok {
		return Item[T]{}, false
	}
	it, ok := r.items[key]
	return it, ok
}

// janitor purges old delete markers once an hour.
func (r *Replica[T]) janitor() {
	defer r.wg.Done()
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = r.KV.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(time.Hour))
			cancel()
		}
	}
}

// down returns nats.ErrDisconnected while the connection is reconnecting
// (see the package doc): a request to the bucket now would only wait for
// its timeout.
func (r *Replica[T]) down() error {
	switch r.cfg.Conn.Status() {
	case nats.RECONNECTING, nats.DISCONNECTED:
		return nats.ErrDisconnected
	}
	return nil
}

// Get returns key's value from memory.
func (r *Replica[T]) Get(key string) (Item[T], bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	it, ok := r.items[key]
	return it, ok
}

// Fetch returns key's value from memory, or from the bucket when the
// replica does not hold it (yet).
func (r *Replica[T]) Fetch(ctx context.Context, key string) (Item[T], bool, error) {
	if it, ok := r.Get(key); ok {
		return it, true, nil
	}
	return r.Refresh(ctx, key)
}

// Refresh reads key from the bucket (and updates the replica with it).
func (r *Replica[T]) Refresh(ctx context.Context, key string) (Item[T], bool, error) {
	if err := r.down(); err != nil {
		return Item[T]{}, false, err
	}
	e, err := r.KV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Item[T]{}, false, nil
	}
	if err != nil {
		return Item[T]{}, false, err
	}
	v, err := r.cfg.Decode(key, e.Value())
	if err != nil {
		return Item[T]{}, false, err
	}
	if strings.HasPrefix(key, r.cfg.Prefix) {
		r.apply(key, v, e.Revision(), false, false)
	}
	return Item[T]{V: v, Rev: e.Revision()}, true, nil
}

// Range calls fn for a snapshot of the replica's items.
func (r *Replica[T]) Range(fn func(key string, it Item[T])) {
	r.mu.RLock()
	snap := make(map[string]Item[T], len(r.items))
	for k, it := range r.items {
		snap[k] = it
	}
	r.mu.RUnlock()
	for k, it := range snap {
		fn(k, it)
	}
}

// Len is how many keys the replica holds.
func (r *Replica[T]) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.items)
}

func (r *Replica[T]) local(key string, v T, rev uint64, deleted bool) {
	if strings.HasPrefix(key, r.cfg.Prefix) {
		r.apply(key, v, rev, deleted, false)
	}
}

// Create writes key if it does not exist (ErrExists otherwise).
func (r *Replica[T]) Create(ctx context.Context, key string, b []byte, v T) (uint64, error) {
	if err := r.down(); err != nil {
		return 0, err
	}
	rev, err := r.KV.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrExists
	}
	if err != nil {
		return 0, err
	}
	r.local(key, v, rev, false)
	return rev, nil
}

// Update writes key if it is still at rev (ErrConflict otherwise).
func (r *Replica[T]) Update(ctx context.Context, key string, b []byte, v T, rev uint64) (uint64, error) {
	if err := r.down(); err != nil {
		return 0, err
	}
	nrev, err := r.KV.Update(ctx, key, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrConflict
	}
	if err != nil {
		return 0, err
	}
	r.local(key, v, nrev, false)
	return nrev, nil
}

// Put writes key whatever it holds.
func (r *Replica[T]) Put(ctx context.Context, key string, b []byte, v T) (uint64, error) {
	if err := r.down(); err != nil {
		return 0, err
	}
	rev, err := r.KV.Put(ctx, key, b)
	if err != nil {
		return 0, err
	}
	r.local(key, v, rev, false)
	return rev, nil
}

// Delete deletes key; with rev > 0 only if it is still at rev (ErrConflict
// otherwise). Deleting a missing key is not an error.
func (r *Replica[T]) Delete(ctx context.Context, key string, rev uint64) error {
	if err := r.down(); err != nil {
		return err
	}
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := r.KV.Delete(ctx, key, opts...)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return ErrConflict
	}
	if err != nil {
		return err
	}
	// The marker's revision is not returned: any revision after the one
	// this replica held keeps an older value from coming back through the
	// watch, which then delivers the marker itself.
	if it, ok := r.Get(key); ok {
		var zero T
		r.local(key, zero, it.Rev+1, true)
	}
	return nil
}

// Close stops the watcher and the janitor. The connection stays open.
func (r *Replica[T]) Close() {
	select {
	case <-r.done:
		return
	default:
	}
	close(r.done)
	if r.cfg.Conn.IsConnected() {
		_ = r.w.Stop()
	}
	// Disconnected, Stop would wait for a JetStream request (deleting the
	// watch's consumer) to time out, 5 s, and Close runs on shutdown:
	// cancelling the watch's context makes nats.go unsubscribe on its own
	// goroutine (at once on a closed connection; the server drops the
	// ephemeral consumer by itself).
	r.stop()
	r.wg.Wait()
}

// Key turns an arbitrary string into one KV key token: itself when it is
// made of [A-Za-z0-9_-] only, else "=" + its unpadded base64url.
func Key(s string) string {
	if s != "" && strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-')
	}) < 0 {
		return s
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(s))
}

// Unkey is the inverse of Key.
func Unkey(k string) string {
	if b, ok := strings.CutPrefix(k, "="); ok {
		if raw, err := base64.RawURLEncoding.DecodeString(b); err == nil {
			return string(raw)
		}
	}
	return k
}
