package main

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/mcp"
)

// serveConfig is everything `lapd serve` can be told.
type serveConfig struct {
	Addr            string
	PublicURL       string
	DataDir         string
	Store           string
	Origins         string
	Hosts           string
	AllowAnonymous  string // auto | true | false
	TrustProxy      int
	MaxConnsClient  int
	MaxConns        int
	TokenTTL        time.Duration
	SlidingTTL      time.Duration
	Grace           time.Duration
	ConfirmExpiry   time.Duration
	PingInterval    time.Duration
	LAPRate         int
	MintRate        int
	Audit           string
	AuditRetention  string
	LogLevel        string
	LogFormat       string
	Demo            bool
	MCP             bool
	Tools           string
	MCPFastPath     bool
	ShutdownTimeout time.Duration
	Pprof           string
	AdminAddr       string // "" = no admin listener
	AdminToken      string
	MaxKeptMiB      int

	NATS        string // cluster: NATS URL(s), comma-separated
	NATSCreds   string
	NATSCA      string
	NATSCert    string
	NATSKey     string
	ClusterName string
	NodeID      string
	// NATSReplicas: 0 = unset (1 for new buckets, existing ones keep theirs).
	NATSReplicas  int
	PeerListen    string // "off" = no peer link
	PeerAdvertise string
	PeerTLS       string // auto, on, off

	IdentityCookie    string
	IdentityCookieKey string
	JWTCookie         string
	JWTHeader         string
	JWTHS256Secret    string
	JWTPublicKeyFile  string
	JWTIssuer         string
	JWTAudience       string
	JWTClaim          string
}

// parseServeFlags reads `lapd serve`'s flags and environment; --help is
// written to out.
func parseServeFlags(args []string, out io.Writer, env func(string) string) (serveConfig, error) {
	var c serveConfig
	fs := newFlagSet("lapd serve", out, env)
	fs.String(&c.Addr, "addr", "127.0.0.1:8787", "listen address")
	fs.String(&c.PublicURL, "public-url", "", "the origin users reach lapd at when it is behind a proxy, scheme://host[:port] such as https://app.example.com (no path: lapd serves /agent/ there); the connect line and the banner use it; default: from each request")
	fs.String(&c.DataDir, "data-dir", "lapd-data", "directory for the SQLite database (tokens, pending approvals, audit)")
	fs.String(&c.Store, "store", "sqlite", "token and approval store: sqlite (in --data-dir) or memory (lost on restart)")
	fs.String(&c.Origins, "origins", "", "comma-separated extra origins allowed for the WebSocket, CORS on meta routes and /agent/mcp, each scheme://host[:port] such as https://app.example.com (same origin is always allowed)")
	fs.String(&c.Hosts, "hosts", "", "comma-separated extra Host names served on a loopback listener (loopback names and the --public-url host always are); any other Host is refused (DNS-rebinding protection)")
	fs.String(&c.AllowAnonymous, "allow-anonymous", "auto", "mint tokens without an identity: auto (only when listening on loopback and neither --trust-proxy nor --public-url is set), true, false")
	fs.Int(&c.TrustProxy, "trust-proxy", 0, "number of reverse proxies in front of lapd whose X-Forwarded-* headers are trusted")
	fs.Int(&c.MaxConnsClient, "max-conns-per-client", 0, "HTTP connections one client address (all of 127.0.0.0/8 as one; IPv6: its /64) may keep open; past it a new connection closes the client's longest-idle one, or gets 503 too-many-connections when all are busy (0 = 256, or no cap with --trust-proxy, where the proxy must cap its clients; -1 = no cap)")
	fs.Int(&c.MaxConns, "max-conns", 0, "HTTP connections open in all (0 = three quarters of the open-file limit; -1 = no cap); upgraded WebSockets do not count")
	fs.Duration(&c.TokenTTL, "token-ttl", 24*time.Hour, "hard expiry of an agent token, a `duration` like 24h")
	fs.Duration(&c.SlidingTTL, "sliding-ttl", 0, "expire a token unused for this long (0 = off)")
	fs.Duration(&c.Grace, "grace", 60*time.Second, "how long a disconnected tab may re-pair with the same token")
	fs.Duration(&c.ConfirmExpiry, "confirm-expiry", 10*time.Minute, "an approval nobody answers is rejected (reason timeout) after this long")
	fs.Duration(&c.PingInterval, "heartbeat", 15*time.Second, "WebSocket heartbeat interval; a tab silent for two and a half is closed (a hidden one: 2.5 minutes at least)")
	fs.Int(&c.LAPRate, "lap-rate", 30, "LAP calls per minute per token (burst the same)")
	fs.Int(&c.MintRate, "mint-rate", 30, "mints per minute per identity or client IP (burst the same)")
	fs.String(&c.Audit, "audit", "stdout", "audit sinks, comma-separated: stdout, file:PATH, sqlite (in --data-dir), nats (the cluster's stream; on by default with --nats), none; with --store sqlite a copy goes to lapd.db in --data-dir too, for lapd audit, unless none")
	fs.String(&c.AuditRetention, "audit-retention", "30d,1GiB", "what the file and sqlite audit sinks keep: a maximum age (30d, 12h) and/or size (1GiB, 500MB), comma-separated; off = everything")
	fs.String(&c.LogLevel, "log-level", "info", "debug, info, warn, error")
	fs.String(&c.LogFormat, "log-format", "text", "text or json (logs go to stderr)")
	fs.Bool(&c.Demo, "demo", true, "serve the demo app at /")
	fs.Bool(&c.MCP, "mcp", true, "serve the MCP Streamable HTTP endpoint at /agent/mcp")
	fs.Bool(&c.MCPFastPath, "mcp-fast-path", true, "answer plain tools/call requests at /agent/mcp without mcp-go's JSON-RPC machinery (same bytes, less CPU); false sends every request through mcp-go")
	fs.String(&c.Tools, "tools", "core", "MCP tools listed at /agent/mcp: core (connect_session, observe, send_message, get_confirm_result, wait_for_change, narrate) or all (16); every tool answers when called by name")
	fs.Duration(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown (SIGINT, SIGTERM) may take: in-flight calls get half of it, then tabs are told to reconnect and the audit is written out")
	fs.String(&c.Pprof, "pprof", "", "serve Go's profiler (net/http/pprof) on this separate address, e.g. 127.0.0.1:6060; off by default, never expose it")
	fs.String(&c.AdminAddr, "admin-addr", "", "serve the admin console (/admin/), /metrics, pprof and health on this separate address, e.g. 127.0.0.1:9090 (a bare :9090 means loopback); off when empty")
	fs.String(&c.AdminToken, "admin-token", "", "token required by the admin listener (at least 16 characters; prefer the env variable to the flag, which other users can see in ps); without it only loopback clients are served")
	fs.Int(&c.MaxKeptMiB, "max-kept-mib", 512, "ceiling in MiB of session data kept in memory (log rings, hellos, kept outcomes, idempotent results, compiled policies); over it lapd sheds the heaviest sessions' oldest data and logs it")
	fs.String(&c.NATS, "nats", "", "join a cluster: NATS server URL(s), comma-separated (nats://host:4222); tokens and approvals then live in JetStream KV and every node serves every tab (docs/CLUSTER.md)")
	fs.String(&c.NATSCreds, "nats-creds", "", "NATS credentials file (JWT + nkey), for --nats")
	fs.String(&c.NATSCA, "nats-ca", "", "PEM file of the CA that signed the NATS server's certificate, for --nats with TLS")
	fs.String(&c.NATSCert, "nats-cert", "", "PEM client certificate for NATS mutual TLS (with --nats-key)")
	fs.String(&c.NATSKey, "nats-key", "", "PEM client key for NATS mutual TLS (with --nats-cert)")
	var replicas string
	fs.String(&replicas, "nats-replicas", "", "copies JetStream keeps of the cluster's KV buckets and audit stream, 1 to 5 (more than 1 needs a JetStream cluster of that many servers); each node makes every bucket and the stream have this many, and refuses to start if the servers cannot; unset: 1 for what the node creates, and what exists keeps its replicas (docs/CLUSTER.md)")
	fs.String(&c.ClusterName, "cluster-name", "lapd", "prefix of the NATS subjects and KV buckets: every node of one cluster uses the same; two clusters on one NATS use different ones")
	fs.String(&c.PeerListen, "peer-listen", "127.0.0.1:0", "with --nats: the TCP address of this node's peer link, on which other nodes send calls for tabs held here directly instead of through the NATS server (faster; authenticated; TLS unless on loopback, see --peer-tls); off = every call by NATS (docs/CLUSTER.md)")
	fs.String(&c.PeerAdvertise, "peer-advertise", "", "with --nats: the host:port other nodes dial to reach --peer-listen; default the listener's own address (required when --peer-listen is on every interface, e.g. :7422)")
	fs.String(&c.PeerTLS, "peer-tls", "auto", "with --nats: encrypt the peer link with TLS (a certificate the node makes at start, pinned by the fingerprint it publishes on NATS): auto = unless the address other nodes dial is loopback, on, or off")
	fs.String(&c.NodeID, "node-id", "", "this node's name in logs and NATS connection names; default host-pid")
	fs.String(&c.IdentityCookie, "identity-cookie", "", "name of a signed cookie <uid>.<base64url(HMAC-SHA256(key, uid))> that names the user for mint")
	fs.String(&c.IdentityCookieKey, "identity-cookie-key", "", "HMAC key for --identity-cookie (at least 32 characters)")
	fs.String(&c.JWTCookie, "jwt-cookie", "", "cookie holding the host app's login JWT (names the user for mint)")
	fs.String(&c.JWTHeader, "jwt-header", "", "header holding the host app's login JWT, e.g. Authorization")
	fs.String(&c.JWTHS256Secret, "jwt-hs256-secret", "", "HS256 secret for the login JWT")
	fs.String(&c.JWTPublicKeyFile, "jwt-public-key", "", "PEM file with an RS256 or ES256 public key for the login JWT")
	fs.String(&c.JWTIssuer, "jwt-issuer", "", "required iss of the login JWT")
	fs.String(&c.JWTAudience, "jwt-audience", "", "required aud of the login JWT")
	fs.String(&c.JWTClaim, "jwt-claim", "sub", "claim of the login JWT that holds the user id")
	if err := fs.parse(args); err != nil {
		return c, err
	}
	switch c.Store {
	case "sqlite", "memory":
	default:
		return c, usageError{"--store must be sqlite or memory, not " + c.Store}
	}
	switch c.AllowAnonymous {
	case "auto", "true", "false":
	default:
		return c, usageError{"--allow-anonymous must be auto, true or false, not " + c.AllowAnonymous}
	}
	if (c.NATSCert == "") != (c.NATSKey == "") {
		return c, usageError{"--nats-cert and --nats-key go together"}
	}
	if c.NATS == "" && (c.NATSCreds != "" || c.NATSCA != "" || c.NATSCert != "") {
		return c, usageError{"--nats-creds, --nats-ca and --nats-cert need --nats"}
	}
	if replicas != "" {
		n, err := strconv.Atoi(replicas)
		if err != nil || n < 1 || n > 5 {
			return c, usageError{fmt.Sprintf("--nats-replicas %q: want a number from 1 to 5 (JetStream keeps at most 5 copies)", replicas)}
		}
		if c.NATS == "" {
			return c, usageError{"--nats-replicas needs --nats"}
		}
		c.NATSReplicas = n
	}
	if c.PeerListen != "off" {
		host, _, err := net.SplitHostPort(c.PeerListen)
		if err != nil {
			return c, usageError{fmt.Sprintf("--peer-listen %q: want host:port, such as 127.0.0.1:0 or 10.0.0.5:7422, or off", c.PeerListen)}
		}
		if ip := net.ParseIP(host); (host == "" || ip != nil && ip.IsUnspecified()) && c.PeerAdvertise == "" && c.NATS != "" {
			return c, usageError{fmt.Sprintf("--peer-listen %q listens on every interface: say which address the other nodes dial with --peer-advertise host:port", c.PeerListen)}
		}
	}
	switch c.PeerTLS {
	case "auto", "on", "off":
	default:
		return c, usageError{fmt.Sprintf("--peer-tls %q: want auto, on or off", c.PeerTLS)}
	}
	if c.PeerAdvertise != "" {
		if c.NATS == "" {
			return c, usageError{"--peer-advertise needs --nats"}
		}
		if c.PeerListen == "off" {
			return c, usageError{"--peer-advertise needs a peer link (--peer-listen is off)"}
		}
		if _, _, err := net.SplitHostPort(c.PeerAdvertise); err != nil {
			return c, usageError{fmt.Sprintf("--peer-advertise %q: want host:port, such as 10.0.0.5:7422", c.PeerAdvertise)}
		}
	}
	if c.NATS != "" && c.Store == "memory" {
		return c, usageError{"--store memory cannot be shared by a cluster: with --nats, tokens and approvals live in NATS (drop --store)"}
	}
	for _, r := range c.ClusterName {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return c, usageError{fmt.Sprintf("--cluster-name %q: use letters, digits, - and _ only", c.ClusterName)}
		}
	}
	if _, err := parseRetention(c.AuditRetention); err != nil {
		return c, usageError{"--audit-retention: " + err.Error()}
	}
	if c.MaxKeptMiB < 16 {
		return c, usageError{"--max-kept-mib must be at least 16"}
	}
	if c.MaxKeptMiB > maxKeptMiB {
		return c, usageError{fmt.Sprintf("--max-kept-mib %d is more than any machine has (at most %d)", c.MaxKeptMiB, maxKeptMiB)}
	}
	if c.LAPRate <= 0 || c.MintRate <= 0 {
		return c, usageError{"--lap-rate and --mint-rate must be positive"}
	}
	if err := checkDurations(&c); err != nil {
		return c, err
	}
	if c.TrustProxy < 0 {
		return c, usageError{fmt.Sprintf("--trust-proxy %d: give the number of proxies in front of lapd, 0 or more", c.TrustProxy)}
	}
	if c.MaxConns < -1 || c.MaxConnsClient < -1 {
		return c, usageError{"--max-conns and --max-conns-per-client take a number of connections, 0 for the default or -1 for no cap"}
	}
	if _, err := mcp.ParseToolSet(c.Tools); err != nil {
		return c, usageError{"--" + err.Error()}
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return c, usageError{fmt.Sprintf("--addr %q: want host:port, such as 127.0.0.1:8787 or 0.0.0.0:8787", c.Addr)}
	}
	if err := checkAdmin(&c); err != nil {
		return c, err
	}
	origins, err := parseOrigins(c.Origins)
	if err != nil {
		return c, err
	}
	c.Origins = strings.Join(origins, ",")
	if c.PublicURL != "" {
		// lapd serves its routes at /agent on this origin: a path would be
		// dropped from the connect line but kept in the banner, and the
		// page's Origin would never match it.
		u, err := lapd.CleanOrigin(c.PublicURL)
		if err != nil {
			return c, usageError{"--public-url: " + err.Error()}
		}
		c.PublicURL = u
	}
	return c, nil
}

// parseRetention reads --audit-retention: "off", or an age (a Go duration,
// or whole days like 30d) and/or a size (1GiB, 500MB, 64KiB, 1000B),
// comma-separated.
func parseRetention(s string) (audit.Retention, error) {
	var r audit.Retention
	if strings.TrimSpace(s) == "off" || strings.TrimSpace(s) == "0" {
		return r, nil
	}
	for _, p := range splitList(s) {
		if n, ok := parseSize(p); ok {
			if n <= 0 || r.MaxBytes != 0 {
				return r, fmt.Errorf("%q: give one positive size, like 1GiB", p)
			}
			r.MaxBytes = n
			continue
		}
		d, err := time.ParseDuration(p)
		if days, ok := strings.CutSuffix(p, "d"); ok && err != nil {
			var n int
			if _, serr := fmt.Sscanf(days, "%d", &n); serr == nil && fmt.Sprint(n) == days {
				d, err = time.Duration(n)*24*time.Hour, nil
			}
		}
		if err != nil || d <= 0 || r.MaxAge != 0 {
			return r, fmt.Errorf("%q is neither an age like 30d or 12h nor a size like 1GiB (or \"off\")", p)
		}
		r.MaxAge = d
	}
	return r, nil
}

// parseSize reads 1GiB, 500MB, 64KiB, 1000B.
func parseSize(s string) (int64, bool) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			var n int64
			if _, err := fmt.Sscanf(num, "%d", &n); err != nil || fmt.Sprint(n) != num {
				return 0, false
			}
			return n * u.mult, true
		}
	}
	return 0, false
}

// parseOrigins checks --origins with lapd.CleanOrigin and returns the
// origins as browsers write them.
func parseOrigins(list string) ([]string, error) {
	var out []string
	for _, o := range splitList(list) {
		c, err := lapd.CleanOrigin(o)
		if err != nil {
			return nil, usageError{"--origins: " + err.Error()}
		}
		out = append(out, c)
	}
	return out, nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// isLoopback reports whether a listen address only accepts local connections.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkAdmin validates --admin-addr and --admin-token: an address with no
// host (":9090") or a bare port listens on loopback; a non-loopback address
// needs a token; the admin address is never the public one.
func checkAdmin(c *serveConfig) error {
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return usageError{"--admin-token must be at least 16 characters (e.g. openssl rand -hex 24)"}
	}
	if c.AdminAddr == "" {
		if c.AdminToken != "" {
			return usageError{"--admin-token needs --admin-addr (the admin console listens on its own address)"}
		}
		return nil
	}
	if _, err := strconv.Atoi(c.AdminAddr); err == nil {
		c.AdminAddr = ":" + c.AdminAddr
	}
	host, port, err := net.SplitHostPort(c.AdminAddr)
	if err != nil {
		return usageError{fmt.Sprintf("--admin-addr %q: want host:port, such as 127.0.0.1:9090", c.AdminAddr)}
	}
	if host == "" {
		host = "127.0.0.1"
		c.AdminAddr = net.JoinHostPort(host, port)
	}
	if !isLoopback(c.AdminAddr) && c.AdminToken == "" {
		return usageError{fmt.Sprintf("--admin-addr %s listens beyond loopback: set --admin-token (or LAPD_ADMIN_TOKEN) too, or listen on 127.0.0.1", c.AdminAddr)}
	}
	if sameListen(c.AdminAddr, c.Addr) {
		return usageError{fmt.Sprintf("--admin-addr %s is the public --addr: the admin console needs an address of its own", c.AdminAddr)}
	}
	return nil
}

// sameListen reports whether two listen addresses would collide (same port
// on overlapping hosts). Port 0 never collides.
func sameListen(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

// maxKeptMiB bounds --max-kept-mib (8 TiB) so that its value in bytes fits
// an int64.
const maxKeptMiB = 8 << 20

// minHeartbeat is the shortest --heartbeat: a browser delays the timers of a
// busy page by about a second, so a tab answering pings at a shorter interval
// would be closed for missing them.
const minHeartbeat = time.Second

// checkDurations refuses durations that lapd would otherwise replace in
// silence: a zero or negative --token-ttl, --confirm-expiry or --heartbeat
// became the default (24h, 10m, 15s) and --grace 0 too; a negative
// --sliding-ttl turned it off; --shutdown-timeout 0 gave in-flight calls no
// time at all. --heartbeat under a second crashed lapd at the first tab
// (1ns) or closed every tab for missed pongs.
func checkDurations(c *serveConfig) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"token-ttl", c.TokenTTL},
		{"grace", c.Grace},
		{"confirm-expiry", c.ConfirmExpiry},
		{"shutdown-timeout", c.ShutdownTimeout},
	} {
		if d.v <= 0 {
			return usageError{fmt.Sprintf("--%s %v: must be positive, a duration like %s", d.name, d.v, map[string]string{
				"token-ttl": "24h", "grace": "60s", "confirm-expiry": "10m", "shutdown-timeout": "10s"}[d.name])}
		}
	}
	if c.SlidingTTL < 0 {
		return usageError{fmt.Sprintf("--sliding-ttl %v: must be 0 (off) or a positive duration like 30m", c.SlidingTTL)}
	}
	if c.PingInterval < minHeartbeat {
		return usageError{fmt.Sprintf("--heartbeat %v: must be at least %v (the default is 15s)", c.PingInterval, minHeartbeat)}
	}
	return nil
}
