package lapd_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
)

// natsProxy stands between one node and the NATS server, so that node alone
// can be cut off from NATS while its tabs' sockets, its HTTP listener and
// its peer link stay up (a network partition between the node and NATS).
type natsProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	cutOn bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newNATSProxy(t *testing.T, upstream string) *natsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &natsProxy{t: t, ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's nats:// URL, for the node's Config.NATSURL.
func (p *natsProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *natsProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cutOn {
			p.mu.Unlock()
			c.Close() // refused while cut: the client keeps retrying
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *natsProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut closes every connection through the proxy and refuses new ones until
// heal.
func (p *natsProxy) cut() {
	p.mu.Lock()
	p.cutOn = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *natsProxy) heal() {
	p.mu.Lock()
	p.cutOn = false
	p.mu.Unlock()
}

func (p *natsProxy) close() {
	p.cut()
	p.ln.Close()
	p.wg.Wait()
}

// partitionNodes starts n nodes on one NATS server, each connected through
// a proxy of its own.
func partitionNodes(t *testing.T, n int) ([]*lapdtest.Server, []*natsProxy) {
	t.Helper()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	var out []*lapdtest.Server
	var ps []*natsProxy
	for i := range n {
		p := newNATSProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
		s := lapdtest.NewServer(lapd.Config{NATSURL: p.URL(), ClusterName: name, NodeID: fmt.Sprint("n", i), Grace: 5 * time.Second})
		t.Cleanup(s.Close)
		out = append(out, s)
		ps = append(ps, p)
	}
	return out, ps
}

// ready reports whether s's /readyz answers 200.
func ready(t *testing.T, s *lapdtest.Server) bool {
	t.Helper()
	res, err := http.Get(s.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode == 200
}

func TestClusterPartitionExplore(t *testing.T) {
	ns, ps := partitionNodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	app := lapdtest.DemoApp()
	tab, sess, err := a.Pair(ctx, lapdtest.WithApp(app))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	for _, s := range ns {
		st, _, body := post(t, s.LAPURL()+"/observe", sess.Token, `{}`)
		t.Logf("before: observe on %s = %d %v", s.URL, st, body["error"])
	}
	ps[0].cut()
	waitUntil(t, "A to see NATS gone", func() bool { return !ready(t, a) })
	for i, s := range ns {
		t0 := time.Now()
		if i == 0 {
			go func() { time.Sleep(2 * time.Second); pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) }()
		}
		st, _, body := post(t, s.LAPURL()+"/observe", sess.Token, `{}`)
		t.Logf("cut: observe on %d = %d %v %v", i, st, body["error"], time.Since(t0))
		t0 = time.Now()
		st, _, body = post(t, s.LAPURL()+"/message", sess.Token, fmt.Sprintf(`{"msg":{"type":"inc"},"idempotencyKey":"k%d"}`, i))
		t.Logf("cut: message on %d = %d %v %v %v", i, st, body["status"], body["error"], time.Since(t0))
	}
	t.Logf("send_message rpcs: %d", tab.RPCCount("send_message"))
	// takeover on B
	t0 := time.Now()
	tab2, err := lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(app))
	t.Logf("dial B during cut: %v %v", err, time.Since(t0))
	if err == nil {
		defer tab2.Close()
		for i, s := range ns {
			st, _, body := post(t, s.LAPURL()+"/message", sess.Token, fmt.Sprintf(`{"msg":{"type":"inc"},"idempotencyKey":"t%d"}`, i))
			t.Logf("cut+takeover: message on %d = %d %v %v", i, st, body["status"], body["error"])
		}
		t.Logf("tab1 %d, tab2 %d send_message", tab.RPCCount("send_message"), tab2.RPCCount("send_message"))
	}
	start := time.Now()
	ps[0].heal()
	waitUntil(t, "A ready", func() bool { return ready(t, a) })
	t.Logf("ready after %v", time.Since(start))
	time.Sleep(time.Second)
	select {
	case <-tab.Done():
		t.Logf("tab1 closed %d", tab.CloseStatus())
	default:
		t.Logf("tab1 still open")
	}
	t.Logf("owned A %d B %d", a.Lapd.Stats().Pairing.Cluster.Owned, b.Lapd.Stats().Pairing.Cluster.Owned)
	for j := range 4 {
		for i, s := range ns {
			st, _, body := post(t, s.LAPURL()+"/message", sess.Token, fmt.Sprintf(`{"msg":{"type":"inc"},"idempotencyKey":"h%d%d"}`, i, j))
			t.Logf("healed: message on %d = %d %v %v", i, st, body["status"], body["error"])
		}
	}
	if tab2 != nil {
		t.Logf("tab1 %d, tab2 %d send_message", tab.RPCCount("send_message"), tab2.RPCCount("send_message"))
	}
}
