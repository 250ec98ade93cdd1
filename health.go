package lapd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lapd-dev/lapd/tokens"
)

// Health checks, for load balancers, orchestrators and people:
//
//	GET /healthz  liveness: the process serves HTTP. 200 {"status":"ok","tabs":N}
//	              (tabs with a live socket); 503 {"status":"shutting-down",…}
//	              while draining.
//	GET /readyz   readiness: the token store answers, the audit sinks are
//	              not failing, lapd is not draining. 200 {"status":"ready",…}
//	              or 503 {"status":"not-ready",…}, each check with a sentence.
//
// Both bodies are one line of JSON whose fields read as sentences.

type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func writeHealth(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	b, _ := json.Marshal(body)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.lap.Draining() {
		writeHealth(w, http.StatusServiceUnavailable, map[string]any{"status": "shutting-down",
			"detail": "lapd is stopping; the next process takes over the tabs"})
		return
	}
	writeHealth(w, http.StatusOK, struct {
		Status string `json:"status"`
		Tabs   int    `json:"tabs"`
	}{"ok", s.lap.PairedTabs()})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := []check{s.checkDraining(), s.checkStore(r.Context()), s.auditHealth.check(s)}
	if c, ok := s.dbFile.check(s); ok {
		checks = append(checks, c)
	}
	if s.nc != nil {
		checks = append(checks, s.checkNATS())
	}
	ready := true
	for _, c := range checks {
		ready = ready && c.OK
	}
	status, code := "ready", http.StatusOK
	if !ready {
		status, code = "not-ready", http.StatusServiceUnavailable
	}
	writeHealth(w, code, struct {
		Status  string  `json:"status"`
		Checks  []check `json:"checks"`
		Version string  `json:"version"`
		Uptime  string  `json:"uptime"`
	}{status, checks, s.version, s.now().Sub(s.started).Round(time.Second).String()})
}

func (s *Server) checkDraining() check {
	if s.lap.Draining() {
		return check{"draining", false, "lapd is shutting down: new calls get 503 shutting-down"}
	}
	return check{"draining", true, "accepting calls"}
}

// checkNATS: a cluster node cut off from NATS can serve only the tabs it
// holds, and writes no token or approval: the load balancer should send
// new work elsewhere until the connection is back (nats.go reconnects).
func (s *Server) checkNATS() check {
	if s.nc.IsConnected() {
		return check{"nats", true, "connected to " + s.nc.ConnectedUrlRedacted()}
	}
	return check{"nats", false, "not connected to NATS (" + s.nc.Status().String() + "): other nodes cannot reach this node's tabs, and tokens and approvals cannot be written; reconnecting"}
}

// checkStore reads a record that cannot exist: "not found" within a second
// means the token store answers.
func (s *Server) checkStore(ctx context.Context) check {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.tokens.Get(ctx, "readyz-probe")
	ms := float64(time.Since(start).Microseconds()) / 1000
	if err == nil || errors.Is(err, tokens.ErrNotFound) {
		return check{"token-store", true, fmt.Sprintf("answered in %.1f ms", ms)}
	}
	return check{"token-store", false, "the token store did not answer: " + err.Error()}
}

// auditHealth remembers the audit log's failure count between probes, so a
// sink that fails now makes lapd not ready until a probe sees no new
// failure for a while.
type auditHealth struct {
	mu       sync.Mutex
	failures int64
	failedAt time.Time
}

// auditFailingFor is how long a sink failure keeps lapd not ready.
const auditFailingFor = 30 * time.Second

func (h *auditHealth) check(s *Server) check {
	n := s.audit.Failures() + s.audit.Dropped()
	now := time.Now()
	h.mu.Lock()
	if n > h.failures {
		h.failures, h.failedAt = n, now
	}
	failedAt := h.failedAt
	h.mu.Unlock()
	if !failedAt.IsZero() && now.Sub(failedAt) < auditFailingFor {
		return check{"audit", false, fmt.Sprintf("an audit sink failed or the audit queue overflowed %s ago (%d failed writes, %d entries dropped since start; the log says where)",
			now.Sub(failedAt).Round(time.Second), s.audit.Failures(), s.audit.Dropped())}
	}
	return check{"audit", true, fmt.Sprintf("%d entries recorded, %d queued, %d failed writes since start", s.audit.Recorded(), s.audit.Queued(), s.audit.Failures())}
}

// dbFile is lapd.db as lapd opened it. A database file removed or replaced
// under a running lapd (by hand, by a clean-up of /tmp, by a restore into a
// live data dir) is not noticed by SQLite: lapd wrote on into the unlinked
// file, /readyz said ready, and at the next start every token, pending
// approval and audit entry of the run was gone. /readyz now says so.
type dbFile struct {
	path   string
	opened os.FileInfo // nil: no database file

	logged atomic.Bool // the ERROR line was written
}

func (d *dbFile) remember(path string) {
	if fi, err := os.Stat(path); err == nil {
		d.path, d.opened = path, fi
	}
}

// check reports whether lapd.db is still the file lapd opened; ok is false
// when lapd has no database file. The detail names neither the data
// directory nor the process id: /readyz answers anyone who reaches the
// port (a load balancer, a local process, whoever a proxy forwards it for),
// and a path names the user's home. The ERROR line in lapd's log has both.
func (d *dbFile) check(s *Server) (_ check, ok bool) {
	if d.opened == nil {
		return check{}, false
	}
	fi, err := os.Stat(d.path)
	if err == nil && os.SameFile(fi, d.opened) {
		return check{"database", true, "lapd.db in the data directory is the file lapd opened"}, true
	}
	what := "was removed"
	if err == nil {
		what = "was replaced by another file"
	}
	keep := "copy the open lapd.db and lapd.db-wal from /proc/" + strconv.Itoa(os.Getpid()) + "/fd to a safe place before you stop lapd"
	if d.logged.CompareAndSwap(false, true) {
		s.log.Error("lapd: the database file "+what+" while lapd runs; what lapd writes is lost when it stops (tokens, pending approvals, the audit trail); to keep them, "+keep+"; restart lapd to use what is at that path now", "path", d.path)
	}
	return check{"database", false, "lapd.db in the data directory " + what + " while lapd runs: lapd still writes to the file it opened, which is lost when lapd stops " +
		"(tokens, pending approvals, the audit trail); lapd's log (an ERROR line) names the file and says how to keep them before you stop lapd; restart lapd to use what is at that path now"}, true
}
