// Package app is lapd's composition root as a library: it turns one Config
// into the running parts (token store and manager, audit log and sinks,
// pairing registry, confirm manager, LAP server) and one http.ServeMux.
//
//	a, err := app.New(ctx, app.Config{DataDir: "lapd-data", AllowAnonymous: true})
//	srv := &http.Server{Addr: ":8787", Handler: a.Mux}
//	go srv.ListenAndServe()
//	<-ctx.Done()
//	a.Shutdown(shutdownCtx) // drain LAP, tell tabs to reconnect (1012), close stores
//
// With DataDir set, tokens, pending approvals and (with AuditSQLite) audit
// entries live in one SQLite file, DataDir/lapd.db (WAL), so a restart inside
// the grace window is invisible to a tab: it reconnects with the same token.
// Store "memory" (or an empty DataDir) keeps everything in memory.
//
// The mux serves /agent/ws (the tab's WebSocket), the meta routes
// (/agent/mint, /agent/resume/*, /agent/revoke, /agent/sessions), the LAP
// routes under /agent/lap/v1/ and GET /healthz. cmd/lapd mounts /agent/mcp,
// /agent/client.js and the demo app on the same Mux.
package app

import (
	"github.com/lapd-dev/lapd/internal/sqlitedb"

	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/time/rate"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// Config is everything the composition root needs. Zero values mean the
// documented defaults of each part.
type Config struct {
	DataDir string // directory of lapd.db; "" = memory stores
	Store   string // "sqlite" (default when DataDir is set) or "memory"
	Logger  *slog.Logger

	AuditSinks  []audit.Sink // extra sinks (closed by Shutdown)
	AuditFile   string       // JSONL file sink
	AuditStdout bool         // JSONL on stdout
	AuditSQLite bool         // audit_entries table in lapd.db (needs the sqlite store)
	// AuditRetention bounds what the file and SQLite sinks keep (zero = keep
	// everything); the stdout stream is not bounded here.
	AuditRetention audit.Retention

	Origins        []string // extra allowed origins (WebSocket Origin check and meta CORS)
	AllowAnonymous bool
	Identity       lap.IdentityResolver
	TrustProxy     int
	PublicURL      string

	LAPRate   rate.Limit // per tid; default 30/min
	LAPBurst  int
	MintRate  rate.Limit
	MintBurst int

	TokenTTL      time.Duration
	SlidingTTL    time.Duration
	Grace         time.Duration
	PingInterval  time.Duration
	RPCTimeout    time.Duration
	ConfirmExpiry time.Duration
	Clock         func() time.Time
}

// App is a running lapd without its listener.
type App struct {
	Mux      *http.ServeMux
	Tokens   *tokens.Manager
	Registry *pairing.Registry
	Confirm  *confirm.Manager
	Audit    *audit.Log
	LAP      *lap.Server

	db      *sql.DB
	closers []io.Closer
	log     *slog.Logger

	shutOnce sync.Once
	shutErr  error
}

// New builds every part. On error whatever was opened is closed again.
func New(ctx context.Context, cfg Config) (_ *App, err error) {
	a := &App{log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	defer func() {
		if err != nil {
			a.closeAll()
		}
	}()
	store := cfg.Store
	if store == "" {
		store = "sqlite"
		if cfg.DataDir == "" {
			store = "memory"
		}
	}
	var tstore tokens.Store
	var cstore confirm.Store
	switch store {
	case "sqlite":
		if cfg.DataDir == "" {
			return nil, errors.New("app: the sqlite store needs a DataDir")
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("app: data dir: %w", err)
		}
		if a.db, err = openDB(filepath.Join(cfg.DataDir, "lapd.db")); err != nil {
			return nil, err
		}
		ts, err := tokens.NewSQLiteStoreDB(a.db)
		if err != nil {
			return nil, fmt.Errorf("app: token store: %w", err)
		}
		// Records in memory in front of SQLite: a LAP call reads and
		// writes no token row (tokens.CachedStore says what that costs).
		tstore = tokens.NewCachedStore(ts, tokens.CacheConfig{Clock: cfg.Clock})
		cs, err := confirm.NewSQLiteStore(a.db)
		if err != nil {
			return nil, fmt.Errorf("app: confirm store: %w", err)
		}
		cstore = cs
	case "memory":
		tstore = tokens.NewMemoryStore()
		cstore = confirm.NewMemoryStore()
	default:
		return nil, fmt.Errorf("app: unknown store %q (want sqlite or memory)", store)
	}
	// tokens.Manager does not own the store: close it ourselves.
	a.closers = append(a.closers, tstore)

	sinks := append([]audit.Sink(nil), cfg.AuditSinks...)
	if cfg.AuditStdout {
		sinks = append(sinks, audit.NewJSONLSink(os.Stdout))
	}
	if cfg.AuditFile != "" {
		fs, err := audit.OpenJSONLFile(cfg.AuditFile)
		if err != nil {
			return nil, fmt.Errorf("app: audit file: %w", err)
		}
		fs.SetRetention(cfg.AuditRetention)
		sinks = append(sinks, fs)
	}
	if cfg.AuditSQLite {
		if a.db == nil {
			return nil, errors.New("app: AuditSQLite needs the sqlite store")
		}
		ss, err := audit.NewSQLiteSink(a.db)
		if err != nil {
			return nil, fmt.Errorf("app: audit sqlite sink: %w", err)
		}
		ss.SetRetention(cfg.AuditRetention)
		sinks = append(sinks, ss)
	}
	a.Audit = audit.New(audit.Config{Sinks: sinks, Logger: a.log, Clock: cfg.Clock})

	if a.Tokens, err = tokens.NewManager(tokens.Config{Store: tstore, TTL: cfg.TokenTTL, SlidingTTL: cfg.SlidingTTL, Grace: cfg.Grace, Clock: cfg.Clock}); err != nil {
		return nil, err
	}
	if a.Registry, err = pairing.New(pairing.Config{
		Tokens: a.Tokens, Audit: a.Audit, Logger: a.log, AllowedOrigins: cfg.Origins,
		PingInterval: cfg.PingInterval, RPCTimeout: cfg.RPCTimeout, Retention: cfg.Grace,
	}); err != nil {
		return nil, err
	}
	// confirm needs the LAP server's OnConfirmExpire, and the LAP server needs
	// confirm: the hook is installed once the server exists (SetOnExpire
	// delivers expiries that happened before it, e.g. approvals loaded from
	// the store already expired, instead of losing them).
	if a.Confirm, err = confirm.New(ctx, confirm.Config{Store: cstore, Expiry: cfg.ConfirmExpiry, Clock: cfg.Clock, Logger: a.log}); err != nil {
		return nil, err
	}
	srv, err := lap.New(lap.Config{
		Tokens: a.Tokens, Registry: a.Registry, Confirm: a.Confirm, Audit: a.Audit, Logger: a.log,
		LAPRate: cfg.LAPRate, LAPBurst: cfg.LAPBurst, MintRate: cfg.MintRate, MintBurst: cfg.MintBurst,
		Identity: cfg.Identity, AllowAnonymous: cfg.AllowAnonymous, CORSOrigins: cfg.Origins,
		TrustProxy: cfg.TrustProxy, PublicURL: cfg.PublicURL, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	a.Confirm.SetOnExpire(srv.OnConfirmExpire)
	a.LAP = srv

	a.Mux = http.NewServeMux()
	a.Mux.Handle("/agent/ws", a.Registry)
	a.Mux.Handle("/agent/", srv.Handler())
	a.Mux.HandleFunc("GET /healthz", a.healthz)
	return a, nil
}

func openDB(path string) (*sql.DB, error) {
	db, err := sqlitedb.Open(path)
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	return db, nil
}

func (a *App) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if a.LAP.Draining() {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"shutting-down"}`))
		return
	}
	b, _ := json.Marshal(map[string]any{"status": "ok", "tabs": a.LAP.PairedTabs()})
	_, _ = w.Write(b)
}

// Shutdown stops a, within ctx's deadline, in this order:
//
//  1. Drain the LAP server: new calls get 503 shutting-down, long polls
//     (/wait, approvals) end at once; wait for the calls in flight, for at
//     most half of the time left.
//  2. Close every tab with 1012 (it reconnects to the next process); calls
//     still waiting on a tab fail with 503 shutting-down.
//  3. Wait for the last calls with the rest of the time.
//  4. Close approvals, the stores, and the audit log last: it writes every
//     queued entry before its sinks close, so no entry of steps 1–3 is lost.
//
// It returns an error when ctx ran out before step 3 ended (the stores and
// the audit log are closed anyway; an entry recorded after that is logged
// instead, see audit.Log.Close). Calling it again returns the first result.
func (a *App) Shutdown(ctx context.Context) error {
	a.shutOnce.Do(func() { a.shutErr = a.shutdown(ctx) })
	return a.shutErr
}

func (a *App) shutdown(ctx context.Context) error {
	a.LAP.Drain()
	var errs []error
	half, cancel := halfOf(ctx)
	if err := a.LAP.WaitIdle(half); err != nil {
		a.log.Warn("shutdown: calls still in flight after half the shutdown time; closing the tabs", "err", err)
	}
	cancel()
	if err := a.Registry.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("closing tabs: %w", err))
	}
	if err := a.LAP.WaitIdle(ctx); err != nil {
		errs = append(errs, fmt.Errorf("waiting for in-flight calls: %w", err))
	}
	if err := a.Confirm.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing approvals: %w", err))
	}
	errs = append(errs, a.closeAll())
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

func (a *App) closeAll() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		if err := a.closers[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	a.closers = nil
	if a.Audit != nil {
		if err := a.Audit.Close(); err != nil {
			errs = append(errs, err)
		}
		a.Audit = nil
	}
	if a.db != nil {
		if err := a.db.Close(); err != nil {
			errs = append(errs, err)
		}
		a.db = nil
	}
	return errors.Join(errs...)
}
