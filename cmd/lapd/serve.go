package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/internal/app"
	"github.com/lapd-dev/lapd/lap"
)

// runServe is `lapd serve`.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) error {
	c, err := parseServeFlags(args, stderr, env)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := newLogger(stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	acfg, err := appConfig(c, stdout, log)
	if err != nil {
		return err
	}
	if c.Pprof != "" {
		stopPprof, err := startPprof(c.Pprof, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with --addr or LAPD_ADDR)", c.Addr, err)
	}
	a, err := app.New(ctx, acfg)
	if err != nil {
		ln.Close()
		return err
	}
	closeExtras, err := mountExtras(a, c, log)
	if err != nil {
		ln.Close()
		a.Shutdown(context.Background())
		return err
	}
	hs := &http.Server{
		Handler:           a.Mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	base := "http://" + ln.Addr().String()
	log.Info("lapd listening on "+base, "data_dir", dataDirOrMemory(c), "anonymous_mint", acfg.AllowAnonymous,
		"demo", c.Demo, "mcp", c.MCP)
	if c.Demo {
		fmt.Fprintf(stderr, "\n  Demo app:      %s/\n  MCP endpoint:  %s/agent/mcp\n  LAP base:      %s/agent/lap/v1\n\n", base, base, base)
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		a.Shutdown(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: refusing new calls, finishing in-flight ones", "timeout", c.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	// Order: the app drains LAP and closes tabs with 1012 (they reconnect to
	// the next process) while the listener still answers in-flight requests;
	// then the HTTP server stops.
	errMCP := closeExtras(sctx)
	errApp := a.Shutdown(sctx)
	hs.SetKeepAlivesEnabled(false)
	errHTTP := hs.Shutdown(sctx)
	if errors.Is(errHTTP, context.DeadlineExceeded) {
		hs.Close()
	}
	if err := errors.Join(errMCP, errApp, errHTTP); err != nil {
		log.Warn("shutdown finished with errors", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}

func dataDirOrMemory(c serveConfig) string {
	if c.Store == "memory" {
		return "(memory)"
	}
	return c.DataDir
}

// appConfig turns flags into the composition root's config: the only place
// where choices between implementations are made.
func appConfig(c serveConfig, stdout io.Writer, log *slog.Logger) (app.Config, error) {
	acfg := app.Config{
		DataDir:       c.DataDir,
		Store:         c.Store,
		Logger:        log,
		Origins:       splitList(c.Origins),
		TrustProxy:    c.TrustProxy,
		PublicURL:     strings.TrimRight(c.PublicURL, "/"),
		LAPRate:       rate.Limit(float64(c.LAPRate) / 60),
		LAPBurst:      c.LAPRate,
		MintRate:      rate.Limit(float64(c.MintRate) / 60),
		MintBurst:     c.MintRate,
		TokenTTL:      c.TokenTTL,
		SlidingTTL:    c.SlidingTTL,
		Grace:         c.Grace,
		PingInterval:  c.PingInterval,
		ConfirmExpiry: c.ConfirmExpiry,
	}
	if c.Store == "memory" {
		acfg.DataDir = ""
	}
	acfg.AuditRetention, _ = parseRetention(c.AuditRetention) // checked by parseServeFlags
	switch c.AllowAnonymous {
	case "true":
		acfg.AllowAnonymous = true
	case "auto":
		acfg.AllowAnonymous = isLoopback(c.Addr)
	}
	for _, s := range splitList(c.Audit) {
		switch {
		case s == "stdout":
			acfg.AuditStdout = true
		case s == "sqlite":
			if c.Store != "sqlite" {
				return acfg, usageError{"--audit sqlite needs --store sqlite"}
			}
			acfg.AuditSQLite = true
		case strings.HasPrefix(s, "file:"):
			acfg.AuditFile = strings.TrimPrefix(s, "file:")
		case s == "none":
		default:
			return acfg, usageError{fmt.Sprintf("--audit: unknown sink %q (want stdout, file:PATH, sqlite or none)", s)}
		}
	}
	if c.Store == "sqlite" && !acfg.AuditSQLite && !strings.Contains(c.Audit, "none") {
		// Keep a queryable copy for `lapd audit` by default.
		acfg.AuditSQLite = true
	}
	id, err := identity(c)
	if err != nil {
		return acfg, err
	}
	acfg.Identity = id
	return acfg, nil
}

func identity(c serveConfig) (lap.IdentityResolver, error) {
	cookie := c.IdentityCookie != ""
	jwt := c.JWTCookie != "" || c.JWTHeader != ""
	switch {
	case cookie && jwt:
		return nil, usageError{"choose one identity: --identity-cookie or --jwt-cookie/--jwt-header"}
	case cookie:
		id, err := lap.NewCookieIdentity(c.IdentityCookie, c.IdentityCookieKey)
		if err != nil {
			return nil, usageError{"--identity-cookie: " + err.Error()}
		}
		return id, nil
	case jwt:
		cfg := lap.JWTConfig{Cookie: c.JWTCookie, Header: c.JWTHeader, HS256: c.JWTHS256Secret,
			Issuer: c.JWTIssuer, Audience: c.JWTAudience, Claim: c.JWTClaim}
		if c.JWTPublicKeyFile != "" {
			pem, err := os.ReadFile(c.JWTPublicKeyFile)
			if err != nil {
				return nil, usageError{"--jwt-public-key: " + err.Error()}
			}
			cfg.PublicKeyPEM = string(pem)
		}
		id, err := lap.NewJWTIdentity(cfg)
		if err != nil {
			return nil, usageError{"JWT identity: " + err.Error()}
		}
		return id, nil
	}
	return nil, nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{"--log-level must be debug, info, warn or error"}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{"--log-format must be text or json"}
}
