package pairing

import (
	"net"
	"sync"
	"syscall"
)

// sock is the accepted socket as the WebSocket library sees it: the
// hijacked connection, whose reads go through a large read buffer that the
// tab holds only while it has unread bytes.
//
// Why: a tab answers an /observe with a ~13 KiB rpc-reply and, right after
// it, a log-append (as lapd.js does). Read through the library's small
// buffer, that was four read system calls (the small buffer, the rest of the
// reply, then the same two for the log-append). One read into 32 KiB takes
// the reply and, when it has arrived, the log-append too; the frames are then
// copied out of memory. Between frames the buffer goes back to a pool, so an
// idle tab holds none (see docs/PERFORMANCE.md, "Memory per idle paired
// tab") and the library's own buffer can be tiny (sockPeekSize).
//
// Where the descriptor is reachable (Unix), a read that would block waits in
// the runtime's poller without a buffer (fill), and the reader waits for the
// next frame there (wait), in a small stack frame, as waitReadable did.
// Elsewhere reads go to the connection as they are.
type sock struct {
	net.Conn
	rc syscall.RawConn // nil: read Conn directly

	mu   sync.Mutex
	buf  *[]byte // nil while nothing is buffered
	r, w int     // unread bytes are (*buf)[r:w]
	err  error   // what the read that filled buf ended with, reported after its bytes
}

// Read sizes: sockBufSize is the pooled read buffer (a read this large or
// larger goes to the socket directly); sockPeekSize is the library's own
// bufio.Reader, which only ever copies frame headers out of sock's buffer.
const (
	sockBufSize  = 32 << 10
	sockPeekSize = 16 // bufio's minimum
)

var sockBufPool = sync.Pool{New: func() any { b := make([]byte, sockBufSize); return &b }}

// init points s at nc. early is what the client sent after its upgrade
// request and net/http had already read: it is read first.
func (s *sock) init(nc net.Conn, early []byte) {
	s.Conn = nc
	if sc, ok := nc.(syscall.Conn); ok && rawReads {
		if rc, err := sc.SyscallConn(); err == nil {
			s.rc = rc
		}
	}
	if len(early) > 0 {
		b := append([]byte(nil), early...)
		s.buf, s.r, s.w = &b, 0, len(b)
	}
}

// Read reads buffered bytes, or fills the buffer from the socket (waiting
// for it if need be) and reads from it; a read of sockBufSize or more with
// nothing buffered goes to the socket directly.
func (s *sock) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if s.r < s.w {
			n := copy(p, (*s.buf)[s.r:s.w])
			s.r += n
			if s.r == s.w {
				s.releaseLocked()
			}
			s.mu.Unlock()
			return n, nil
		}
		if err := s.err; err != nil {
			s.err = nil
			s.mu.Unlock()
			return 0, err
		}
		s.mu.Unlock()
		if s.rc == nil || len(p) >= sockBufSize {
			return s.Conn.Read(p)
		}
		if err := s.fill(); err != nil {
			return 0, err
		}
	}
}

// buffered is how many bytes wait in s.
func (s *sock) buffered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w - s.r
}

// pending reports whether a Read would return without touching the socket:
// bytes, or a read error (EOF included), wait in s.
func (s *sock) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r < s.w || s.err != nil
}

// releaseLocked gives the drained buffer back. Caller holds s.mu.
func (s *sock) releaseLocked() {
	if s.buf != nil && cap(*s.buf) == sockBufSize {
		sockBufPool.Put(s.buf)
	}
	s.buf, s.r, s.w = nil, 0, 0
}

// release drops whatever is buffered (the socket has ended).
func (s *sock) release() {
	s.mu.Lock()
	s.releaseLocked()
	s.mu.Unlock()
}

// wait blocks until s has bytes buffered, or a read error (EOF included)
// to report, or the read deadline passes; it returns at once when s cannot
// wait without reading (no descriptor).
func (s *sock) wait() {
	if s.rc != nil {
		_ = s.fill()
	}
}
