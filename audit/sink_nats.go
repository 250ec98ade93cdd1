package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/internal/kvrep"
)

// NATSSink appends entries to a JetStream stream that every lapd of a
// cluster writes to, so `lapd audit --nats URL` reads the whole cluster's
// trail. Each entry is published as JSON on
// "<prefix>.audit.<event>.<tid or ->", which lets a query by tid or event
// read only what it asks for. The stream keeps entries for MaxAge and at
// most MaxBytes (oldest dropped first).
//
// A message holds one entry or several, as JSON lines: the Log hands the
// sink whole batches (WriteBatch), and the entries of one batch that share
// a subject go out together, up to MaxMessage bytes per message. One
// message per call would make every LAP call a JetStream store and an
// acknowledgement, on the NATS server that all nodes share. Entries of
// different subjects in one batch may therefore be stored out of their
// order; Query returns entries ordered by At.
//
// Writes do not wait for JetStream: each queues an asynchronous publish
// (at most 4,096 outstanding; past that a write waits, which is the
// backpressure), and a publish JetStream refuses is counted (Failed, in
// entries) and logged, never dropped silently. A stream that has no
// leader for a while (on a JetStream cluster, the seconds an election
// takes after the leader's server is lost) is waited out: the publish is
// retried for up to 15 s. Close waits for the outstanding acks.
type NATSSink struct {
	js     jetstream.JetStream
	prefix string
	log    *slog.Logger
	failed atomic.Int64
	closed atomic.Bool
}

// NATSSinkConfig configures the stream. Zero values mean the defaults.
type NATSSinkConfig struct {
	Prefix   string        // subject prefix; default "lapd"; the stream is "<prefix>_audit"
	MaxAge   time.Duration // default 30 days
	MaxBytes int64         // default 1 GiB
	Logger   *slog.Logger  // refused publishes; nil = discard
	// Replicas of the stream on a JetStream cluster: N > 0 creates it with
	// N or updates it to N, and fails if the servers cannot; 0 creates a
	// missing stream with 1 and keeps an existing one's.
	Replicas int
}

var (
	_ BatchSink = (*NATSSink)(nil)
	_ Querier   = (*NATSSink)(nil)
)

// MaxMessage bounds the bytes of one stream message that WriteBatch
// writes (an entry longer than that goes alone). It keeps a Query's fetch
// of 256 messages within 16 MiB, and every message well under NATS's
// default max_payload (1 MiB).
const MaxMessage = 64 << 10

// StreamName is the audit stream of a cluster prefix.
func StreamName(prefix string) string {
	if prefix == "" {
		prefix = "lapd"
	}
	return prefix + "_audit"
}

// OpenNATSSink creates (or binds) the audit stream on nc's JetStream. The
// sink does not close nc.
func OpenNATSSink(ctx context.Context, nc *nats.Conn, cfg NATSSinkConfig) (*NATSSink, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "lapd"
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 30 * 24 * time.Hour
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &NATSSink{prefix: cfg.Prefix, log: cfg.Logger}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			k := int64(bytes.Count(m.Data, []byte{'\n'}) + 1)
			n := s.failed.Add(k)
			s.log.Warn("audit: JetStream refused entries; they are not in the cluster's trail", "subject", m.Subject, "entries", k, "err", err, "failed_total", n)
		}))
	if err != nil {
		return nil, err
	}
	s.js = js
	sc := jetstream.StreamConfig{Name: StreamName(cfg.Prefix), Subjects: []string{cfg.Prefix + ".audit.>"},
		Storage: jetstream.FileStorage, MaxAge: cfg.MaxAge, MaxBytes: cfg.MaxBytes, Discard: jetstream.DiscardOld,
		Replicas: max(cfg.Replicas, 1)}
	if cfg.Replicas <= 0 {
		if st, err := js.Stream(ctx, sc.Name); err == nil {
			sc.Replicas = max(st.CachedInfo().Config.Replicas, 1)
		}
	}
	if _, err := kvrep.Create(ctx, js, func(ctx context.Context) (jetstream.Stream, error) { return js.CreateOrUpdateStream(ctx, sc) }); err != nil {
		if cfg.Replicas > 0 {
			return nil, fmt.Errorf("audit: stream %s with %d replicas: %w", sc.Name, cfg.Replicas, err)
		}
		if _, err2 := js.Stream(ctx, sc.Name); err2 != nil {
			return nil, fmt.Errorf("audit: stream %s: %w", sc.Name, err)
		}
	}
	return s, nil
}

func subjectToken(s string) string {
	if s == "" {
		return "-"
	}
	for _, c := range s {
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c > '~' {
			return "_" // not a subject token: still stored, found by a full scan
		}
	}
	return s
}

// CheckPublish proves that this connection may append entries to the
// stream, without storing one: it publishes to the stream's subjects with an
// expectation JetStream refuses (another stream's name), so a JetStream
// answer of any kind (or "no responders": the stream has no leader yet)
// means the publish got through, and none means NATS
// dropped it (a missing publish permission: the server only reports that
// to the connection's error handler). Without this a node whose user may
// not publish to "<prefix>.audit.>" starts and then loses every entry's
// copy in the cluster's trail.
func (s *NATSSink) CheckPublish(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.js.Publish(ctx, s.prefix+".audit.probe._", nil, jetstream.WithExpectStream(StreamName(s.prefix)+"-probe"))
	var apiErr *jetstream.APIError
	if err == nil || errors.As(err, &apiErr) ||
		// No responders: NATS routed the publish and found no stream
		// leader to answer it (a JetStream cluster electing one). A
		// refused publish is dropped without any answer.
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	return fmt.Errorf("audit: publishing to %s.audit.> got no answer from JetStream (%w): may this node's NATS user publish there?", s.prefix, err)
}

// A stream with no leader answers a publish with "no responders" until
// JetStream elects one: on a cluster, that is several seconds after the
// leader's server is lost (nats-server's election timeout is 4 to 9 s).
// nats.go's default retries it twice, 250 ms apart, which would drop from
// the cluster's trail every entry written during an election; the sink
// retries for 15 s instead.
var leaderlessRetry = []jetstream.PublishOpt{jetstream.WithRetryWait(250 * time.Millisecond), jetstream.WithRetryAttempts(60)}

var errSinkClosed = errors.New("audit: NATS sink closed")

// Write queues e for the stream, alone in its message.
func (s *NATSSink) Write(ctx context.Context, e Entry) error {
	if s.closed.Load() {
		return errSinkClosed
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = s.js.PublishAsync(s.subject(e), b, leaderlessRetry...)
	return err
}

func (s *NATSSink) subject(e Entry) string {
	return s.prefix + ".audit." + subjectToken(e.Event) + "." + subjectToken(e.TID)
}

// WriteBatch queues b's entries for the stream: those of one subject
// together, as JSON lines, in messages of at most MaxMessage bytes. It
// returns an error only when nothing was queued; entries left unqueued
// after some were are counted in Failed and logged.
func (s *NATSSink) WriteBatch(ctx context.Context, b *Batch) error {
	if s.closed.Load() {
		return errSinkClosed
	}
	// Group by subject, in order of first appearance. next[i] links entry i
	// to the next entry of its subject (-1: none).
	next := make([]int, len(b.Entries))
	type group struct {
		subject     string
		first, last int
	}
	var groups []group
	at := make(map[string]int, 4) // subject → its index in groups
	for i, e := range b.Entries {
		next[i] = -1
		subj := s.subject(e)
		if g, ok := at[subj]; ok {
			next[groups[g].last] = i
			groups[g].last = i
			continue
		}
		at[subj] = len(groups)
		groups = append(groups, group{subject: subj, first: i, last: i})
	}
	queued, lost := 0, 0
	var firstErr error
	for _, g := range groups {
		for i := g.first; i >= 0; {
			// A fresh buffer per message: a publish retried while the
			// stream has no leader is sent again from it.
			size, n := 0, 0
			for j := i; j >= 0 && (n == 0 || size+1+len(b.Line(j)) <= MaxMessage); j = next[j] {
				size += len(b.Line(j)) + 1
				n++
			}
			msg := make([]byte, 0, size)
			for range n {
				if len(msg) > 0 {
					msg = append(msg, '\n')
				}
				msg = append(msg, b.Line(i)...)
				i = next[i]
			}
			if _, err := s.js.PublishAsync(g.subject, msg, leaderlessRetry...); err != nil {
				lost += n
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			queued += n
		}
	}
	if lost == 0 {
		return nil
	}
	if queued == 0 {
		return firstErr
	}
	total := s.failed.Add(int64(lost))
	s.log.Warn("audit: entries not queued for JetStream; they are not in the cluster's trail", "entries", lost, "err", firstErr, "failed_total", total)
	return nil
}

// Failed reports how many entries JetStream refused since the sink opened.
func (s *NATSSink) Failed() int64 { return s.failed.Load() }

// Close waits (at most 10 s) for the outstanding publishes; not at all when
// the connection to NATS is down (they cannot be acknowledged before it is
// back, and the node's other sinks have every entry).
func (s *NATSSink) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if n := s.js.PublishAsyncPending(); n > 0 && !s.js.Conn().IsConnected() {
		return fmt.Errorf("audit: %d entries not acknowledged by JetStream at close (NATS not connected)", n)
	}
	select {
	case <-s.js.PublishAsyncComplete():
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("audit: %d entries not acknowledged by JetStream at close", s.js.PublishAsyncPending())
	}
}

// Query reads the cluster's entries back (see Filter). It scans the part
// of the stream that the filter's tid and single event select, from Since.
func (s *NATSSink) Query(ctx context.Context, f Filter) ([]Entry, error) {
	select { // this sink's own entries first
	case <-s.js.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	stream, err := s.js.Stream(ctx, StreamName(s.prefix))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	ev, tid := "*", "*"
	if f.Event != "" {
		ev = subjectToken(f.Event)
	} else if len(f.Events) == 1 {
		ev = subjectToken(f.Events[0])
	}
	if f.TID != "" {
		tid = subjectToken(f.TID)
	}
	if ev == "_" {
		ev = "*"
	}
	if tid == "_" {
		tid = "*"
	}
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.prefix + ".audit." + ev + "." + tid}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if f.Since > 0 {
		t := time.UnixMilli(f.Since).Add(-time.Minute) // by arrival; At may lag a little
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := stream.OrderedConsumer(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	left := info.NumPending
	// With Limit, the newest Offset+Limit matching entries are kept, then
	// the newest Offset dropped (paging back).
	keep := 0
	if f.Limit > 0 {
		keep = f.Limit + max(f.Offset, 0)
	}
	var out []Entry
	for left > 0 {
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			left--
			for line := range bytes.SplitSeq(m.Data(), []byte{'\n'}) {
				var e Entry
				if json.Unmarshal(line, &e) != nil || !f.match(e) {
					continue
				}
				out = append(out, e)
			}
			if keep > 0 && len(out) > 2*keep { // keep memory bounded: the newest keep win
				slices.SortStableFunc(out, byAt)
				out = slices.Delete(out, 0, len(out)-keep)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("audit: %w", err)
		}
		if got == 0 {
			break
		}
		if md, err := cons.Info(ctx); err == nil && md.NumPending == 0 {
			break
		}
	}
	slices.SortStableFunc(out, byAt)
	if f.Limit > 0 {
		out = out[:max(len(out)-max(f.Offset, 0), 0)]
		if len(out) > f.Limit {
			out = out[len(out)-f.Limit:]
		}
	}
	return out, nil
}

func byAt(a, b Entry) int { return cmp.Compare(a.At, b.At) }
