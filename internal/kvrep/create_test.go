package kvrep_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/internal/kvrep"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// Create sends a create again when it was not answered (a JetStream
// cluster answers only one of several identical creates sent at once; the
// multi-process TestClusterJetStreamReplicas in e2e starts three nodes
// together to hit it), and only then.
func TestCreateRetriesAnUnansweredCreate(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Start(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	other := errors.New("stream name already in use with a different configuration")
	for _, tc := range []struct {
		name  string
		errs  []error // what each attempt answers; nil: success
		calls int
		ok    bool
	}{
		{"answered", []error{nil}, 1, true},
		{"unanswered once", []error{context.DeadlineExceeded, nil}, 2, true},
		{"nats timeout", []error{nats.ErrTimeout, nil}, 2, true},
		{"never answered", []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, nil}, 3, false},
		{"refused", []error{other, nil}, 1, false},
	} {
		calls := 0
		v, err := kvrep.Create(t.Context(), js, func(ctx context.Context) (string, error) {
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("%s: an attempt without a deadline", tc.name)
			}
			e := tc.errs[calls]
			calls++
			if e != nil {
				return "", e
			}
			return "bucket", nil
		})
		if calls != tc.calls || (err == nil) != tc.ok || (tc.ok && v != "bucket") {
			t.Errorf("%s: %d attempts, %q, %v; want %d attempts, ok=%v", tc.name, calls, v, err, tc.calls, tc.ok)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	_, err = kvrep.Create(ctx, js, func(context.Context) (int, error) { calls++; cancel(); return 0, context.DeadlineExceeded })
	if calls != 1 || err == nil {
		t.Errorf("after the caller's ctx ended: %d attempts, %v; want 1 and the error", calls, err)
	}
}
