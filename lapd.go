package lapd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/client"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/examples"
	"github.com/lapd-dev/lapd/internal/redact"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/mcp"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// ModulePath is lapd's Go module path.
const ModulePath = "github.com/lapd-dev/lapd"

// Server is a running lapd without a listener: mount Handler in your own
// server, call Shutdown when it stops. Safe for concurrent use.
type Server struct {
	cfg    Config
	prefix string
	log    *slog.Logger

	tokens   *tokens.Manager
	registry *pairing.Registry
	confirm  *confirm.Manager
	audit    *audit.Log
	lap      *lap.Server
	mcp      *mcp.HTTPHandler // nil with DisableMCP
	perim    *perimeter
	conns    *connLimits
	handler  http.Handler

	version      string
	started      time.Time
	metrics      *metrics      // nil unless Admin.Enabled
	auditQuerier audit.Querier // where the admin console reads the audit; nil = nowhere
	auditHealth  auditHealth
	adminHandler http.Handler
	budgets      keptBudgets // the parts' byte budgets, for /metrics

	db      *sql.DB
	dbFile  dbFile // lapd.db as opened, for /readyz
	closers []io.Closer
	nc      *nats.Conn // the cluster's NATS connection; nil on a single node
	ownNC   bool       // opened from NATSURL: closed last
	cluster string     // Config.ClusterName or "lapd"
	// live is registry for the token bucket's watch (dropRevoked), which
	// starts before the registry exists.
	live atomic.Pointer[pairing.Registry]

	shutOnce sync.Once
	shutErr  error
}

// New builds every part from cfg, in dependency order: stores, audit, token
// manager, pairing registry, confirm manager, LAP server, MCP endpoint. On
// error whatever was opened is closed again. ctx bounds start-up only (e.g.
// loading pending approvals from the store); the Server runs until Shutdown.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	s := &Server{cfg: cfg, log: cfg.Logger, version: cfg.Version}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	// Tokens are never logged: whatever reaches a log line (an error with a
	// URL in it, a header) has agent tokens and tab secrets cut out.
	s.log = slog.New(redact.Handler(s.log.Handler()))
	if s.version == "" {
		s.version = Version()
	}
	s.started = s.now()
	defer func() {
		if err != nil {
			if s.audit == nil { // the sinks we were given are ours to close
				closeSinks(cfg.AuditSinks)
			}
			s.closeAll()
			err = withDBAdvice(cfg.DataDir, err)
		}
	}()
	if s.prefix, err = cleanPrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Origins, err = cleanOrigins(cfg.Origins); err != nil {
		return nil, err
	}
	s.cfg.Origins = cfg.Origins
	if cfg.Demo && s.prefix != lap.DefaultPrefix {
		return nil, fmt.Errorf("lapd: the demo app loads %s/client.js, so Demo needs the default Prefix (got %q)", lap.DefaultPrefix, cfg.Prefix)
	}
	if err := s.openCluster(cfg); err != nil {
		return nil, err
	}
	tstore, cstore, err := s.openStores(ctx, cfg)
	if err != nil {
		return nil, err
	}
	confirmOwns := false // confirm.New takes cstore over (and closes it)
	defer func() {
		if err != nil && !confirmOwns {
			_ = cstore.Close()
		}
	}()
	sinks, err := s.openAuditSinks(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Admin.Enabled {
		s.metrics = newMetrics()
		sinks = append(sinks, s.metrics.stream)
		if s.auditQuerier == nil {
			ring := newAuditRing(defaultAuditRingBytes)
			sinks = append(sinks, ring)
			s.auditQuerier = ring
		}
	}
	s.audit = audit.New(audit.Config{Sinks: sinks, Logger: s.log, Clock: cfg.Clock})

	kept := cfg.MaxKeptBytes
	if kept <= 0 {
		kept = DefaultMaxKeptBytes
	}
	share := func(div int64) int { return int(max(kept/div, 1<<20)) }
	s.budgets = keptBudgets{tabBuffers: share(4), idempotency: share(4), policies: share(8), outcomes: share(8), payloads: share(8)}
	if s.tokens, err = tokens.NewManager(tokens.Config{Store: tstore, TTL: cfg.TokenTTL, SlidingTTL: cfg.SlidingTTL, Grace: cfg.Grace, Clock: cfg.Clock}); err != nil {
		return nil, err
	}
	// Sockets of a previous process are gone, whether it stopped gracefully
	// or was killed: their sessions get a grace from now to re-pair. Not in
	// a cluster: there the other nodes' sockets are alive (a node that was
	// killed leaves its sessions active until their tabs re-pair elsewhere,
	// which lapd.js does at once; docs/CLUSTER.md).
	if s.nc == nil {
		if n, err := s.tokens.AfterRestart(ctx); err != nil {
			return nil, fmt.Errorf("lapd: %w", err)
		} else if n > 0 {
			s.log.Info("sessions of the previous process wait for their tabs to re-pair", "sessions", n)
		}
	}
	if s.registry, err = pairing.New(pairing.Config{
		Tokens: s.tokens, Audit: s.audit, Logger: s.log, AllowedOrigins: cfg.Origins,
		TrustProxy: cfg.TrustProxy, PublicURL: cfg.PublicURL,
		PingInterval: cfg.PingInterval, RPCTimeout: cfg.RPCTimeout, Retention: cfg.Grace,
		BufferBytes: share(4), LogRingBytes: min(pairing.DefaultLogRingBytes, share(4)),
		Cluster: s.nc, ClusterPrefix: s.cluster, NodeID: cfg.NodeID,
		PeerListen: peerListen(s.nc != nil, cfg.PeerListen), PeerAdvertise: cfg.PeerAdvertise, PeerTLS: cfg.PeerTLS,
	}); err != nil {
		return nil, err
	}
	s.live.Store(s.registry)
	// confirm needs the LAP server's OnConfirmExpire, and the LAP server needs
	// confirm: the hook is installed once the server exists (SetOnExpire
	// delivers expiries that happened before it, e.g. approvals loaded from
	// the store already expired, instead of losing them).
	confirmOwns = true
	if s.confirm, err = confirm.New(ctx, confirm.Config{Store: cstore, Expiry: cfg.ConfirmExpiry, Clock: cfg.Clock, Logger: s.log,
		KeptBytes: share(8), PendingBytes: share(8),
		KeptBytesPerTID: min(confirm.DefaultKeptBytesPerTID, share(8)), PendingBytesPerTID: min(confirm.DefaultPendingBytesPerTID, share(8)),
	}); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closerFunc(s.confirm.Close))
	if s.lap, err = lap.New(lap.Config{
		Tokens: s.tokens, Registry: s.registry, Confirm: s.confirm, Audit: s.audit, Logger: s.log,
		Prefix:  s.prefix + "/", // "/" alone: the root (lap's "" means its default)
		LAPRate: cfg.LAPRate, LAPBurst: cfg.LAPBurst, MintRate: cfg.MintRate, MintBurst: cfg.MintBurst,
		Identity: cfg.Identity, AllowAnonymous: cfg.AllowAnonymous, CORSOrigins: cfg.Origins,
		TrustProxy: cfg.TrustProxy, PublicURL: cfg.PublicURL, Clock: cfg.Clock,
		IdemBytes: share(4), IdemBytesPerTID: min(lap.DefaultIdemBytesPerTID, share(4)), PolicyCacheBytes: share(8),
		Observer: s.lapObserver(),
	}); err != nil {
		return nil, err
	}
	s.confirm.SetOnExpire(s.lap.OnConfirmExpire)

	if !cfg.DisableMCP {
		var bcfg mcp.BindingsConfig
		if s.nc != nil {
			shared, err := openNATSBindings(ctx, s.nc, s.cluster+"_mcp", cfg.NATSReplicas)
			if err != nil {
				return nil, natsRefused(s.nc, err)
			}
			bcfg.Shared = shared
		}
		if s.mcp, err = mcp.NewHTTPHandler(mcp.HTTPConfig{
			Config: mcp.Config{Client: s.lap.Client(), Tools: cfg.MCPTools, Logger: s.log.With("component", "mcp"), Name: "lapd", Version: s.version,
				Observer: s.mcpObserver(), Bindings: bcfg},
			DisableFastPath:            cfg.MCPNoFastPath,
			MaxSessions:                cfg.MCPSessions.Max,
			MaxUnauthenticatedSessions: cfg.MCPSessions.Unauthenticated,
			MaxSessionsPerToken:        cfg.MCPSessions.PerToken,
			MaxSessionsPerIP:           cfg.MCPSessions.PerIP,
			IdleTTL:                    cfg.MCPSessions.IdleTTL,
			AllowedOrigins:             mcpOrigins(cfg),
			AllowedHosts:               s.servedHosts(),
			TrustProxy:                 cfg.TrustProxy,
			Audit:                      s.audit,
		}); err != nil {
			return nil, err
		}
	}
	if s.metrics != nil && s.mcp != nil {
		s.metrics.addTools(s.mcp.Executor().Tools())
	}
	s.perim = newPerimeter(s.routes(), s.servedHosts(), cfg.BodyReadTimeout, s.audit)
	s.conns = newConnLimits(cfg)
	if n := openFileLimit(); n > 0 && n < lowOpenFileLimit {
		// Tabs' WebSockets are not capped by MaxConns: with a low limit
		// they took every descriptor, and then nothing, /healthz
		// included, could connect ("accept4: too many open files").
		s.log.Warn("lapd: the open-file limit is low: tabs, connections and lapd's own files must fit in it, and past it nothing can connect; raise it (ulimit -n, or LimitNOFILE= in a systemd unit)",
			"limit", n, "want_at_least", lowOpenFileLimit)
	}
	s.conns.logWarn = s.log.Warn
	s.conns.auditLimit = func(key string, e audit.Entry) { s.audit.RecordLimited(context.Background(), key, e) }
	s.handler = s.perim
	if err := s.buildAdmin(); err != nil {
		return nil, err
	}
	if s.metrics != nil {
		if err := s.registerMetrics(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// now is the Server's clock.
func (s *Server) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}

// lapObserver and mcpObserver are the metrics, or nil (an interface holding
// a nil *metrics would not be nil).
func (s *Server) lapObserver() lap.Observer {
	if s.metrics == nil {
		return nil
	}
	return s.metrics
}

func (s *Server) mcpObserver() mcp.Observer {
	if s.metrics == nil {
		return nil
	}
	return s.metrics
}

// registerMetrics fills the admin registry (lapd's collectors and the Go
// runtime's) and the caller's Registerer (lapd's only).
func (s *Server) registerMetrics() error {
	c := newCollector(s)
	if err := s.metrics.register(s.metrics.reg, c); err != nil {
		return fmt.Errorf("lapd: metrics: %w", err)
	}
	if err := registerRuntime(s.metrics.reg); err != nil {
		return fmt.Errorf("lapd: metrics: %w", err)
	}
	if r := s.cfg.Admin.Registerer; r != nil {
		if err := s.metrics.register(r, newCollector(s)); err != nil {
			return fmt.Errorf("lapd: Admin.Registerer: %w", err)
		}
	}
	return nil
}

// cleanPrefix turns "" into the default "/agent", "/" into "" (routes at the
// root) and "x/y/" into "/x/y".
func cleanPrefix(p string) (string, error) {
	if p == "" {
		return lap.DefaultPrefix, nil
	}
	p = strings.Trim(p, "/")
	if p == "" {
		return "", nil
	}
	if strings.ContainsAny(p, "{}?#* \t") || strings.Contains(p, "//") {
		return "", fmt.Errorf("lapd: Prefix %q must be a plain path such as /agent", p)
	}
	return "/" + p, nil
}

// routes is the one mux: the WebSocket, the MCP endpoint, the browser
// client, the meta and LAP routes, /healthz and the demo.
func (s *Server) routes() http.Handler {
	p := s.prefix
	mux := http.NewServeMux()
	mux.Handle(p+"/ws", s.registry)
	mux.Handle(p+"/", s.lap.Handler())
	ch := clientHandler(p)
	mux.Handle("GET "+p+"/client.js", ch)
	mux.Handle("GET "+p+"/client.d.ts", ch)
	if s.mcp != nil {
		mux.Handle(p+"/mcp", s.mcp)
	}
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Demo {
		mux.Handle("/", examples.Handler())
		mux.Handle("/demo/save", examples.SaveHandler())
	}
	return mux
}

// clientHandler serves lapd.js and lapd.d.ts at {prefix}/client.js and
// {prefix}/client.d.ts (the client package serves them under /agent).
func clientHandler(prefix string) http.Handler {
	h := client.Handler()
	if prefix == lap.DefaultPrefix {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path = lap.DefaultPrefix + strings.TrimPrefix(r.URL.Path, prefix)
		u.RawPath = ""
		r2.URL = &u
		h.ServeHTTP(w, r2)
	})
}

// Handler serves everything `lapd serve` serves, at full request paths
// (mount it without http.StripPrefix):
//
//	{Prefix}/ws                  the tab's WebSocket (token checked before the upgrade)
//	{Prefix}/mint, /resume/list, /resume/claim, /revoke, /sessions   meta routes
//	{Prefix}/lap/v1/…            LAP v2 (observe, message, …)
//	{Prefix}/mcp                 MCP Streamable HTTP (unless DisableMCP)
//	{Prefix}/client.js, .d.ts    the browser client
//	GET /healthz                 liveness: {"status":"ok","tabs":N}; 503 while shutting down
//	GET /readyz                  readiness: store, audit, draining (see AdminHandler for the rest)
//	/ and /demo/save             the demo app (with Demo)
//
// In a mux of your own, route {Prefix}/ to it (and /healthz if you want it):
//
//	mux.Handle("/agent/", srv.Handler())
func (s *Server) Handler() http.Handler { return s.handler }

// Prefix is the path prefix in use ("/agent" by default).
func (s *Server) Prefix() string { return s.prefix }

// Tokens is the token manager (mint, verify, revoke records directly).
func (s *Server) Tokens() *tokens.Manager { return s.tokens }

// dropRevoked closes a tab held here whose record another node revoked
// (tokens.NATSConfig.OnRevoked): the revoking node asks the tab's node
// directly, but a node cut off from NATS then does not hear it, and learns
// the revocation from the bucket's watch once it is back.
func (s *Server) dropRevoked(tid string) {
	if r := s.live.Load(); r != nil {
		r.DropRevoked(tid)
	}
}

// Registry is the pairing registry: the live tabs.
func (s *Server) Registry() *pairing.Registry { return s.registry }

// Confirm is the manager of pending approvals.
func (s *Server) Confirm() *confirm.Manager { return s.confirm }

// Audit is the audit log every part records to. To receive entries, pass
// your own audit.Sink in Config.AuditSinks.
func (s *Server) Audit() *audit.Log { return s.audit }

// LAP is the HTTP server of the meta and LAP routes; LAP().Client() calls
// LAP in-process.
func (s *Server) LAP() *lap.Server { return s.lap }

// MCP is the MCP Streamable HTTP endpoint, or nil with DisableMCP.
func (s *Server) MCP() *mcp.HTTPHandler { return s.mcp }

// Revoke ends session tid whoever owns it: its token stops working at once,
// its tab is closed with 4001, its pending approvals are dropped, and the
// revoke is audited. tokens.ErrForbidden if tid is unknown.
func (s *Server) Revoke(ctx context.Context, tid string) error { return s.lap.Revoke(ctx, tid) }

// Shutdown stops lapd gracefully, within ctx's deadline, in this order:
//
//  1. Close the MCP sessions; drain LAP: new calls get 503 shutting-down,
//     long polls (/wait, approvals) end at once; wait for the calls in
//     flight, for at most half of the time left.
//  2. Close every tab with 1012 (it reconnects to the next process); calls
//     still waiting on a tab fail with 503 shutting-down.
//  3. Wait for the last calls with the rest of the time.
//  4. Close confirm, the stores, and the audit log last: it writes every
//     queued entry before its sinks close, so no entry of steps 1–3 is lost.
//
// It returns an error when ctx ran out before step 3 ended (everything is
// closed anyway; an entry recorded after that is logged instead, see
// audit.Log.Close). Call it before the http.Server's own Shutdown, so
// in-flight calls still have a listener. Calling it again returns the first
// call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() { s.shutErr = s.shutdown(ctx) })
	return s.shutErr
}

func (s *Server) shutdown(ctx context.Context) error {
	var errs []error
	half, cancel := halfOf(ctx)
	defer cancel()
	if s.mcp != nil {
		if err := s.mcp.Close(half); err != nil {
			errs = append(errs, fmt.Errorf("closing MCP sessions: %w", err))
		}
	}
	s.lap.Drain()
	s.perim.cutBodies()
	if err := s.lap.WaitIdle(half); err != nil {
		s.log.Warn("shutdown: calls still in flight after half the shutdown time; closing the tabs", "err", err)
	}
	if err := s.registry.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("closing tabs: %w", err))
	}
	if err := s.lap.WaitIdle(ctx); err != nil {
		errs = append(errs, fmt.Errorf("waiting for in-flight calls: %w", err))
	}
	errs = append(errs, s.closeAll())
	return errors.Join(errs...)
}

// halfOf is ctx with half of its remaining time (ctx itself when it has no
// deadline).
func halfOf(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(d)/2)
}

// closeAll closes what New opened, last first, then audit, then the database.
func (s *Server) closeAll() error {
	var errs []error
	if s.ownNC && s.nc != nil && !s.nc.IsConnected() {
		// NATS is unreachable: closing the connection first makes every
		// NATS-bound close below (the KV watches, the audit stream's
		// pending acknowledgements) give up at once instead of each waiting
		// for its own timeout, which went past --shutdown-timeout.
		s.log.Warn("shutdown: NATS is not connected; not waiting for it")
		s.nc.Close()
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	s.closers = nil
	if s.audit != nil {
		if err := s.audit.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.db != nil {
		if err := s.db.Close(); err != nil {
			errs = append(errs, err)
		}
		s.db = nil
	}
	if s.ownNC && s.nc != nil {
		s.nc.Close()
		s.nc = nil
	}
	return errors.Join(errs...)
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// RedactLogs wraps h so that no log line carries an agent token or a tab
// secret, wherever it stands in the message or an attribute. New does this to
// Config.Logger; use it for loggers of your own that may see lapd's errors.
func RedactLogs(h slog.Handler) slog.Handler { return redact.Handler(h) }

// Version is lapd's module version from the build info (the main module's
// in the lapd binary, the dependency's in a program that embeds lapd), or
// "dev".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if bi.Main.Path == ModulePath && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == ModulePath && d.Version != "" {
			return d.Version
		}
	}
	return "dev"
}

// Stats gathers the parts' kept-data gauges and shed counters, for a
// metrics endpoint.
type Stats struct {
	Pairing pairing.Stats
	Confirm confirm.Stats
	LAP     lap.Stats
}

// Stats returns the parts' gauges and counters.
func (s *Server) Stats() Stats {
	return Stats{Pairing: s.registry.Stats(), Confirm: s.confirm.Stats(), LAP: s.lap.Stats()}
}

// mcpOrigins are the origins /agent/mcp allows besides same-origin: the
// --origins list and lapd's own public origin (Config.PublicURL). Behind a
// TLS proxy the endpoint cannot tell same-origin from the Host (the hop to
// lapd is http), so a page on the public origin got 403 while mint, which
// allows that origin, took the same request.
func mcpOrigins(cfg Config) []string {
	if cfg.PublicURL == "" {
		return cfg.Origins
	}
	o, err := CleanOrigin(cfg.PublicURL)
	if err != nil {
		return cfg.Origins
	}
	return append(slices.Clip(cfg.Origins), o)
}
