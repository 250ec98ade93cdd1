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
// (tabs are bounded by their tokens). A connection over a cap is answered
// at once with 503 too-many-connections and closed, before any request is
// read (waiting for its request would hold the descriptor for up to
// ReadHeaderTimeout), and audited within the client's audit budget.
const (
	DefaultMaxConnsPerClient = 256
	defaultMaxConns          = 10000 // where the process's open-file limit is unknown
)

type connLimits struct {
	perClient, total int // ≤ 0: no cap

	mu     sync.Mutex
	byConn map[net.Conn]string // counted connections → client key
	per    map[string]int
	open   int

	refused    atomic.Int64
	loggedAt   atomic.Int64 // unix ns of the last refusal logged
	auditLimit func(key string, e audit.Entry)
	logWarn    func(msg string, args ...any)
}

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
	return &connLimits{perClient: per, total: total, byConn: map[net.Conn]string{}, per: map[string]int{}}
}

// ConnState enforces the connection caps (see Config.MaxConnsPerClient);
// set it as the ConnState of the http.Server that serves Handler (lapd serve
// does, on both its listeners). Without it, nothing is capped.
func (s *Server) ConnState(c net.Conn, st http.ConnState) {
	l := s.conns
	switch st {
	case http.StateNew:
		key := clientip.Key(remoteHost(c))
		l.mu.Lock()
		why := ""
		switch {
		case l.total > 0 && l.open >= l.total:
			why = "lapd has " + strconv.Itoa(l.open) + " connections open, its limit (--max-conns); retry in a few seconds"
		case l.perClient > 0 && l.per[key] >= l.perClient:
			why = "your address has " + strconv.Itoa(l.per[key]) + " connections open to lapd, its limit per client (--max-conns-per-client); close idle ones (or reuse them) and retry"
		default:
			l.byConn[c] = key
			l.per[key]++
			l.open++
		}
		l.mu.Unlock()
		if why != "" {
			l.refuse(c, key, why)
		}
	case http.StateHijacked, http.StateClosed:
		l.mu.Lock()
		if key, ok := l.byConn[c]; ok {
			delete(l.byConn, c)
			if l.per[key]--; l.per[key] <= 0 {
				delete(l.per, key)
			}
			l.open--
		}
		l.mu.Unlock()
	}
}

// refuse answers c with 503 and closes it. The answer is written before the
// request is read: a client sees it as the answer to its first request.
func (l *connLimits) refuse(c net.Conn, key, why string) {
	l.refused.Add(1)
	body := `{"error":{"code":"too-many-connections","detail":` + strconv.Quote(why) + `}}`
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) // a fresh socket's buffer takes it at once
	_, _ = c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 5\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	_ = c.Close()
	if now, last := time.Now().UnixNano(), l.loggedAt.Load(); now-last > int64(time.Second) && l.loggedAt.CompareAndSwap(last, now) && l.logWarn != nil {
		l.logWarn("refused a connection over the connection limit (at most one such line a second; audited within the client's budget)", "client", key, "why", why)
	}
	if l.auditLimit != nil {
		l.auditLimit("ip:"+key, audit.Entry{Event: audit.EventRefused, Detail: map[string]any{
			"endpoint": "listener", "status": http.StatusServiceUnavailable, "code": "too-many-connections", "ip": key}})
	}
}

// OpenConns reports the HTTP connections counted by ConnState and those
// refused since start.
func (s *Server) OpenConns() (open int, refused int64) {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	return s.conns.open, s.conns.refused.Load()
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
