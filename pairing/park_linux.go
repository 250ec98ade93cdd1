//go:build linux

package pairing

import (
	"net"
	"sync"
	"syscall"
)

// parker holds idle tabs' sockets without a goroutine each (Linux: one
// epoll instance and one goroutine for all of them).
//
// Why: a goroutine blocked in a read costs at least a 4 KiB stack (the
// runtime does not shrink a used stack below that), and an idle tab's heap
// is about 4 KiB, so parking halves what 10,000 idle tabs cost (see
// docs/PERFORMANCE.md). A tab whose reader found nothing to read for a
// registry tick (see Registry.loop) is parked: its file descriptor is added
// to the epoll set (one-shot) and the reader goroutine exits; when the tab
// sends anything (or closes), the poller starts a new reader. A busy tab
// never parks, so the hot path pays nothing for this.
//
// Every close lapd makes of a socket unparks it first (conn.close), so a
// descriptor is never closed while it is in the set.
type parker struct {
	r *Registry

	mu      sync.Mutex
	epfd    int // -1 until the first park
	stopR   int // read end of the pipe that stops the poller
	stopW   int
	conns   map[int32]*conn // parked, by epoll event data
	next    int32
	failed  bool // epoll unavailable: never park
	stopped bool
}

func (p *parker) init(r *Registry) { p.r, p.epfd = r, -1 }

// startLocked creates the epoll set and starts the poller. Caller holds p.mu.
func (p *parker) startLocked() bool {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		p.failed = true
		return false
	}
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		p.failed = true
		return false
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: 0} // data 0: stop
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fds[0], &ev); err != nil {
		syscall.Close(epfd)
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		p.failed = true
		return false
	}
	p.epfd, p.stopR, p.stopW = epfd, fds[0], fds[1]
	p.conns = map[int32]*conn{}
	p.r.wg.Add(1)
	go p.run(epfd)
	return true
}

// park adds c's socket to the set; false means c must keep reading with a
// goroutine (closing, or epoll unavailable). After true the caller's
// goroutine must not touch c again: the poller may resume c at once.
func (p *parker) park(c *conn) bool {
	if c.fd < 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed || p.stopped || (p.epfd < 0 && !p.startLocked()) {
		return false
	}
	c.mu.Lock()
	if c.closing || c.gone {
		c.mu.Unlock()
		return false
	}
	for {
		p.next++
		if p.next <= 0 {
			p.next = 1
		}
		if p.conns[p.next] == nil {
			break
		}
	}
	id := p.next
	c.parkID = id
	c.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: id}
	if err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		c.parkID = 0
		return false
	}
	p.conns[id] = c
	return true
}

// unpark resumes c's reader if c is parked (before lapd closes its socket).
func (p *parker) unpark(c *conn) {
	p.mu.Lock()
	id := c.parkID
	if id == 0 || p.conns[id] != c {
		p.mu.Unlock()
		return
	}
	delete(p.conns, id)
	c.parkID = 0
	// The descriptor is open (lapd has not closed it yet): remove it.
	_ = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
	p.mu.Unlock()
	go c.serve()
}

// run is the poller: it resumes the reader of every socket that has
// something to read, until stop.
func (p *parker) run(epfd int) {
	defer p.r.wg.Done()
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			p.r.cfg.Logger.Error("pairing: the idle-tab poller failed; parked tabs resume", "err", err)
			p.mu.Lock()
			p.failed = true
			p.mu.Unlock()
			p.resumeAll()
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd == 0 {
				p.resumeAll()
				return
			}
			p.mu.Lock()
			c := p.conns[ev.Fd]
			if c != nil {
				delete(p.conns, ev.Fd)
				c.parkID = 0
				_ = syscall.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
			}
			p.mu.Unlock()
			if c != nil {
				go c.serve()
			}
		}
	}
}

// count is how many sockets are parked.
func (p *parker) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// resumeAll starts a reader for every parked socket.
func (p *parker) resumeAll() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[int32]*conn{}
	for _, c := range conns {
		c.parkID = 0
		_ = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
	}
	p.mu.Unlock()
	for _, c := range conns {
		go c.serve()
	}
}

// stop makes the poller resume every parked socket and exit; later parks
// fail. The registry's WaitGroup covers the poller.
func (p *parker) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	if p.epfd >= 0 {
		_, _ = syscall.Write(p.stopW, []byte{1})
	}
}

// closeFDs releases the epoll set after the poller has exited.
func (p *parker) closeFDs() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.epfd >= 0 {
		syscall.Close(p.epfd)
		syscall.Close(p.stopR)
		syscall.Close(p.stopW)
		p.epfd = -1
	}
}

// connFD returns nc's file descriptor, or -1.
func connFD(nc net.Conn) int {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}
