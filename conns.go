package lapd

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
)

// Connection caps (Config.MaxConnsPerClient, Config.MaxConns), enforced by
// Server.ConnState on the http.Server that serves Handler.
//
// Why: net/http keeps any number of connections open, each for
// IdleTimeout after its last request, and each holds a file descriptor and
// about 25 KB. One client that opened twenty thousand idle keep-alive
// connections (one request each, from 127.x.y.z addresses) took every
// descriptor in six seconds: accept failed with "too many open files" and
// no tab, model or human could connect until they timed out. Counting
// connections per client (clientip.Key: all of IPv4 loopback is one client,
// an IPv6 client its /64) bounds what one client holds; the cap in all keeps
// descriptors for tabs, the stores and the cluster when many clients come at
// once.
//
// Only HTTP connections count: a WebSocket stops counting once upgraded
// (tabs are bounded by their tokens). A client at its cap makes room by
// losing its connection idle the longest (ConnState); a connection that
// finds no room is answered at once with 503 too-many-connections and
// closed, before any request is read (waiting for its request would hold
// the descriptor for up to ReadHeaderTimeout), and audited within the
// client's audit budget.
const (
	DefaultMaxConnsPerClient = 256
	defaultMaxConns          = 10000 // where the process's open-file limit is unknown
)

type connLimits struct {
	perClient, total int // ≤ 0: no cap

	// byConn is read on every request (a connection turning busy or idle)
	// without a lock; mu guards the counts and clients, which change only
	// when a connection opens or ends.
	byConn  sync.Map // net.Conn → *connEntry, the counted connections
	seq     atomic.Uint64
	mu      sync.Mutex
	clients map[string]*connClient // by client key
	open    int

	refused, reaped atomic.Int64
	loggedAt        atomic.Int64 // unix ns of the last refusal logged
	auditLimit      func(key string, e audit.Entry)
	logWarn         func(msg string, args ...any)
}

// connEntry is one counted connection. busy is set while a request is
// being served on it (net/http calls a connection active once a request's
// headers are read, idle when it is done); idleSeq orders idle ones, the
// smallest idle the longest. A connection that has not sent a whole
// request's headers yet is idle.
type connEntry struct {
	c       net.Conn
	key     string
	busy    atomic.Bool
	idleSeq atomic.Uint64
}

type connClient struct {
	conns map[*connEntry]struct{}
}

// lowOpenFileLimit is the open-file limit under which lapd warns at start
// (Go raises the soft limit to the hard one; usual hosts allow far more).
const lowOpenFileLimit = 4096

// newConnLimits resolves the configured caps: per client 0 = the default,
// < 0 = none, and none behind a trusted proxy (every connection then comes
// from the proxy: cap clients there); in all 0 = three quarters of the
// process's open-file limit.
func newConnLimits(cfg Config) *connLimits {
	per := cfg.MaxConnsPerClient
	switch {
	case cfg.TrustProxy > 0 && per == 0:
		per = -1
	case per == 0:
		per = DefaultMaxConnsPerClient
	}
	total := cfg.MaxConns
	if total == 0 {
		total = defaultMaxConns
		if n := openFileLimit(); n > 0 {
			total = int(min(n, 1<<22) * 3 / 4)
		}
	}
	return &connLimits{perClient: per, total: total, clients: map[string]*connClient{}}
}

// ConnState enforces the connection caps (see Config.MaxConnsPerClient);
// set it as the ConnState of the http.Server that serves Handler (lapd serve
// does, on both its listeners). Without it, nothing is capped.
//
// A client at its cap that opens another connection gets it, and its
// connection idle the longest is closed: holding idle keep-alive
// connections gains nothing (one local process holding 256 of them locked
// every other local client out). Only when all of them are serving a
// request is the new one refused. Per request this costs a lock-free map
// read and two atomic stores.
func (s *Server) ConnState(c net.Conn, st http.ConnState) {
	l := s.conns
	switch st {
	case http.StateNew:
		l.accept(c)
	case http.StateActive:
		if v, ok := l.byConn.Load(c); ok {
			v.(*connEntry).busy.Store(true)
		}
	case http.StateIdle:
		if v, ok := l.byConn.Load(c); ok {
			e := v.(*connEntry)
			e.idleSeq.Store(l.seq.Add(1))
			e.busy.Store(false)
		}
	case http.StateHijacked, http.StateClosed:
		if v, ok := l.byConn.LoadAndDelete(c); ok {
			l.mu.Lock()
			l.forgetLocked(v.(*connEntry))
			l.mu.Unlock()
		}
	}
}

// accept counts a new connection, making room or refusing it at a cap.
func (l *connLimits) accept(c net.Conn) {
	key := clientip.Key(remoteHost(c))
	var victim *connEntry
	why := ""
	l.mu.Lock()
	cl := l.clients[key]
	if cl == nil {
		cl = &connClient{conns: map[*connEntry]struct{}{}}
		l.clients[key] = cl
	}
	if l.perClient > 0 && len(cl.conns) >= l.perClient {
		for e := range cl.conns { // the one idle the longest
			if !e.busy.Load() && (victim == nil || e.idleSeq.Load() < victim.idleSeq.Load()) {
				victim = e
			}
		}
		if victim != nil {
			l.byConn.Delete(victim.c)
			l.forgetLocked(victim)
		} else {
			why = "your address has " + strconv.Itoa(len(cl.conns)) + " connections open to lapd, each serving a request, its limit per client (--max-conns-per-client); retry when one has finished"
		}
	}
	if why == "" && l.total > 0 && l.open >= l.total {
		why = "lapd has " + strconv.Itoa(l.open) + " connections open, its limit (--max-conns); retry in a few seconds"
	}
	if why == "" {
		e := &connEntry{c: c, key: key}
		e.idleSeq.Store(l.seq.Add(1))
		cl.conns[e] = struct{}{}
		l.clients[key] = cl
		l.byConn.Store(c, e)
		l.open++
	} else if len(cl.conns) == 0 {
		delete(l.clients, key)
	}
	l.mu.Unlock()
	if victim != nil {
		l.reaped.Add(1)
		_ = victim.c.Close()
	}
	if why != "" {
		l.refuse(c, key, why)
	}
}

// forgetLocked stops counting e (closed, upgraded, or closed to make room).
// Caller holds mu and has taken e out of byConn.
func (l *connLimits) forgetLocked(e *connEntry) {
	cl := l.clients[e.key]
	if cl == nil {
		return
	}
	if _, ok := cl.conns[e]; !ok {
		return
	}
	delete(cl.conns, e)
	if len(cl.conns) == 0 {
		delete(l.clients, e.key)
	}
	l.open--
}

// refuse answers c with 503 and closes it. The answer is written before the
// request is read: a client sees it as the answer to its first request.
func (l *connLimits) refuse(c net.Conn, key, why string) {
	l.refused.Add(1)
	// Audited first: a client that has the answer finds the entry queued.
	if l.auditLimit != nil {
		l.auditLimit("ip:"+key, audit.Entry{Event: audit.EventRefused, Detail: map[string]any{
			"endpoint": "listener", "status": http.StatusServiceUnavailable, "code": "too-many-connections", "ip": key}})
	}
	body := `{"error":{"code":"too-many-connections","detail":` + strconv.Quote(why) + `}}`
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) // a fresh socket's buffer takes it at once
	_, _ = c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 5\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	_ = c.Close()
	if now, last := time.Now().UnixNano(), l.loggedAt.Load(); now-last > int64(time.Second) && l.loggedAt.CompareAndSwap(last, now) && l.logWarn != nil {
		l.logWarn("refused a connection over the connection limit (at most one such line a second; audited within the client's budget)", "client", key, "why", why)
	}
}

// OpenConns reports the HTTP connections counted by ConnState, those
// refused since start, and those closed to make room for a newer one of
// the same client.
func (s *Server) OpenConns() (open int, refused, reaped int64) {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	return s.conns.open, s.conns.refused.Load(), s.conns.reaped.Load()
}

func remoteHost(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
