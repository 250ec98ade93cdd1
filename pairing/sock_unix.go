//go:build unix

package pairing

import (
	"io"
	"net"
	"syscall"
)

// rawReads: sock reads the descriptor itself (see fill).
const rawReads = true

// fill reads what the socket has into a pooled buffer, waiting in the
// runtime's poller (holding no buffer) until it has something. It returns
// the wait's error: the read deadline, or the connection closed.
func (s *sock) fill() error {
	return s.rc.Read(func(fd uintptr) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.r < s.w || s.err != nil {
			return true // filled meanwhile (the close handshake reads too)
		}
		b := sockBufPool.Get().(*[]byte)
		var n int
		var err error
		for {
			n, err = syscall.Read(int(fd), *b)
			if err != syscall.EINTR {
				break
			}
		}
		if err == syscall.EAGAIN {
			sockBufPool.Put(b)
			return false // wait for the poller
		}
		switch {
		case err != nil:
			sockBufPool.Put(b)
			s.err = &net.OpError{Op: "read", Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
		case n == 0:
			sockBufPool.Put(b)
			s.err = io.EOF
		default:
			s.buf, s.r, s.w = b, 0, n
		}
		return true
	})
}
