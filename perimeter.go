package lapd

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/internal/hostguard"
)

// DefaultBodyReadTimeout bounds how long a request's body may take to arrive.
const DefaultBodyReadTimeout = 10 * time.Second

// perimeter is what every request meets before any route: the DNS-rebinding
// Host check (on a loopback listener, Host must be a loopback name, the
// PublicURL's host or one of Config.Hosts; refusals are 403 forbidden-host,
// audited) and a read deadline on the request body (a body that trickles in
// is cut after BodyReadTimeout, and at once when Shutdown starts, so it
// neither holds a connection for long nor holds up a drain).
type perimeter struct {
	next    http.Handler
	guard   *hostguard.Guard
	audit   *audit.Log
	timeout time.Duration

	mu      sync.Mutex
	reading map[*http.ResponseController]struct{} // bodies still arriving
	cut     bool                                  // Shutdown began: no more waiting for bodies
}

// servedHosts are the Host names allowed on a loopback listener besides
// loopback names: Config.Hosts and PublicURL's host.
func (s *Server) servedHosts() []string {
	hosts := append([]string(nil), s.cfg.Hosts...)
	if s.cfg.PublicURL != "" {
		if u, err := url.Parse(s.cfg.PublicURL); err == nil && u.Host != "" {
			hosts = append(hosts, u.Host)
		}
	}
	return hosts
}

func newPerimeter(next http.Handler, hosts []string, timeout time.Duration, al *audit.Log) *perimeter {
	d := timeout
	if d <= 0 {
		d = DefaultBodyReadTimeout
	}
	return &perimeter{next: next, guard: hostguard.New(hosts), audit: al, timeout: d,
		reading: map[*http.ResponseController]struct{}{}}
}

func (p *perimeter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.guard.Allowed(r) {
		// Within the client's audit budget: a flood of refusals becomes one
		// counted entry per interval (audit.Log.RecordLimited).
		p.audit.RecordLimited(context.WithoutCancel(r.Context()), "ip:"+clientip.KeyOf(r, 0), audit.Entry{Event: audit.EventRefused, Detail: map[string]any{
			"endpoint": r.URL.Path, "status": http.StatusForbidden, "code": "forbidden-host", "host": r.Host}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "forbidden-host",
			"detail": "Host " + strconv.Quote(r.Host) + " is not served on this loopback address (DNS-rebinding protection); open lapd as localhost or 127.0.0.1, or add the name with --hosts"}})
		_, _ = w.Write(b)
		return
	}
	if hasBody(r) {
		// One allocation per request: the body wrapper holds its controller.
		db := &deadlineBody{ReadCloser: r.Body, p: p, rc: *http.NewResponseController(w)}
		if p.start(&db.rc) {
			defer db.finish()
			r.Body = db
		}
	}
	p.next.ServeHTTP(w, r)
}

// hasBody reports whether a body is still to be read. A WebSocket upgrade
// never gets a deadline (it would outlive the hijack), nor does a request
// without a body (net/http is already reading ahead on its connection).
func hasBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false
	}
	return r.Header.Get("Upgrade") == ""
}

// start sets rc's read deadline and tracks it; false when it cannot be set
// (a ResponseWriter without deadlines) or Shutdown began.
func (p *perimeter) start(rc *http.ResponseController) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	when := time.Now().Add(p.timeout)
	if p.cut {
		when = time.Now()
	}
	if rc.SetReadDeadline(when) != nil {
		return false
	}
	p.reading[rc] = struct{}{}
	return true
}

// done stops tracking rc. net/http clears the read deadline itself once the
// body is read to its end (it then reads ahead for the next request).
func (p *perimeter) done(rc *http.ResponseController) {
	p.mu.Lock()
	delete(p.reading, rc)
	p.mu.Unlock()
}

// cutBodies makes every body still arriving fail now, and every later one at
// once: a draining server does not wait for trickled bodies.
func (p *perimeter) cutBodies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	now := time.Now()
	for rc := range p.reading {
		_ = rc.SetReadDeadline(now)
	}
}

// deadlineBody stops tracking its request once the body is read (or fails),
// or at the latest when the handler returns.
type deadlineBody struct {
	io.ReadCloser
	p    *perimeter
	rc   http.ResponseController
	once sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *deadlineBody) finish() {
	b.once.Do(func() { b.p.done(&b.rc) })
}
