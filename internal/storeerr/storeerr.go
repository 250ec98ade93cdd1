// Package storeerr classifies the errors of lapd's cluster stores: the token
// store, the approvals (confirm) store and the MCP session bindings all keep
// their records in JetStream key-value buckets, and all fail the same way
// while NATS cannot answer (a stream electing a leader after a server is
// lost, the connection down or reconnecting). Those failures are transient:
// the same call may succeed in a few seconds, so lapd answers them as 503
// unavailable with Retry-After (LAP) or as a "retry in 2 s" tool error
// (MCP), never as a 500. The classifier lives here, under internal/, rather
// than in one of the stores' packages, because it is about NATS and not
// about tokens or approvals: tokens, confirm, lap and mcp all use it, and
// none of them should import another only for it.
package storeerr

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RetryAfterMs is how long lapd tells a caller to wait before it retries a
// call that failed Unavailable (the LAP retryAfterMs, Retry-After: 2).
const RetryAfterMs = 2000

// transient are the errors that say the store did not answer.
var transient = []error{
	context.DeadlineExceeded, // a request that timed out (nats.go's and jetstream's own timeouts end this way too)
	nats.ErrTimeout,
	nats.ErrNoResponders, // no stream leader: the seconds of an election
	jetstream.ErrNoStreamResponse,
	nats.ErrConnectionClosed,
	nats.ErrConnectionReconnecting,
	nats.ErrDisconnected,
	nats.ErrConnectionDraining,
}

// Unavailable reports whether err says the store did not answer, rather
// than refused: a request that timed out, found no responder (a JetStream
// stream between leaders: the seconds of an election after a NATS server
// is lost), or a connection to NATS that is closed or reconnecting. Such a
// call may succeed if retried in a few seconds.
//
// context.DeadlineExceeded counts: a caller that passes a ctx with its own
// deadline must check ctx.Err() itself to tell "my deadline passed" from
// "the store did not answer".
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	for _, t := range transient {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
