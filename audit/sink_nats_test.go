package audit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// A stream without a leader answers no one ("no responders") until one is
// elected: on a JetStream cluster, for the seconds an election takes after
// the leader's server is lost (TestClusterJetStreamReplicas in e2e kills
// it). The sink keeps retrying an entry through such a gap instead of
// dropping it from the cluster's trail after nats.go's default three
// attempts. Here the gap is the stream deleted and created again once the
// sink has tried more often than that.
func TestNATSSinkWaitsOutALeaderlessStream(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	nc := ns.Connect(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := audit.OpenNATSSink(ctx, nc, audit.NATSSinkConfig{Prefix: "g"})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(ns.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "g_audit")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if err := js.DeleteStream(ctx, "g_audit"); err != nil {
		t.Fatal(err)
	}
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	published := func() uint64 { // messages the sink's connection sent
		cz, err := ns.Connz(&server.ConnzOptions{CID: cid})
		if err != nil || len(cz.Conns) != 1 {
			t.Fatalf("connz: %v %+v", err, cz)
		}
		return uint64(cz.Conns[0].InMsgs)
	}
	before := published()
	if err := s.Write(ctx, audit.Entry{TID: "t1", Event: audit.EventMint}); err != nil {
		t.Fatal(err)
	}
	for published()-before < 4 { // nats.go's default gives up after 3
		if s.Failed() > 0 {
			t.Fatalf("the sink gave the entry up after %d attempts", published()-before)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the sink published the entry %d times and stopped", published()-before)
		case <-time.After(20 * time.Millisecond): // polls a counter in the server
		}
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // waits for the ack
		t.Fatal(err)
	}
	if n := s.Failed(); n != 0 {
		t.Fatalf("Failed() = %d, want 0: the entry was given up during the gap", n)
	}
	info, err := js.Stream(ctx, "g_audit")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("the stream holds %d entries, want the one written while it had no leader", n)
	}
}

// The Log hands the sink whole batches, and the sink stores the entries of
// one subject (event and tid) together: a batch of 300 entries over three
// subjects is three stream messages, or more where one would pass
// MaxMessage. Query reads every entry back, in time order, by tid too.
func TestNATSSinkStoresABatchAsFewMessages(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := t.Context()
	s, err := audit.OpenNATSSink(ctx, ns.Connect(t), audit.NATSSinkConfig{Prefix: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lg := audit.New(audit.Config{Sinks: []audit.Sink{s}, Linger: time.Hour}) // one batch: Flush ends the linger
	defer lg.Close()
	const n = 300
	big := strings.Repeat("x", audit.MaxDetailString) // ~1 KiB per t2 entry: 100 of them pass MaxMessage
	var want []audit.Entry
	for i := range n {
		e := audit.Entry{At: int64(1000 + i), TID: []string{"t0", "t1", "t2"}[i%3], Event: audit.EventLapCall,
			Detail: map[string]any{"i": float64(i), "path": "/observe"}}
		if i%3 == 2 {
			e.Detail["note"] = big
		}
		if i%10 == 0 {
			e.Event = audit.EventRefused
		}
		want = append(want, e)
		lg.Record(ctx, e)
	}
	if err := lg.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Query(ctx, audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Query read back %d entries, want the %d written, in order:\n%v", len(got), len(want), got)
	}
	got, err = s.Query(ctx, audit.Filter{TID: "t1", Event: audit.EventLapCall, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint([]audit.Entry{want[295], want[298]}) {
		t.Fatalf("Query by tid, event and limit = %v", got)
	}
	js, err := jetstream.New(ns.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, audit.StreamName("b"))
	if err != nil {
		t.Fatal(err)
	}
	// Six subjects (two events × three tids); t2's 90 lap-call entries
	// (~100 KiB) take two messages.
	if msgs := st.CachedInfo().State.Msgs; msgs != 7 {
		t.Fatalf("the stream holds %d messages for %d entries, want 7: one per subject, split past %d bytes", msgs, n, audit.MaxMessage)
	}
	if s.Failed() != 0 {
		t.Fatalf("Failed() = %d", s.Failed())
	}
}

// A message JetStream refuses loses every entry in it from the cluster's
// trail: Failed counts the entries, not the messages.
func TestNATSSinkCountsRefusedEntries(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := t.Context()
	s, err := audit.OpenNATSSink(ctx, ns.Connect(t), audit.NATSSinkConfig{Prefix: "r"})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(ns.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, audit.StreamName("r"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 512 // ten entries of one subject are one larger message
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	lg := audit.New(audit.Config{Sinks: []audit.Sink{s}, Linger: time.Hour})
	for i := range 10 {
		lg.Record(ctx, audit.Entry{At: int64(i + 1), TID: "t", Event: audit.EventLapCall, Detail: map[string]any{"path": "/observe"}})
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // waits for JetStream's answer
		t.Fatal(err)
	}
	if n := s.Failed(); n != 10 {
		t.Fatalf("Failed() = %d after JetStream refused one message of 10 entries, want 10", n)
	}
}
