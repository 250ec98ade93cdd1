package kvrep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/internal/kvrep"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// While the connection to NATS is down, a write (or a read from the bucket)
// fails at once with nats.ErrDisconnected, whatever the caller's deadline,
// instead of waiting for it in nats.go's reconnect buffer; the replica's
// memory still answers.
func TestWritesFailAtOnceWhileDisconnected(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	nc := ns.Connect(t)
	r, err := kvrep.Open(t.Context(), kvrep.Config[string]{Conn: nc, Bucket: "down", Prefix: "k.",
		Decode: func(_ string, b []byte) (string, error) { return string(b), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rev, err := r.Put(t.Context(), "k.a", []byte("1"), "1")
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	deadline := time.Now().Add(10 * time.Second)
	for nc.Status() != nats.RECONNECTING {
		if time.Now().After(deadline) {
			t.Fatalf("the client did not notice the server was gone: %v", nc.Status())
		}
		time.Sleep(5 * time.Millisecond) // the client's state: no signal to await
	}
	// A deadline far beyond the test's: only an immediate error passes.
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	_, errPut := r.Put(ctx, "k.a", []byte("2"), "2")
	_, errUpd := r.Update(ctx, "k.a", []byte("2"), "2", rev)
	_, errCre := r.Create(ctx, "k.b", []byte("2"), "2")
	errDel := r.Delete(ctx, "k.a", 0)
	_, _, errRef := r.Refresh(ctx, "k.c")
	for name, err := range map[string]error{"Put": errPut, "Update": errUpd, "Create": errCre, "Delete": errDel, "Refresh": errRef} {
		if !errors.Is(err, nats.ErrDisconnected) {
			t.Errorf("%s while disconnected = %v, want nats.ErrDisconnected", name, err)
		}
	}
	if it, ok := r.Get("k.a"); !ok || it.V != "1" {
		t.Errorf("Get from memory while disconnected = %+v, %v", it, ok)
	}
}
