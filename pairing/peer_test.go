package pairing

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// pairedPeers returns two nodes with the link, a tab on A, and B having
// learnt A's link (an admit).
func pairedPeers(t *testing.T) (a, b *env, tb *tab, tid string) {
	t.Helper()
	return pairedPeersVia(t, viaPeer)
}

func pairedPeersVia(t *testing.T, link linkMode) (a, b *env, tb *tab, tid string) {
	t.Helper()
	es := clusterEnvs(t, 2, link)
	a, b = es[0], es[1]
	tok, tid := a.mint("u")
	tb = a.pair(tok)
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("B.Admit = %v %v", paired, err)
	}
	if b.reg.cl.peerOf(tid) == nil {
		t.Fatal("B did not learn A's link from the admit")
	}
	return a, b, tb, tid
}

// callVia runs b.Call in the background.
func callVia(t *testing.T, e *env, tid, tool string, timeout time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := e.reg.Call(ctxT(t), tid, tool, nil, timeout)
		done <- err
	}()
	return done
}

// Calls on the link do not touch NATS: B publishes nothing while it
// forwards them.
func TestPeerLinkBypassesNATS(t *testing.T) {
	t.Parallel()
	_, b, tb, tid := pairedPeers(t)
	before := b.reg.cl.nc.Stats().OutMsgs
	for i := range 5 {
		done := make(chan error, 1)
		var res json.RawMessage
		go func() {
			var err error
			res, err = b.reg.Call(ctxT(t), tid, "get_state", nil, 0)
			done <- err
		}()
		tb.answerNext(`{"i":` + string(rune('0'+i)) + `}`)
		if err := recv(t, done); err != nil || string(res) != `{"i":`+string(rune('0'+i))+`}` {
			t.Fatalf("call %d = %s, %v", i, res, err)
		}
	}
	if n := b.reg.cl.nc.Stats().OutMsgs - before; n != 0 {
		t.Fatalf("B published %d NATS messages for 5 calls on the link", n)
	}
	if st := b.reg.Stats().Cluster; st.Direct != 5 {
		t.Fatalf("B's stats %+v, want 5 direct", st)
	}
}

// A connection lost with a call on it: the call is in doubt (the owner may
// have sent the frame), answered once; the next call dials again.
func TestPeerLinkLostInDoubt(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	done := callVia(t, b, tid, "slow", 10*time.Second)
	f := tb.expect("rpc") // the frame reached the tab
	a.reg.cl.peer.mu.Lock()
	for nc := range a.reg.cl.peer.inbound {
		_ = nc.Close()
	}
	a.reg.cl.peer.mu.Unlock()
	err := recv(t, done)
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrPaused) {
		t.Fatalf("call whose link was lost = %v, want paused and in doubt (the tab may have run it)", err)
	}
	// The tab answers late: A cannot deliver it (the connection is gone).
	tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": json.RawMessage(`{}`)})
	done = callVia(t, b, tid, "again", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("call after the link was lost = %v", err)
	}
	// An idle connection the owner closed meanwhile (a node that restarted
	// its link) is not written on: the call takes a fresh one, not in doubt.
	closeInbound(a)
	sent := b.reg.Stats().Cluster.Direct
	done = callVia(t, b, tid, "after-close", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("call after the owner closed the idle connection = %v", err)
	}
	if d := b.reg.Stats().Cluster.Direct - sent; d != 1 {
		t.Fatalf("%d requests sent on the link for one call", d)
	}
}

// closeInbound closes every connection e's link accepted, and waits until
// their goroutines let go of them.
func closeInbound(e *env) {
	l := e.reg.cl.peer
	l.mu.Lock()
	for nc := range l.inbound {
		_ = nc.Close()
	}
	l.mu.Unlock()
	for {
		l.mu.Lock()
		n := len(l.inbound)
		l.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// A node the link cannot reach: requests go by NATS and succeed.
func TestPeerLinkFallsBackToNATS(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	info := a.reg.cl.peer.info
	info.Node = "gone"
	info.Addr = dead
	b.reg.cl.setPeer(tid, b.reg.cl.peer.learn(&info), nil)
	done := callVia(t, b, tid, "get_state", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("call with an unreachable link = %v", err)
	}
	if st := b.reg.Stats().Cluster; st.Fallbacks != 1 {
		t.Fatalf("B's stats %+v, want one fallback", st)
	}
}

// B still names A's link for a tab that moved to C: A answers "moved"
// without doing anything, and the request goes by NATS to C.
func TestPeerLinkMoved(t *testing.T) {
	t.Parallel()
	es := clusterEnvs(t, 3, viaPeer)
	a, b, c := es[0], es[1], es[2]
	tok, tid := c.mint("u")
	tb := c.pair(tok)
	var asked atomic.Int32
	h := *a.reg.hooks.Load()
	h.OnAdmit = func(string) (bool, int64) { asked.Add(1); return true, 0 }
	a.reg.SetHooks(h)
	b.reg.cl.setPeer(tid, b.reg.cl.peer.learn(&a.reg.cl.peer.info), nil)
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil { // by A's link: moved, then NATS
		t.Fatalf("Admit = %v %v", paired, err)
	}
	if asked.Load() != 0 {
		t.Fatal("A ran the admit of a tab it does not hold")
	}
	if p := b.reg.cl.peerOf(tid); p == nil || p.node != c.reg.cl.node {
		t.Fatalf("B's link for the tab after the admit: %+v, want C's", p)
	}
	done := callVia(t, b, tid, "get_state", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	if st := b.reg.Stats().Cluster; st.Fallbacks != 1 || st.Direct != 2 {
		t.Fatalf("B's stats %+v, want 1 fallback (the moved admit) and 2 direct", st)
	}
}

// The handshake: a client without the key, or asking for another node, is
// refused and audited before any request is read; a server without the key
// cannot pass as the node.
func TestPeerLinkHandshake(t *testing.T) {
	t.Parallel()
	a, _, _, _ := pairedPeers(t)
	l := a.reg.cl.peer
	for _, node := range []string{l.info.Node, "n9"} {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		// A client without the key answers the challenge with a guess.
		_, _ = io.WriteString(nc, peerProto+" "+node+" "+nonce()+"\n")
		br := bufio.NewReader(nc)
		_, _ = readLine(br)
		_, _ = io.WriteString(nc, mac(make([]byte, 32), "c", "x", "y")+"\n")
		// Nothing is served on a refused connection: no "ok", no reply.
		f := binary.BigEndian.AppendUint32(nil, 20)
		_, _ = nc.Write(append(f, make([]byte, 20)...))
		if rest, _ := io.ReadAll(br); len(rest) != 0 {
			t.Fatalf("node %q: the refused connection answered %q", node, rest)
		}
		_ = nc.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.reg.Stats().Cluster.PeerRefused != 2 || len(a.sink.find("auth-failed")) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("refusals %d, audited %v", a.reg.Stats().Cluster.PeerRefused, a.sink.find("auth-failed"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := a.sink.find("auth-failed")[0].Detail; d["endpoint"] != "peer-link" {
		t.Fatalf("audit detail %v", d)
	}

	// An impostor at the address (answers the challenge without the key).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		_, _ = readLine(bufio.NewReader(nc))
		_, _ = io.WriteString(nc, nonce()+" "+mac(make([]byte, 32), "s", "x", "y")+"\n")
		_, _ = io.Copy(io.Discard, nc)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := clientHandshake(nc, bufio.NewReader(nc), "n0", l.key); err == nil || !strings.Contains(err.Error(), "does not hold the key") {
		t.Fatalf("handshake with an impostor = %v", err)
	}
}

// Shutdown with the link busy ends every goroutine (TestMain's leak check)
// and answers the call in flight once.
func TestPeerLinkShutdown(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	done := callVia(t, b, tid, "slow", 10*time.Second)
	tb.expect("rpc")
	if err := a.reg.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, done); !errors.Is(err, ErrPaused) {
		t.Fatalf("call in flight when the tab's node shut down = %v, want paused", err)
	}
	if err := b.reg.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// Frames from a peer are parsed without panicking, whatever their bytes
// (readFrame passes at least 4 bytes of a request, 2 of an answer).
func FuzzPeerFrames(f *testing.F) {
	f.Add([]byte{1, 4, 'c', 'a', 'l', 'l', 0, 1, 't', '{', '}'})
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, '{', '}', '0', '1'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 {
			var pr peerReq
			if parseRequest(b, &pr) && len(pr.op)+len(pr.tid)+len(pr.body) > len(b) {
				t.Fatal("request fields longer than the frame")
			}
		}
		if len(b) >= 2 {
			if a, ok := parseAnswer(b); ok && len(a.body)+len(a.health) > len(b) {
				t.Fatal("answer fields longer than the frame")
			}
		}
	})
}

// A peer that takes requests and never answers (a machine gone without a
// reset): the call ends in doubt after its deadline, and the node is not
// used for a while: the next request goes by NATS and succeeds.
func TestPeerLinkSilentPeer(t *testing.T) {
	t.Parallel()
	_, b, tb, tid := pairedPeers(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ghost := &peerLink{info: peerInfo{Node: "ghost"}, key: make([]byte, 32)}
	ghost.key[0] = 7
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				if ghost.serverHandshake(nc, br) == nil {
					_, _ = io.Copy(io.Discard, br) // takes requests, answers none
				}
			}()
		}
	}()
	b.reg.cl.setPeer(tid, b.reg.cl.peer.learn(&peerInfo{Node: "ghost", Addr: ln.Addr().String(), Key: hex.EncodeToString(ghost.key)}), nil)
	ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	if _, err := b.reg.Call(ctx, tid, "get_state", nil, 0); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("call to a silent peer = %v, want the deadline, in doubt", err)
	}
	done := callVia(t, b, tid, "get_state", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("the next call = %v", err)
	}
	if st := b.reg.Stats().Cluster; st.Fallbacks != 1 {
		t.Fatalf("B's stats %+v, want the next call by NATS", st)
	}
}

// What the owner keeps past a request on the link (a log entry, a frame
// queued for the tab) is its own copy, not the connection's read buffer,
// which the next requests reuse.
func TestPeerLinkKeepsCopies(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	if err := b.reg.AppendLog(tid, json.RawMessage(`{"id":"kept-1","kind":"narrate","text":"`+strings.Repeat("k", 300)+`"}`)); err != nil {
		t.Fatal(err)
	}
	for range 3 { // requests that reuse the pooled buffers
		done := callVia(t, b, tid, "get_state", 0)
		tb.answerNext(`{"s":"` + strings.Repeat("x", 2000) + `"}`)
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
	}
	log := a.reg.RecentLog(tid, 10, "")
	found := false
	for _, e := range log {
		if strings.Contains(string(e), `"kept-1"`) && strings.Contains(string(e), strings.Repeat("k", 300)) {
			found = true
		}
	}
	if !found {
		t.Fatalf("the entry appended via B is not intact on A: %s", log)
	}
}

// The hand-written codec of a forwarded request's body agrees with
// encoding/json: decodeCallReq accepts, refuses and decodes what
// json.Unmarshal does, and appendCallReq writes what decodes back to the
// value (args compared as JSON: json.Marshal compacts and escapes them).
func FuzzCallReq(f *testing.F) {
	f.Add([]byte(`{"tool":"observe","args":{"aspects":["state"]},"timeoutMs":15000,"waitMs":14999,"rid":"r1"}`), "observe", "/a/b", int64(5))
	f.Add([]byte(`{"path":"/todos","waitMs":3000}`), "x\"<y>", "", int64(-1))
	f.Add([]byte(`{"Tool":"X","n":1.5}`), "", "é\u2028", int64(0))
	f.Add([]byte(`{"probe":true,"n":-0,"kind":null}`), "t", "k", int64(1<<40))
	f.Add([]byte(`{"args":null,"expect":"e","tool":"a","tool":"b"}`), "", "", int64(0))
	f.Fuzz(func(t *testing.T, data []byte, s1, s2 string, n int64) {
		var got, want callReq
		gerr, werr := decodeCallReq(data, &got), json.Unmarshal(data, &want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("decode %q: %v; json.Unmarshal: %v", data, gerr, werr)
		}
		if gerr == nil && !sameCallReq(got, want) {
			t.Fatalf("decode %q = %+v; json.Unmarshal %+v", data, got, want)
		}
		in := callReq{Tool: s1, Path: s2, Kind: s1, RID: s2, Expect: s1, TimeoutMs: n, WaitMs: -n, N: int(int32(n)), Probe: n%2 == 0}
		if json.Valid(data) {
			in.Args = json.RawMessage(data)
		}
		// What json.Marshal writes, decoded, is what appendCallReq's output
		// must decode to (invalid UTF-8 becomes U+FFFD in both).
		enc := appendCallReq(nil, &in)
		m, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var back, viaJSON callReq
		if err := json.Unmarshal(m, &viaJSON); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(enc, &back); err != nil || !sameCallReq(back, viaJSON) {
			t.Fatalf("appendCallReq(%+v) = %s: decodes to %+v, %v; json.Marshal's %s to %+v", in, enc, back, err, m, viaJSON)
		}
	})
}

func sameCallReq(a, b callReq) bool {
	aa, ba := a.Args, b.Args
	a.Args, b.Args = nil, nil
	return reflect.DeepEqual(a, b) && sameAsJSON(aa, ba)
}

// sameAsJSON: both nil, or both the same JSON value.
func sameAsJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

// With TLS the bytes between the nodes are encrypted (a state the tab
// answers with does not appear in them, as it does in plain TCP), and the
// link works as in plain TCP: calls go node to node, not by NATS.
func TestPeerLinkTLSEncrypts(t *testing.T) {
	t.Parallel()
	for _, link := range []linkMode{viaPeer, viaPeerTLS} {
		t.Run(link.String(), func(t *testing.T) {
			t.Parallel()
			a, b, tb, tid := pairedPeersVia(t, link)
			info := a.reg.cl.peer.info
			if (info.Cert != "") != (link == viaPeerTLS) {
				t.Fatalf("A publishes cert %q with %v", info.Cert, link)
			}
			// B reaches A through a proxy that keeps what crosses it.
			seen := tapProxy(t, info.Addr)
			via := info
			via.Addr = seen.addr
			p := b.reg.cl.peer.learn(&via)
			b.reg.cl.setPeer(tid, p, nil)
			before := b.reg.cl.nc.Stats().OutMsgs
			const secret = "s3cr3t-state-marker"
			done := callVia(t, b, tid, "get_state", 0)
			tb.answerNext(`{"note":"` + secret + `"}`)
			if err := recv(t, done); err != nil {
				t.Fatal(err)
			}
			if n := b.reg.cl.nc.Stats().OutMsgs - before; n != 0 {
				t.Fatalf("B published %d NATS messages for a call on the link", n)
			}
			got := seen.bytes()
			if len(got) == 0 {
				t.Fatal("nothing crossed the proxy: the call did not take the link")
			}
			if in := bytes.Contains(got, []byte(secret)); in != (link == viaPeer) {
				t.Fatalf("%v: the state crossed the link in clear: %v", link, in)
			}
		})
	}
}

// A client that does not speak TLS to a TLS link is refused and audited;
// a TLS server at the address without the published certificate is not
// trusted: the dial fails (the requests go by NATS).
func TestPeerLinkTLSRefusals(t *testing.T) {
	t.Parallel()
	a, b, _, tid := pairedPeersVia(t, viaPeerTLS)
	l := a.reg.cl.peer
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(nc, peerProto+" "+l.info.Node+" "+nonce()+"\n")
	_, _ = io.ReadAll(nc)
	_ = nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(a.sink.find("auth-failed")) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("audited %v, want one auth-failed", a.sink.find("auth-failed"))
		}
		time.Sleep(10 * time.Millisecond) // audit entries arrive off the connection's goroutine
	}

	// An impostor: a TLS server of its own at the address.
	cert, _, err := selfSigned("impostor")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	via := l.info
	via.Addr = ln.Addr().String()
	p := b.reg.cl.peer.learn(&via)
	if _, err := p.dial(); err == nil || !strings.Contains(err.Error(), "does not hold the certificate") {
		t.Fatalf("dial to a TLS server with another certificate = %v", err)
	}
	_ = tid
}

func TestPeerTLSOn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode, addr string
		want       bool
	}{
		{"", "127.0.0.1:7422", false}, {"auto", "[::1]:7422", false}, {"auto", "localhost:7422", false},
		{"", "10.0.0.5:7422", true}, {"auto", "node-a.internal:7422", true},
		{"on", "127.0.0.1:7422", true}, {"off", "10.0.0.5:7422", false},
	} {
		if got, err := peerTLSOn(c.mode, c.addr); err != nil || got != c.want {
			t.Errorf("peerTLSOn(%q, %q) = %v, %v; want %v", c.mode, c.addr, got, err, c.want)
		}
	}
	if _, err := peerTLSOn("yes", "10.0.0.5:7422"); err == nil {
		t.Error("peerTLSOn accepted mode yes")
	}
}

// tap is a TCP proxy to one address that keeps every byte it forwards.
type tap struct {
	addr string
	mu   sync.Mutex
	buf  []byte
}

func (tp *tap) bytes() []byte {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]byte(nil), tp.buf...)
}

func (tp *tap) Write(p []byte) (int, error) {
	tp.mu.Lock()
	tp.buf = append(tp.buf, p...)
	tp.mu.Unlock()
	return len(p), nil
}

func tapProxy(t *testing.T, to string) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			// Kept before passed on: what a side has received, the tap has.
			go func() { defer wg.Done(); _, _ = io.Copy(io.MultiWriter(tp, up), c); _ = up.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(io.MultiWriter(tp, c), up); _ = c.Close() }()
		}
	}()
	return tp
}

// A flood of refused connections from one address is audited within its
// budget (as the LAP gate's refusals): counted, not written one by one.
func TestPeerLinkRefusalFloodAudited(t *testing.T) {
	t.Parallel()
	a, _, _, _ := pairedPeers(t)
	l := a.reg.cl.peer
	const n = 40
	for range n {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\n\r\n")
		_, _ = io.ReadAll(nc) // the node closes it
		_ = nc.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.reg.Stats().Cluster.PeerRefused != n {
		if time.Now().After(deadline) {
			t.Fatalf("refusals counted %d, want %d", a.reg.Stats().Cluster.PeerRefused, n)
		}
		time.Sleep(10 * time.Millisecond) // polling a counter
	}
	if got := len(a.sink.find("auth-failed")); got == 0 || got > n/2 {
		t.Fatalf("%d refusals written as %d auth-failed entries: want the first few, the rest counted", n, got)
	}
}

// New inbound connections are rationed per address: a burst, then a rate;
// another address has its own.
func TestPeerLinkConnectionRate(t *testing.T) {
	t.Parallel()
	l := &peerLink{perIP: map[string]*connBucket{}}
	t0 := time.Unix(1000, 0)
	for i := range peerConnBurst {
		if !l.allowLocked("10.0.0.9", t0) {
			t.Fatalf("connection %d of a burst refused", i)
		}
	}
	if l.allowLocked("10.0.0.9", t0) {
		t.Fatal("a connection past the burst allowed")
	}
	if !l.allowLocked("10.0.0.5", t0) {
		t.Fatal("another address refused")
	}
	n := 0
	for l.allowLocked("10.0.0.9", t0.Add(time.Second)) {
		n++
	}
	if n != peerConnRate {
		t.Fatalf("%d connections a second later, want %d", n, peerConnRate)
	}
}

// Idle connections are kept while used (more than peerIdle after a burst
// of concurrent calls: no dial per call), and trimmed to peerIdle once
// the extra ones stay unused for peerIdleTTL.
func TestPeerIdleConnections(t *testing.T) {
	t.Parallel()
	p := &peer{}
	conn := func() *peerConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		p.mu.Lock()
		p.open++
		p.mu.Unlock()
		return &peerConn{raw: a}
	}
	const burst = peerIdle + 8
	for range burst {
		p.put(conn())
	}
	if len(p.idle) != burst || p.open != burst {
		t.Fatalf("after a burst: %d idle, %d open; want %d kept", len(p.idle), p.open, burst)
	}
	for _, pc := range p.idle {
		pc.used = pc.used.Add(-peerIdleTTL - time.Second)
	}
	p.put(conn())
	if len(p.idle) != peerIdle || p.open != peerIdle {
		t.Fatalf("after the burst went idle: %d idle, %d open; want %d", len(p.idle), p.open, peerIdle)
	}
	if !p.idle[len(p.idle)-1].used.After(p.idle[0].used) {
		t.Fatal("the connection just used is not last (taken first)")
	}
}

// A takeover announced by the node this node already sends tid's requests
// to (it may arrive after the admit reply that named the link) keeps the
// link; one from another node drops what was known, and the next request
// goes by NATS, which finds the new owner.
func TestPeerLinkTakeoverBySameNode(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	b.reg.cl.onTakeover(&nats.Msg{Data: []byte(a.reg.cl.node + " " + tid)})
	sent := b.reg.Stats().Cluster.Direct
	done := callVia(t, b, tid, "get_state", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	if d := b.reg.Stats().Cluster.Direct - sent; d != 1 {
		t.Fatalf("after the owner's own takeover, %d requests on the link for one call; want 1", d)
	}
	b.reg.cl.onTakeover(&nats.Msg{Data: []byte("n9 " + tid)})
	if b.reg.cl.peerOf(tid) != nil {
		t.Fatal("a takeover by another node left the old owner's link in place")
	}
}

// A node whose link listens on loopback in another network namespace (or on
// another machine) is not dialled: its 127.0.0.1 is not this node's, and
// what listens on that port here, this node's own link included, is not
// it. Its requests go by NATS. The same address in this node's namespace,
// or from a node that does not say where it is, is dialled as before.
func TestPeerLinkLoopbackElsewhere(t *testing.T) {
	t.Parallel()
	a, b, tb, tid := pairedPeers(t)
	own := b.reg.cl.peer
	if own.info.Net == "" && runtime.GOOS == "linux" {
		t.Fatal("no network namespace id on Linux")
	}
	info := a.reg.cl.peer.info
	info.Net = "another-machine/1"
	info.Addr = own.info.Addr // B's own link: a node of another machine advertising the same loopback port
	p := own.learn(&info)
	if p != nil {
		t.Fatalf("learned a loopback link of another network namespace: %+v", p)
	}
	b.reg.cl.setPeer(tid, p, nil) // as an admit reply naming that link would
	done := callVia(t, b, tid, "get_state", 0)
	tb.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("call for a tab whose node's link is elsewhere = %v", err)
	}
	if n := own.refusals.Load(); n != 0 {
		t.Fatalf("B's link refused %d connections: it dialled itself", n)
	}
	for _, net := range []string{own.info.Net, ""} {
		info := a.reg.cl.peer.info
		info.Net = net
		if own.learn(&info) == nil {
			t.Fatalf("the link of a node in this namespace (net %q) was not learned", net)
		}
	}
	info = a.reg.cl.peer.info
	info.Net, info.Addr = "another-machine/1", "10.0.0.5:7422"
	if own.learn(&info) == nil {
		t.Fatal("a routable address of another machine was not learned")
	}
}
