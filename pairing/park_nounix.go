//go:build !unix

package pairing

import "net"

// waitReadable returns at once where the socket cannot be peeked at: the
// reader then waits inside the WebSocket library, as usual.
func waitReadable(net.Conn) {}
