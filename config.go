package lapd

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/mcp"
	"github.com/lapd-dev/lapd/tokens"
)

// Config is everything New needs. The zero Config is a working lapd: memory
// stores, the routes under /agent, the MCP endpoint on, anonymous mint off
// (every mint needs an Identity), no demo app, and each part's own defaults
// (the ones `lapd serve --help` prints).
type Config struct {
	// Prefix is the path every lapd route lives under: {Prefix}/ws,
	// {Prefix}/mint, {Prefix}/lap/v1/…, {Prefix}/mcp, {Prefix}/client.js.
	// Default "/agent", the LAP v2 paths a stock client expects; with another
	// prefix, give lapd.js the same agentBasePath.
	Prefix string

	// Storage. With DataDir set, tokens, pending approvals and (with
	// AuditSQLite) audit entries live in one SQLite file, DataDir/lapd.db
	// (WAL), so a restart inside the grace window is invisible to a tab.
	DataDir string // directory of lapd.db; "" = memory stores
	Store   string // "sqlite" (default when DataDir is set), "memory", or "nats" (the default in a cluster)

	// Cluster (docs/CLUSTER.md). With NATSURL (or NATSConn) set, this lapd
	// is one node of several on that NATS server: token records and
	// approvals live in JetStream KV buckets ("<ClusterName>_tokens",
	// "<ClusterName>_confirm") that every node shares, and a call for a
	// tab whose WebSocket is on another node is forwarded there by NATS
	// request/reply. DataDir then only holds this node's audit copy.
	NATSURL     string        // e.g. nats://127.0.0.1:4222
	NATSOptions []nats.Option // credentials, TLS, … for NATSURL
	NATSConn    *nats.Conn    // your own connection instead of NATSURL; lapd does not close it
	ClusterName string        // prefix of the subjects and buckets; default "lapd"
	NodeID      string        // this node's name in the cluster; default random
	// PeerListen is the TCP address of this node's peer link: other nodes
	// send calls for tabs held here on it directly, not through the NATS
	// server (NATS still finds the tab's node and carries everything
	// else; docs/CLUSTER.md). "" = 127.0.0.1:0 (nodes on one machine);
	// "off" = every call by NATS. Authenticated by a key published on
	// NATS. PeerAdvertise is the address other nodes dial; default the
	// listener's own (required when PeerListen is on every interface).
	// PeerTLS: "" / "auto" = TLS unless that address is loopback (a
	// certificate the node makes at start, pinned by the fingerprint it
	// publishes on NATS), "on", "off".
	PeerListen    string
	PeerAdvertise string
	PeerTLS       string
	// NATSReplicas is how many copies JetStream keeps of the cluster's
	// buckets and audit stream (1..5; more than 1 needs a JetStream
	// cluster of at least that many servers). 0 = 1 for what this node
	// creates, and what exists keeps its replicas; N makes every bucket
	// and the stream have N, and New fails if the servers cannot.
	NATSReplicas int

	// Your own implementations, used instead of the one Store names (for
	// example a store in your app's database). lapd does not close them:
	// they are yours. Each must pass its package's contract suite
	// (tokens/storetest, confirm/storetest).
	TokenStore   tokens.Store
	ConfirmStore confirm.Store

	Logger *slog.Logger // nil = discard; tokens are never logged

	// Audit. Every entry goes to each sink; New opens the ones named here.
	AuditSinks  []audit.Sink // your own sinks (closed by Shutdown)
	AuditFile   string       // JSONL file sink at this path
	AuditStdout bool         // JSONL on stdout
	AuditSQLite bool         // audit_entries table in lapd.db (needs the sqlite store, or a DataDir in a cluster)
	AuditNATS   bool         // the cluster's JetStream stream "<ClusterName>_audit" (needs NATSURL or NATSConn)
	// AuditRetention bounds what the file and SQLite sinks keep (zero =
	// everything); the stdout stream is not bounded here.
	AuditRetention audit.Retention

	// Who may mint. Identity names the human behind a meta request (mint,
	// resume, revoke, sessions) from the host app's own session: wrap your
	// session lookup in lap.IdentityFunc, or use lap.NewCookieIdentity or
	// lap.NewJWTIdentity. A uid of "" is anonymous; AllowAnonymous lets
	// anyone who can reach {Prefix}/mint mint without one.
	Identity       lap.IdentityResolver
	AllowAnonymous bool
	Origins        []string // extra allowed origins: WebSocket Origin check, CORS on meta routes, /agent/mcp
	TrustProxy     int      // reverse proxies whose X-Forwarded-* headers are trusted
	PublicURL      string   // public origin for mint URLs when behind a proxy; "" = from each request
	// Hosts are the Host names served on a loopback listener besides
	// loopback names (localhost, 127.0.0.1, ::1) and PublicURL's host: any
	// other Host there is refused with 403 forbidden-host, on every route
	// (DNS-rebinding protection). A listener on another address is not
	// checked.
	Hosts []string
	// BodyReadTimeout bounds how long a request body may take to arrive
	// (default 10s); Shutdown cuts bodies still arriving at once.
	BodyReadTimeout time.Duration
	// MaxConnsPerClient caps the HTTP connections one client keeps open
	// (clientip's key: its IPv4 address, all of IPv4 loopback as one, or an
	// IPv6 /64), MaxConns those of all clients; over a cap a new connection
	// is answered 503 too-many-connections and closed. A WebSocket stops
	// counting once upgraded. Enforced by Server.ConnState, which the
	// http.Server serving Handler must use (lapd serve does). Defaults:
	// DefaultMaxConnsPerClient (none when TrustProxy > 0: connections then
	// come from the proxy, which must cap its clients), and three quarters of
	// the process's open-file limit in all; < 0 = no cap.
	MaxConnsPerClient int
	MaxConns          int

	// Rates (see lap.Config): per token, and per identity or client IP.
	LAPRate   rate.Limit // default 30/min
	LAPBurst  int        // default 30
	MintRate  rate.Limit // default 30/min
	MintBurst int        // default 30

	// Lifetimes (see tokens.Config, pairing.Config, confirm.Config).
	TokenTTL      time.Duration // hard expiry of a token; default 24h
	SlidingTTL    time.Duration // expire a token unused this long; default off
	Grace         time.Duration // a dropped tab may re-pair within it; default 60s
	PingInterval  time.Duration // WebSocket heartbeat; default 15s
	RPCTimeout    time.Duration // one RPC to the tab; default 15s
	ConfirmExpiry time.Duration // an unanswered approval is rejected after it; default 10m
	Clock         func() time.Time

	// DisableMCP leaves {Prefix}/mcp (the MCP Streamable HTTP endpoint) out
	// of Handler.
	DisableMCP bool
	// MCPTools picks the tools {Prefix}/mcp lists: mcp.ToolsCore (the
	// default: the six that cover connect → act → approve → narrate) or
	// mcp.ToolsAll (16).
	MCPTools mcp.ToolSet
	// MCPNoFastPath sends every /agent/mcp request through mcp-go's own
	// JSON-RPC handling. By default a tools/call that mcp-go would answer
	// with a plain JSON result is answered by the endpoint's fast path with
	// the same bytes (mcp/fastpath.go); this is the escape hatch.
	MCPNoFastPath bool
	// MCPSessions bounds {Prefix}/mcp's stateful (legacy-era) sessions;
	// a zero field keeps the mcp package's default (shown in brackets).
	MCPSessions MCPSessionLimits
	// Demo serves the demo app (Taskboard) at / and /demo/save. It loads
	// /agent/client.js, so it needs the default Prefix.
	Demo bool
	// Version is the server version reported to MCP clients; default
	// Version().
	Version string

	// MaxKeptBytes is the ceiling of the data lapd keeps for sessions in
	// memory (default 512 MiB), split between the parts' byte budgets: tab
	// log rings and hellos 1/4, idempotent /message bodies 1/4, kept
	// approval outcomes 1/8, pending approval payloads 1/8, compiled
	// policies 1/8, and 1/8 left for the /describe cache (it mirrors the
	// hellos). Each part sheds (the heaviest session's oldest data first),
	// logs and counts when over; Stats reports it.
	MaxKeptBytes int64

	// Admin is the operator's side that AdminHandler serves: Prometheus
	// metrics, pprof, health and the admin console (docs/OPERATING.md).
	Admin AdminConfig
}

// AdminConfig configures AdminHandler. Serve AdminHandler on a listener of
// its own (lapd serve --admin-addr does), never in Handler's mux: it is for
// the people who run lapd, not for the app's users.
type AdminConfig struct {
	// Enabled turns on what AdminHandler serves: the hot-path metrics (a
	// counter and a latency histogram per route, RPC tool and MCP tool;
	// their cost is measured in docs/PERFORMANCE.md), the counters read
	// from the audit stream, and, when no audit sink can be read back, an
	// in-memory ring of the latest audit entries for the console. Without
	// it AdminHandler answers 404 outside /healthz and /readyz.
	Enabled bool
	// Token, when set, is required on every AdminHandler request but the
	// health checks (Authorization: Bearer; at least 16 characters,
	// compared in constant time). Empty: only loopback clients, with a
	// loopback Host header, are served.
	Token string
	// Registerer, if set, also gets lapd's own collectors (not the Go
	// runtime's), to serve them from a /metrics of your own as well.
	Registerer prometheus.Registerer
}

// DefaultMaxKeptBytes is the default of Config.MaxKeptBytes.
const DefaultMaxKeptBytes = 512 << 20

// MCPSessionLimits bounds the MCP endpoint's stateful sessions (the
// 2025-era clients that keep an Mcp-Session-Id; modern clients hold none).
// Past a bound a new session is refused with 503 session-capacity and a
// Retry-After, or, per token and per IP, the least recently used one is
// dropped. Zero fields keep the defaults in brackets.
type MCPSessionLimits struct {
	Max             int           // sessions in all [64]
	Unauthenticated int           // sessions with no connect_session yet [16]
	PerToken        int           // sessions bound to one agent token [8]
	PerIP           int           // sessions of one client IP, IPv6 per /64; loopback exempt [16]
	IdleTTL         time.Duration // a session unused this long is dropped [30m]
}
