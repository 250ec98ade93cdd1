package storeerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("kv put: %w", nats.ErrNoResponders), true},
		{fmt.Errorf("kv get: %w", context.DeadlineExceeded), true},
		{nats.ErrTimeout, true},
		{jetstream.ErrNoStreamResponse, true},
		{nats.ErrConnectionClosed, true},
		{nats.ErrConnectionReconnecting, true},
		{nats.ErrDisconnected, true},
		{context.Canceled, false}, // the caller left: not the store's fault
		{jetstream.ErrKeyNotFound, false},
		{jetstream.ErrKeyExists, false}, // a compare-and-set conflict
		{errors.New("invalid character 'x' looking for beginning of value"), false},
	} {
		if got := storeerr.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
