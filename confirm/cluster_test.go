package confirm_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// node is one lapd's confirm.Manager over the shared bucket.
func clusterNodes(t *testing.T, n int, expiry time.Duration, onExpire func(confirm.Pending)) []*confirm.Manager {
	t.Helper()
	return clusterNodesCfg(t, n, confirm.Config{Expiry: expiry, OnExpire: onExpire})
}

// clusterNodesCfg is clusterNodes with a Config (its Store is set here).
func clusterNodesCfg(t *testing.T, n int, cfg confirm.Config) []*confirm.Manager {
	t.Helper()
	ns := natstest.Start(t)
	var out []*confirm.Manager
	for range n {
		st, err := confirm.OpenNATS(t.Context(), ns.Connect(t), "cluster")
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Store = st
		m, err := confirm.New(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		out = append(out, m)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling another process's state: no signal to await
	}
}

// Proposed on A (the node the LLM called), answered on B (the tab's node),
// waited for on C: every node gets the one answer.
func TestClusterProposeAnswerWait(t *testing.T) {
	t.Parallel()
	ms := clusterNodes(t, 3, time.Minute, nil)
	a, b, c := ms[0], ms[1], ms[2]
	ctx := t.Context()
	if err := a.Propose(ctx, confirm.Pending{TID: "t1", ConfirmID: "c1", Variant: "clearAll"}); err != nil {
		t.Fatal(err)
	}
	// B re-delivers it when the tab pairs there.
	waitFor(t, "B to hold the approval", func() bool { return len(b.PendingFor("t1")) == 1 })
	got := make(chan confirm.Resolution, 2)
	for _, m := range []*confirm.Manager{a, c} {
		go func() {
			r, err := m.Wait(ctx, "t1", "c1")
			if err != nil {
				t.Error(err)
			}
			got <- r
		}()
	}
	b.Resolve(ctx, "t1", "c1", confirm.Resolution{Status: "confirmed"})
	for range 2 {
		select {
		case r := <-got:
			if r.Status != "confirmed" || r.Variant != "clearAll" {
				t.Errorf("Wait = %+v", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter on another node was not woken")
		}
	}
	// A later answer from elsewhere does not change it.
	c.Resolve(ctx, "t1", "c1", confirm.Resolution{Status: "rejected", Reason: "user-cancelled"})
	if r, err := a.Wait(ctx, "t1", "c1"); err != nil || r.Status != "confirmed" {
		t.Errorf("after a second answer, Wait = %+v, %v", r, err)
	}
}

// The tab's answer reaches its node before that node has seen the
// proposal: it is parked, then applied.
func TestClusterEarlyAnswer(t *testing.T) {
	t.Parallel()
	ms := clusterNodes(t, 2, time.Minute, nil)
	a, b := ms[0], ms[1]
	ctx := t.Context()
	b.Resolve(ctx, "t1", "early", confirm.Resolution{Status: "confirmed"})
	if err := a.Propose(ctx, confirm.Pending{TID: "t1", ConfirmID: "early", Variant: "v"}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if r, err := a.Wait(wctx, "t1", "early"); err != nil || r.Status != "confirmed" {
		t.Fatalf("Wait = %+v, %v; want the parked answer", r, err)
	}
}

// Every node arms an expiry timer; exactly one tells the tab.
func TestClusterExpiresOnce(t *testing.T) {
	t.Parallel()
	var expired atomic.Int32
	ms := clusterNodes(t, 3, 300*time.Millisecond, func(confirm.Pending) { expired.Add(1) })
	ctx := t.Context()
	if err := ms[0].Propose(ctx, confirm.Pending{TID: "t1", ConfirmID: "c1", Variant: "v"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := m.Wait(wctx, "t1", "c1")
		cancel()
		if err != nil || r.Reason != confirm.ReasonTimeout {
			t.Fatalf("Wait = %+v, %v; want the timeout", r, err)
		}
	}
	if n := expired.Load(); n != 1 {
		t.Fatalf("OnExpire ran %d times across the cluster, want 1", n)
	}
}

// A revoke on one node drops the approval on all of them.
func TestClusterDrop(t *testing.T) {
	t.Parallel()
	ms := clusterNodes(t, 2, time.Minute, nil)
	a, b := ms[0], ms[1]
	ctx := t.Context()
	if err := a.Propose(ctx, confirm.Pending{TID: "t1", ConfirmID: "c1", Variant: "v"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to hold the approval", func() bool { return len(b.PendingFor("t1")) == 1 })
	a.Drop(ctx, "t1")
	waitFor(t, "B to drop it", func() bool { return len(b.PendingFor("t1")) == 0 })
	if _, err := b.Wait(ctx, "t1", "c1"); !errors.Is(err, confirm.ErrUnknown) {
		t.Fatalf("Wait after drop = %v, want ErrUnknown", err)
	}
}

// An approval expired to make room (the pending total full, another
// session proposing) is expired on every node, and told once, like a
// timeout.
func TestClusterPendingBudgetExpiresOnce(t *testing.T) {
	t.Parallel()
	var expired atomic.Int32
	ms := clusterNodesCfg(t, 2, confirm.Config{Expiry: time.Minute, PendingBytes: 3400, OnExpire: func(p confirm.Pending) {
		if p.Outcome != nil && p.Outcome.Reason == confirm.ReasonTooManyPending {
			expired.Add(1)
		}
	}})
	a, b := ms[0], ms[1]
	ctx := t.Context()
	big := json.RawMessage(`"` + strings.Repeat("x", 498) + `"`) // about 1,660 bytes an approval: two fit
	for _, id := range []string{"c0", "c1"} {
		if err := a.Propose(ctx, confirm.Pending{TID: "heavy", ConfirmID: id, Variant: "v", Payload: big}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "B to hold the approvals", func() bool { return len(b.PendingFor("heavy")) == 2 })
	if err := b.Propose(ctx, confirm.Pending{TID: "light", ConfirmID: "l0", Variant: "v"}); err != nil {
		t.Fatalf("light session refused: %v", err)
	}
	for _, m := range ms {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := m.Wait(wctx, "heavy", "c0")
		cancel()
		if err != nil || r.Status != confirm.StatusRejected || r.Reason != confirm.ReasonTooManyPending {
			t.Fatalf("Wait = %+v, %v; want rejected/too-many-pending", r, err)
		}
	}
	waitFor(t, "A to hold the light session's approval", func() bool { return len(a.PendingFor("light")) == 1 })
	if n := expired.Load(); n != 1 {
		t.Fatalf("OnExpire ran %d times across the cluster, want 1", n)
	}
}
