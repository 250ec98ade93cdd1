package tokens

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Unavailable reports whether err says the store did not answer, rather
// than refused: a request that timed out, found no responder (a JetStream
// stream between leaders: the seconds of an election after a NATS server
// is lost), or a connection to NATS that is closed or reconnecting. Such a
// call may succeed if retried in a few seconds; the LAP server answers it
// 503 with Retry-After instead of 500.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	for _, t := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
		nats.ErrConnectionClosed, nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrConnectionDraining} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
