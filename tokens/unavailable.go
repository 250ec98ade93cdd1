package tokens

import "github.com/lapd-dev/lapd/internal/storeerr"

// Unavailable reports whether err says the store did not answer, rather
// than refused: a request that timed out, found no responder (a JetStream
// stream between leaders: the seconds of an election after a NATS server
// is lost), or a connection to NATS that is closed or reconnecting. Such a
// call may succeed if retried in a few seconds; the LAP server answers it
// 503 with Retry-After instead of 500. It is the classifier every lapd
// store shares (the approvals and the MCP bindings fail the same way on
// NATS); kept here for callers of the token store.
func Unavailable(err error) bool { return storeerr.Unavailable(err) }
