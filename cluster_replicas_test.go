package lapd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// NATSReplicas reaches every bucket and the audit stream: on one NATS
// server (no JetStream cluster) 1 is what exists, a node that asks for 3
// fails at startup with an error that names the bucket and the number, and
// a node that does not ask keeps what exists.
func TestClusterNATSReplicas(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	ctx := ctxT(t)
	newNode := func(replicas int) (*lapd.Server, error) {
		return lapd.New(ctx, lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, AuditNATS: true, NATSReplicas: replicas})
	}
	for _, n := range []int{-1, 6} {
		if _, err := newNode(n); err == nil || !strings.Contains(err.Error(), "want 1 to 5") {
			t.Fatalf("NATSReplicas %d: %v, want a range error", n, err)
		}
	}
	s, err := newNode(1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	js, err := jetstream.New(ns.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	streams := []string{"KV_" + name + "_tokens", "KV_" + name + "_confirm", "KV_" + name + "_mcp", name + "_audit"}
	for _, st := range streams {
		info, err := js.Stream(ctx, st)
		if err != nil {
			t.Fatalf("stream %s: %v", st, err)
		}
		if r := info.CachedInfo().Config.Replicas; r != 1 {
			t.Fatalf("%s has %d replicas, want 1", st, r)
		}
	}
	_, err = newNode(3)
	if err == nil || !strings.Contains(err.Error(), name+"_tokens with 3 replicas") {
		t.Fatalf("NATSReplicas 3 on one server: %v, want a startup error naming the bucket and 3", err)
	}
	t.Logf("the startup error: %v", err)
	s2, err := newNode(0)
	if err != nil {
		t.Fatalf("a node that does not ask for replicas: %v", err)
	}
	s2.Shutdown(context.Background())
}
