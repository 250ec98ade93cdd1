//go:build unix

package pairing

import (
	"errors"
	"net"
	"syscall"
)

// peerOpen reports whether an idle connection's peer has neither closed it nor
// sent anything: a peek that does not wait (a read deadline in the past
// would not do: Go refuses the read before asking the kernel).
func peerOpen(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = n < 0 && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK))
		return true // done: never wait here
	})
	return err == nil && alive
}
