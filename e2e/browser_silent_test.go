package e2e

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBrowserSilentPath: the path between a tab and its lapd node goes
// silent without a reset — the node's machine lost its power or its
// network, a laptop changed Wi-Fi. Nothing closes the browser's socket,
// and TCP would notice after minutes. lapd.js times its heartbeat: the
// first ping the silence swallows is not answered within its pong timeout,
// so the tab drops the socket (4000) after that one ping — not after two
// missed heartbeats — and reconnects on a fresh connection.
//
// A TCP proxy in front of lapd silences the connections open at that
// moment (it keeps reading both sides and passes nothing on, and closes
// nothing); a hook in the page counts the pings sent since the last pong.
func TestBrowserSilentPath(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--heartbeat", "4s") // pong timeout: half a heartbeat, 2 s
	px := newSilencer(t, strings.TrimPrefix(srv.URL, "http://"))
	tab := browserOpen(t, "http://"+px.addr()+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	if n := px.upgrades.Load(); n != 1 {
		t.Fatalf("%d WebSocket upgrades through the proxy, want the tab's 1", n)
	}

	var hooked bool
	tab.eval(`(() => {
  const send = WebSocket.prototype.send, close = WebSocket.prototype.close
  const seen = new WeakSet()
  const beat = window.__beat = { pings: 0, unanswered: 0, dropped: null }
  WebSocket.prototype.send = function (d) {
    if (!seen.has(this)) {
      seen.add(this)
      this.addEventListener('message', (ev) => { if (typeof ev.data === 'string' && ev.data.includes('"t":"pong"')) beat.unanswered = 0 })
    }
    if (typeof d === 'string' && d.includes('"t":"ping"')) { beat.pings++; beat.unanswered++ }
    return send.call(this, d)
  }
  WebSocket.prototype.close = function (code, reason) {
    if (!beat.dropped) beat.dropped = { code, unanswered: beat.unanswered, pings: beat.pings }
    return close.call(this, code, reason)
  }
  return true
})()`, &hooked)
	// One answered ping first: the hook sees the socket's pongs.
	tab.waitJS(`window.__beat.pings >= 1 && window.__beat.unanswered === 0`, 10*time.Second)

	px.silence()
	tab.waitJS(`window.__beat.dropped !== null`, 30*time.Second)
	var dropped struct {
		Code, Unanswered, Pings int
	}
	tab.eval(`window.__beat.dropped`, &dropped)
	if dropped.Code != 4000 || dropped.Unanswered != 1 {
		t.Fatalf("the tab dropped its socket with code %d after %d unanswered pings (of %d), want 4000 after the first unanswered one",
			dropped.Code, dropped.Unanswered, dropped.Pings)
	}
	// It reconnects on a fresh connection, and the tab is live again.
	tab.waitStatus("pending-claude", 20*time.Second)
	if n := px.upgrades.Load(); n != 2 {
		t.Fatalf("%d WebSocket upgrades through the proxy, want 2 (the tab reconnected once)", n)
	}
	tab.waitJS(`window.__beat.unanswered === 0 && window.__beat.pings > `+strconv.Itoa(dropped.Pings), 15*time.Second)
}

// silencer is a TCP proxy whose open connections can be silenced: from
// then on it reads both sides and passes nothing on, and closes nothing
// (a path lost without a reset). Connections made later are passed
// through.
type silencer struct {
	ln       net.Listener
	target   string
	upgrades atomic.Int64 // connections that began with a WebSocket upgrade to /agent/ws

	mu     sync.Mutex
	pipes  []*pipe
	closed bool
	wg     sync.WaitGroup
}

type pipe struct {
	a, b   net.Conn
	silent atomic.Bool
}

func newSilencer(t *testing.T, target string) *silencer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silencer{ln: ln, target: target}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *silencer) addr() string { return s.ln.Addr().String() }

func (s *silencer) accept() {
	defer s.wg.Done()
	for {
		a, err := s.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", s.target)
		if err != nil {
			a.Close()
			continue
		}
		p := &pipe{a: a, b: b}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			a.Close()
			b.Close()
			return
		}
		s.pipes = append(s.pipes, p)
		s.wg.Add(2)
		s.mu.Unlock()
		go s.copy(p, b, a, true)
		go s.copy(p, a, b, false)
	}
}

// copy passes src's bytes to dst until src ends (then closes dst's writing
// side), or, once p is silenced, reads and drops them and closes nothing.
func (s *silencer) copy(p *pipe, dst, src net.Conn, fromClient bool) {
	defer s.wg.Done()
	buf := make([]byte, 32<<10)
	first := fromClient
	for {
		n, err := src.Read(buf)
		if first && n > 0 {
			first = false
			if bytes.HasPrefix(buf[:n], []byte("GET /agent/ws")) {
				s.upgrades.Add(1)
			}
		}
		if n > 0 && !p.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && !p.silent.Load() {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			return
		}
	}
}

// silence makes every connection open now carry nothing more.
func (s *silencer) silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pipes {
		p.silent.Store(true)
	}
}

func (s *silencer) close() {
	s.mu.Lock()
	s.closed = true
	pipes := s.pipes
	s.mu.Unlock()
	s.ln.Close()
	for _, p := range pipes {
		p.a.Close()
		p.b.Close()
	}
	s.wg.Wait()
}
