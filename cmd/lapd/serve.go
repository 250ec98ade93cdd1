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
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/mcp"
)

// runServe is `lapd serve`.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) error {
	c, err := parseServeFlags(args, stdout, env)
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
	// The audit goes to stdout by default: when its reader goes away
	// (lapd serve | head, a log shipper that dies), Go's default for a
	// broken pipe on stdout was to die of SIGPIPE, silently, losing the
	// audit queue. Ignored, the write fails with EPIPE and the stdout sink
	// fails like any sink: counted, logged, /readyz not ready.
	signal.Ignore(syscall.SIGPIPE)
	lcfg, err := lapdConfig(c, stdout, log)
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
	var aln net.Listener
	if c.AdminAddr != "" {
		if aln, err = net.Listen("tcp", c.AdminAddr); err != nil {
			ln.Close()
			return fmt.Errorf("admin: listen on %s: %w (choose another with --admin-addr or LAPD_ADMIN_ADDR)", c.AdminAddr, err)
		}
	}
	closeListeners := func() {
		ln.Close()
		if aln != nil {
			aln.Close()
		}
	}
	l, err := lapd.New(ctx, lcfg)
	if err != nil {
		closeListeners()
		return err
	}
	hs := &http.Server{
		Handler:           l.Handler(),
		ConnState:         l.ConnState,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	urls := listenURLs(ln.Addr(), interfaceAddrs)
	base := urls[0]
	origins := "same origin only"
	if len(lcfg.Origins) > 0 {
		origins = "same origin + " + strings.Join(lcfg.Origins, ", ")
	}
	log.Info("lapd listening on "+base, "data_dir", dataDirOrMemory(c), "anonymous_mint", lcfg.AllowAnonymous,
		"demo", c.Demo, "mcp", c.MCP, "origins", origins)
	if c.NATS != "" {
		log.Info("cluster node", "node", lcfg.NodeID, "cluster", c.ClusterName, "nats", redactURL(c.NATS))
	}
	if !lcfg.AllowAnonymous && lcfg.Identity == nil {
		log.Warn("anonymous mint is off and no identity is configured: nobody can mint a token", "fix", "--allow-anonymous true, or --identity-cookie / --jwt-cookie / --jwt-header")
	}
	var ahs *http.Server
	adminURL := ""
	if aln != nil {
		adminURL = "http://" + aln.Addr().String()
		ahs = &http.Server{
			Handler:           l.AdminHandler(),
			ConnState:         l.ConnState,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		access := "loopback clients only"
		if c.AdminToken != "" {
			access = "admin token required"
		}
		log.Info("admin listening on "+adminURL, "console", adminURL+"/admin/", "metrics", adminURL+"/metrics", "access", access)
	}
	printBanner(stderr, c, lcfg, urls, adminURL)
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }()
	if ahs != nil {
		go func() { errc <- fmt.Errorf("admin: %w", ahs.Serve(aln)) }()
	}
	select {
	case err := <-errc:
		l.Shutdown(context.Background())
		hs.Close()
		if ahs != nil {
			ahs.Close()
		}
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: refusing new calls, finishing in-flight ones (a second signal stops at once)", "timeout", c.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	// A second SIGINT/SIGTERM/SIGHUP (Ctrl-C twice) ends the wait for in-flight
	// calls: it used to be swallowed, and only SIGKILL, which loses the
	// queued audit entries, stopped a lapd waiting out a long
	// --shutdown-timeout. The tabs are still closed and the audit written.
	again := make(chan os.Signal, 1)
	signal.Notify(again, stopSignals...)
	defer signal.Stop(again)
	forced := make(chan struct{})
	go func() {
		select {
		case <-again:
			log.Warn("second signal: stopping now, without waiting for in-flight calls (they are cut; the audit is still written)")
			close(forced)
			cancel()
		case <-sctx.Done():
		}
	}()
	// Order: lapd closes MCP sessions, drains LAP and closes tabs with 1012
	// (they reconnect to the next process) while the listener still answers
	// in-flight requests; then the HTTP server stops.
	errLapd := l.Shutdown(sctx)
	hs.SetKeepAlivesEnabled(false)
	errHTTP := hs.Shutdown(sctx)
	if errors.Is(errHTTP, context.DeadlineExceeded) {
		hs.Close()
	}
	if ahs != nil { // last: /readyz said "draining" until here
		if err := ahs.Shutdown(sctx); err != nil {
			ahs.Close()
		}
	}
	select {
	case <-forced:
		return errors.New("stopped by a second signal before in-flight calls finished")
	default:
	}
	if err := errors.Join(errLapd, errHTTP); err != nil {
		log.Warn("shutdown finished with errors", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}

// listenURLs are the http:// base URLs under which the listener at addr can
// be reached, this machine's first. An unspecified host (0.0.0.0, ::) is
// written as 127.0.0.1 followed by the machine's other addresses (from
// addrs), at most 4, IPv4 first; link-local addresses are left out.
func listenURLs(addr net.Addr, addrs func() ([]net.Addr, error)) []string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return []string{"http://" + addr.String()}
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsUnspecified() {
		return []string{"http://" + net.JoinHostPort(host, port)}
	}
	urls := []string{"http://" + net.JoinHostPort("127.0.0.1", port)}
	var v4, v6 []string
	if as, err := addrs(); err == nil {
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsUnspecified() {
				continue
			}
			u := "http://" + net.JoinHostPort(n.IP.String(), port)
			if n.IP.To4() != nil {
				v4 = append(v4, u)
			} else if ip.To4() == nil { // IPv6 addresses only when listening on ::
				v6 = append(v6, u)
			}
		}
	}
	others := append(v4, v6...)
	return append(urls, others[:min(len(others), 4)]...)
}

func interfaceAddrs() ([]net.Addr, error) { return net.InterfaceAddrs() }

// printBanner tells the human where lapd is and what will not work as they
// might expect (anonymous mint off beyond loopback).
func printBanner(w io.Writer, c serveConfig, lcfg lapd.Config, urls []string, adminURL string) {
	base := urls[0]
	if c.PublicURL != "" {
		base = strings.TrimRight(c.PublicURL, "/")
		urls = []string{base}
	}
	fmt.Fprintln(w)
	if c.Demo {
		fmt.Fprintf(w, "  Demo app:      %s/\n", urls[0])
		for _, u := range urls[1:] {
			fmt.Fprintf(w, "                 %s/  (from other machines)\n", u)
		}
	}
	if c.MCP {
		fmt.Fprintf(w, "  MCP endpoint:  %s/agent/mcp\n", base)
	}
	fmt.Fprintf(w, "  LAP base:      %s/agent/lap/v1\n", base)
	fmt.Fprintf(w, "  Audit trail:   %s\n", auditWhere(lcfg))
	if adminURL != "" {
		fmt.Fprintf(w, "  Admin console: %s/admin/   (metrics: %s/metrics; not on the public address)\n", adminURL, adminURL)
	}
	if !lcfg.AllowAnonymous && lcfg.Identity == nil {
		why := "--allow-anonymous is false"
		switch {
		case c.AllowAnonymous == "auto" && isLoopback(c.Addr):
			why = "lapd is behind a proxy (--trust-proxy or --public-url),\n  where every request arrives from loopback, and --allow-anonymous is auto"
		case c.AllowAnonymous == "auto":
			why = "lapd listens beyond loopback (" + c.Addr + ")\n  and --allow-anonymous is auto"
		}
		fmt.Fprintf(w, "\n  Anonymous mint is off: %s, and no identity is configured.\n"+
			"  \"Connect an AI\" in the app will answer 401 auth-required. To let anyone who can\n"+
			"  reach this address connect an AI, add --allow-anonymous true; to require a\n"+
			"  signed-in user, set --identity-cookie or --jwt-cookie/--jwt-header (lapd serve --help).\n", why)
	}
	fmt.Fprintln(w)
}

// auditWhere says where the audit entries go, for the banner: the JSON
// lines that appear on stdout at the first click are the audit trail, and
// lapd audit reads the SQLite copy.
func auditWhere(cfg lapd.Config) string {
	var to []string
	if cfg.AuditStdout {
		to = append(to, "stdout (one JSON line each)")
	}
	if cfg.AuditFile != "" {
		to = append(to, cfg.AuditFile)
	}
	if cfg.AuditSQLite {
		to = append(to, filepath.Join(cfg.DataDir, "lapd.db")+" (lapd audit reads it)")
	}
	if cfg.AuditNATS {
		to = append(to, "the cluster's stream (lapd audit --nats)")
	}
	if len(to) == 0 {
		return "off (--audit none)"
	}
	return strings.Join(to, "; ")
}

// redactURL drops user info (credentials) from NATS URLs for the log.
func redactURL(list string) string {
	var out []string
	for _, u := range splitList(list) {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if i := strings.Index(u, "://"); i >= 0 && i < at {
				u = u[:i+3] + "…@" + u[at+1:]
			}
		}
		out = append(out, u)
	}
	return strings.Join(out, ",")
}

func dataDirOrMemory(c serveConfig) string {
	if c.Store == "memory" {
		return "(memory)"
	}
	return c.DataDir
}

// lapdConfig turns flags into lapd.Config; lapd.New makes the choices
// between implementations from it.
func lapdConfig(c serveConfig, stdout io.Writer, log *slog.Logger) (lapd.Config, error) {
	acfg := lapd.Config{
		DataDir:           c.DataDir,
		Store:             c.Store,
		Logger:            log,
		Origins:           splitList(c.Origins),
		Hosts:             splitList(c.Hosts),
		TrustProxy:        c.TrustProxy,
		MaxConnsPerClient: c.MaxConnsClient,
		MaxConns:          c.MaxConns,
		PublicURL:         strings.TrimRight(c.PublicURL, "/"),
		LAPRate:           rate.Limit(float64(c.LAPRate) / 60),
		LAPBurst:          c.LAPRate,
		MintRate:          rate.Limit(float64(c.MintRate) / 60),
		MintBurst:         c.MintRate,
		TokenTTL:          c.TokenTTL,
		SlidingTTL:        c.SlidingTTL,
		Grace:             c.Grace,
		PingInterval:      c.PingInterval,
		ConfirmExpiry:     c.ConfirmExpiry,
		MaxKeptBytes:      int64(c.MaxKeptMiB) << 20,
		DisableMCP:        !c.MCP,
		MCPTools:          mcpTools(c.Tools),
		MCPNoFastPath:     !c.MCPFastPath,
		Admin:             lapd.AdminConfig{Enabled: c.AdminAddr != "", Token: c.AdminToken},
		Demo:              c.Demo,
		Version:           lapdVersion(),
	}
	if c.Store == "memory" {
		acfg.DataDir = ""
	}
	if c.NATS != "" {
		acfg.Store = "nats"
		acfg.NATSURL = c.NATS
		acfg.ClusterName = c.ClusterName
		acfg.NodeID = c.NodeID
		if acfg.NodeID == "" {
			host, _ := os.Hostname()
			acfg.NodeID = fmt.Sprintf("%s-%d", host, os.Getpid())
		}
		acfg.NATSReplicas = c.NATSReplicas
		acfg.PeerListen, acfg.PeerAdvertise, acfg.PeerTLS = c.PeerListen, c.PeerAdvertise, c.PeerTLS
		if c.NATSCreds != "" {
			acfg.NATSOptions = append(acfg.NATSOptions, nats.UserCredentials(c.NATSCreds))
		}
		if c.NATSCA != "" {
			acfg.NATSOptions = append(acfg.NATSOptions, nats.RootCAs(c.NATSCA))
		}
		if c.NATSCert != "" {
			acfg.NATSOptions = append(acfg.NATSOptions, nats.ClientCert(c.NATSCert, c.NATSKey))
		}
	}
	acfg.AuditRetention, _ = parseRetention(c.AuditRetention) // checked by parseServeFlags
	switch c.AllowAnonymous {
	case "true":
		acfg.AllowAnonymous = true
	case "auto":
		// Behind a proxy every request arrives from loopback, from anyone:
		// loopback then says nothing about who is asking.
		acfg.AllowAnonymous = isLoopback(c.Addr) && c.TrustProxy == 0 && c.PublicURL == ""
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
		case s == "nats":
			if c.NATS == "" {
				return acfg, usageError{"--audit nats needs --nats"}
			}
			acfg.AuditNATS = true
		case s == "none":
		default:
			return acfg, usageError{fmt.Sprintf("--audit: unknown sink %q (want stdout, file:PATH, sqlite, nats or none)", s)}
		}
	}
	if c.NATS != "" && !strings.Contains(c.Audit, "none") {
		// The cluster's trail, for lapd audit --nats.
		acfg.AuditNATS = true
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
	// Every log line (the HTTP server's own included) has agent tokens and
	// tab secrets cut out, wherever they stand.
	switch format {
	case "text":
		return slog.New(lapd.RedactLogs(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(lapd.RedactLogs(slog.NewJSONHandler(w, opts))), nil
	}
	return nil, usageError{"--log-format must be text or json"}
}

// mcpTools is --tools as an mcp.ToolSet (parseServeFlags checked it).
func mcpTools(s string) mcp.ToolSet {
	t, _ := mcp.ParseToolSet(s)
	return t
}
