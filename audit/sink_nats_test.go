package audit_test

import (
	"context"
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
