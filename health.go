package lapd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
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
