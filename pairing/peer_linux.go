//go:build linux

package pairing

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerSockopt sets TCP_USER_TIMEOUT on a peer-link socket: data the other
// machine has not acknowledged within peerUserTimeout ends the connection
// (and bounds the keep-alive probes the same way), where TCP alone would
// retransmit for about 15 minutes.
func peerSockopt(rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(peerUserTimeout.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}
