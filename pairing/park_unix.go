//go:build unix

package pairing

import (
	"net"
	"syscall"
)

// waitReadable blocks until nc has a byte to read, an EOF or an error,
// without reading anything: a non-blocking MSG_PEEK receive tells data
// apart from "nothing yet", and the runtime's poller waits in between.
// A connection without a file descriptor returns at once.
func waitReadable(nc net.Conn) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	var b [1]byte
	woke := false
	_ = rc.Read(func(fd uintptr) bool {
		if woke {
			// The poller said the socket is readable: trust it rather
			// than peek again (a spurious wake-up only means the next
			// read waits inside the library, as before).
			return true
		}
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if n > 0 || err != syscall.EAGAIN {
			return true
		}
		woke = true // we wait now; the next call follows a wake-up
		return false
	})
}
