//go:build !unix

package pairing

import "net"

// open: without a non-blocking peek, an idle connection is taken as open
// (a closed one then fails the request that uses it: in doubt for a call).
func open(net.Conn) bool { return true }
