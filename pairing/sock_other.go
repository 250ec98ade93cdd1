//go:build !unix

package pairing

// rawReads: sock reads through the connection (no descriptor reads here).
const rawReads = false

// fill is never called without rawReads (sock.rc stays nil).
func (s *sock) fill() error { return nil }
