//go:build !linux

package pairing

import "net"

// parker never parks outside Linux: every tab keeps its reader goroutine.
type parker struct{}

func (p *parker) init(*Registry)  {}
func (p *parker) park(*conn) bool { return false }
func (p *parker) unpark(*conn)    {}
func (p *parker) stop()           {}
func (p *parker) closeFDs()       {}
func (p *parker) count() int      { return 0 }
func connFD(net.Conn) int         { return -1 }
