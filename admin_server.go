package lapd

import (
	"context"
	"errors"
	"net/http"
	"net/http/pprof"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lapd-dev/lapd/admin"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

// AdminHandler serves the operator's side of lapd, for a listener of its
// own (lapd serve --admin-addr; never the public one):
//
//	GET /metrics           Prometheus metrics (OpenMetrics with exemplars when asked)
//	/debug/pprof/…         Go's profiler
//	/admin/                the admin console: sessions, revoke, audit trail, live chart
//	GET /healthz, /readyz  liveness and readiness, JSON (no token needed)
//
// Everything but the health checks needs Config.Admin.Token when one is
// set, else a loopback client (docs/OPERATING.md). Without
// Config.Admin.Enabled only the health checks answer.
func (s *Server) AdminHandler() http.Handler { return s.adminHandler }

func (s *Server) buildAdmin() error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	s.adminHandler = mux
	if !s.cfg.Admin.Enabled {
		return nil
	}
	h, err := admin.New(admin.Config{Backend: adminBackend{s}, Token: s.cfg.Admin.Token, Audit: s.audit, Now: s.cfg.Clock})
	if err != nil {
		return err
	}
	mux.Handle("/admin/", h)
	mux.Handle("/admin", h)
	mux.Handle("GET /metrics", h.Guard(metricsHandler(s.metrics.reg)))
	pp := http.NewServeMux()
	pp.HandleFunc("/debug/pprof/", pprof.Index)
	pp.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	pp.HandleFunc("/debug/pprof/profile", pprof.Profile)
	pp.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	pp.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/pprof/", h.Guard(pp))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/admin/", http.StatusFound)
	})
	return nil
}

// adminBackend is the console's view of the Server.
type adminBackend struct{ s *Server }

var _ admin.Backend = adminBackend{}

func (b adminBackend) Overview(ctx context.Context) admin.Overview {
	s := b.s
	st := s.registry.Stats()
	o := admin.Overview{
		Version: s.version, StartedAt: s.started.UnixMilli(), Now: s.now().UnixMilli(),
		Tabs: st.ActiveTabs, Held: st.HeldTabs, Pending: s.confirm.Stats().Pending, Draining: s.lap.Draining(), Audit: s.auditQuerier != nil,
	}
	if s.mcp != nil {
		o.MCPSessions = s.mcp.Sessions()
	}
	if s.metrics != nil {
		o.Metrics = true
		o.Calls, o.Errors = s.metrics.callTotals()
	}
	return o
}

func (b adminBackend) Sessions(ctx context.Context, limit int) ([]admin.Session, int, error) {
	s := b.s
	tabs, total := s.registry.Tabs(limit)
	out := make([]admin.Session, 0, len(tabs))
	for _, t := range tabs {
		a := admin.Session{TID: t.TID, App: t.AppName, AppVersion: t.AppVersion, Connected: t.Connected, Visible: t.Visible,
			LastHeartbeat: t.LastHeartbeat, ConnectedAt: t.ConnectedAt, Reconnects: t.Reconnects, Calls: t.Calls,
			Pending: len(s.confirm.PendingFor(t.TID)), Status: "unknown"}
		rec, err := s.tokens.Get(ctx, t.TID)
		switch {
		case err == nil:
			a.UID, a.Status, a.Origin, a.Label = rec.UID, string(rec.Status), rec.Origin, rec.Label
			a.CreatedAt, a.ExpiresAt, a.LastSeenAt = rec.CreatedAt, rec.ExpiresAt, rec.LastSeenAt
		case errors.Is(err, tokens.ErrNotFound):
		default:
			return nil, 0, err
		}
		out = append(out, a)
	}
	return out, total, nil
}

func (b adminBackend) Revoke(ctx context.Context, tid string) error {
	err := b.s.Revoke(ctx, tid)
	if errors.Is(err, tokens.ErrForbidden) || errors.Is(err, tokens.ErrNotFound) {
		return admin.ErrUnknownSession
	}
	return err
}

func (b adminBackend) Audit(ctx context.Context, f audit.Filter) ([]audit.Entry, error) {
	if b.s.auditQuerier == nil {
		return nil, admin.ErrNoAudit
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return b.s.auditQuerier.Query(ctx, f)
}

// callTotals sums the meta and LAP calls since start, and those answered
// with a status of 400 or more, from the request counters (the console's
// chart turns them into rates).
func (m *metrics) callTotals() (calls, errs float64) {
	var d dto.Metric
	for _, rm := range m.routes {
		for i, c := range rm.codes {
			d.Reset()
			if c.Write(&d) != nil || d.Counter == nil {
				continue
			}
			v := d.Counter.GetValue()
			calls += v
			if statusCodes[i] >= 400 {
				errs += v
			}
		}
	}
	return calls, errs
}
