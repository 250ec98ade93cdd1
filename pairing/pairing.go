// Package pairing is the tab side of lapd: the /agent/ws WebSocket endpoint,
// the registry of paired tabs keyed by tid, and RPC correlation over it.
//
// # Serving tabs
//
// A Registry is an http.Handler; mount it at /agent/ws:
//
//	reg, err := pairing.New(pairing.Config{Tokens: tm, Audit: al})
//	mux.Handle("/agent/ws", reg)
//	defer reg.Shutdown(ctx)
//
// The token (from ?token=, Authorization: Bearer, or a Sec-WebSocket-Protocol
// entry "lapd.token.<token>"), the tab secret of a session minted with one
// (entry "lapd.tab.<secret>") and the Origin are checked before the upgrade:
// a refusal is an HTTP 401/403 with the JSON error envelope, never
// 101-then-close. A tab that gets through is registered under its tid; a newer
// socket for the same tid supersedes the old one (closed with 4002, audited
// "supersede") and inherits its in-flight calls and watches.
//
// # Which socket speaks for the human
//
// The agent token is in the LLM side's hands. A session minted with a tab
// secret (lapd.js asks for one) opens only with it, so the LLM side cannot
// open the tab's socket at all. A session minted without one (a reference
// client) opens with the token alone, as in the reference; then a socket that
// supersedes a live one cannot approve: its confirm-resolved frames are
// refused (audited), since it may be the LLM side taking over the tab. The server sends nothing until the
// tab's hello, answers hello-ack{lapVersion, minClientVersion, heartbeatMs},
// then calls Hooks.OnPaired.
//
// # Talking to a tab
//
//	res, err := reg.Call(ctx, tid, "get_state", map[string]any{"path": "/count"}, 0)
//	state, err := reg.Watch(ctx, tid, "/todos") // waits for the next change
//	err = reg.Push(tid, map[string]any{"t": "active"})
//
// Every Call is answered exactly once: the tab's rpc-reply (result bytes are
// passed through undecoded), its rpc-error (*RPCError), ErrTimeout, ErrPaused
// when the tab goes away with no successor, or ctx.Err(). An error after the
// frame was queued also matches ErrOutcomeUnknown: the tab may have acted.
//
// # Costs and limits
//
// A paired tab is a goroutine only while it is busy. Its reader is a
// goroutine of its own (the HTTP handler returns after the upgrade); when
// nothing arrived for a second (a tick of the registry loop), the reader
// parks the socket in an epoll set shared by all idle tabs (Linux; see
// parker) and exits, and the tab's next frame starts a new one. The writer
// goroutine runs only while frames are queued. A lapd.js tab sends its own
// {t:'ping'} heartbeats and gets no WebSocket pings (it is closed with 4408
// after two intervals and a half of silence); a tab that sends none is
// pinged every PingInterval (two missed pongs → 4408). The socket keeps
// 512 + 256 bytes of buffers (larger frames pass them by), and tabs that
// sent the same hello share one copy of it. A parked idle tab costs about
// 4.5 KiB of heap and no stack, against 8.5 KiB while a goroutine waits on
// it (and 22.8 KiB before these changes); docs/PERFORMANCE.md has the
// figures and why parking readers beat replacing coder/websocket with an
// epoll-driven library.
//
// One registry-wide loop pings, parks and sweeps closed tabs' buffers (kept
// for Retention, at most MaxClosed). Each tab's send queue is bounded (full
// → closed with 4008, the caller never blocks); inbound frames are capped at
// MaxFrame (over → 1009), rate-limited per socket (FrameRate, ByteRate:
// the reader waits; answers to the server's own calls and watches are not
// counted) and scanned once, never decoded (the result bytes of a
// reply are passed through); in-flight calls and watches per tab are capped
// at MaxInFlight (ErrBusy). What lapd keeps per tab (log ring, hello) is
// counted in bytes, per tid and in all (BufferBytes, see budget.go; a hello
// shared by several tabs counts for each). Stats exposes counters for
// everything refused, delayed or dropped, and how many tabs are parked.
//
// # Connecting, tied to the socket
//
// The token is checked before the upgrade and nothing changes then
// (tokens.Manager.CheckAcceptTab): an upgrade that fails leaves the session
// as it was. Once the socket is up its record moves (Connected), ordered per
// session with the disconnect of an older socket: a socket that closes while
// a newer one is being upgraded does not mark the session pending-resume
// under the new, live socket; the move waits for the upgrade's outcome.
package pairing

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

// Protocol versions.
const (
	LapVersion       = 2
	MinClientVersion = 2
)

// Errors from Call, Push and Watch (and *RateLimitError, cluster.go).
var (
	ErrPaused  = errors.New("pairing: tab not connected") // → 503 paused
	ErrTimeout = errors.New("pairing: rpc timed out")     // → 504 timeout
	ErrClosed  = errors.New("pairing: registry closed")   // shutting down
	// ErrBusy: the tab already has MaxInFlight calls or watches waiting.
	ErrBusy = errors.New("pairing: too many calls in flight for this tab")
	// ErrOutcomeUnknown is also matched (errors.Is) by a Call error that
	// came after the rpc frame was queued for the tab, other than the tab's
	// own rpc-error: the tab may have acted on the call (ErrPaused when it
	// went away, ErrTimeout, ErrClosed, ctx.Err()). Without it the frame
	// never left lapd and the tab cannot have acted.
	ErrOutcomeUnknown = errors.New("pairing: the tab may have acted on the call")
)

// inDoubt is a Call error after the frame was queued.
type inDoubt struct{ err error }

func (e inDoubt) Error() string   { return e.err.Error() + " (the tab may have acted on it)" }
func (e inDoubt) Unwrap() []error { return []error{e.err, ErrOutcomeUnknown} }

// Defaults for the zero values of Config, and fixed limits.
const (
	DefaultPingInterval = 15 * time.Second
	// MinPingInterval is the shortest PingInterval; a shorter one is
	// raised to it (1ns made the registry's ticker panic at the first tab).
	MinPingInterval = 100 * time.Millisecond
	// HiddenBeat is the heartbeat interval lapd expects at least from a tab
	// that says its page is hidden: browsers run a hidden page's repeating
	// timers about once a minute (Chrome once the page has been hidden
	// for 5 minutes, Safari every 40 s), so lapd.js's heartbeats come
	// that seldom. Without it a hidden, idle tab — the user reading the
	// model's answer in another tab — was closed (4408) and reconnected
	// every minute or two.
	HiddenBeat          = time.Minute
	DefaultRPCTimeout   = 15 * time.Second
	DefaultSendQueue    = 256
	DefaultWriteTimeout = 10 * time.Second
	DefaultMaxFrame     = 4 << 20
	DefaultRetention    = 60 * time.Second
	DefaultMaxClosed    = 128
	DefaultLogRing      = 100

	// MaxInFlight bounds the calls plus watches waiting on one tid.
	MaxInFlight = 1024
	// maxExpect bounds the log entry ids a tab is expected to send back;
	// the oldest is forgotten first (its log-append then counts as not an
	// echo).
	maxExpect = 64
	// MaxLogEntry is the largest log-append entry kept in the ring (bytes);
	// larger entries still reach Hooks.OnLogAppend.
	MaxLogEntry = 256 << 10
)

// Close codes the server sends (see docs/PROTOCOL.md).
const (
	CloseSuperseded    = 4002 // a newer socket for the same tid won; do not reconnect from this one
	CloseRevoked       = 4001 // unregistered (revoke); do not reconnect
	CloseQueueOverflow = 4008 // the tab did not read fast enough; reconnect
	CloseHeartbeat     = 4408 // two pings unanswered; reconnect
	CloseVersionSkew   = 4426 // hello.lapVersion < MinClientVersion; do not reconnect
	CloseRestart       = 1012 // server shutting down; reconnect
)

// RPCError is a tab's rpc-error reply.
type RPCError struct {
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

func (e *RPCError) Error() string { return "pairing: tab error " + e.Code + ": " + e.Detail }

// Hello is the cached hello frame of a tab (reference fields plus lapd's
// additive Policy and Visible).
type Hello struct {
	AppName           string          `json:"appName"`
	AppVersion        string          `json:"appVersion"`
	MsgSchema         json.RawMessage `json:"msgSchema,omitempty"`
	StateSchema       json.RawMessage `json:"stateSchema,omitempty"`
	AffordancesSample json.RawMessage `json:"affordancesSample,omitempty"`
	Docs              json.RawMessage `json:"docs,omitempty"`
	SchemaHash        string          `json:"schemaHash"`
	LapVersion        int             `json:"lapVersion,omitempty"`
	Policy            json.RawMessage `json:"policy,omitempty"` // lapd: per-variant JSON Schema + annotations (see schema package)
}

// Stats are the registry's counters since New.
type Stats struct {
	Malformed           int64 // inbound frames that did not decode or lacked required fields
	Unknown             int64 // inbound frames with an unknown t
	UnknownReplies      int64 // rpc-reply/rpc-error/state-update for an id nobody waits for
	RefusedUpgrades     int64 // /agent/ws requests answered with an error instead of 101
	Superseded          int64 // sockets closed because a newer one for the same tid arrived
	HeartbeatCloses     int64 // sockets closed with 4408
	QueueOverflowCloses int64 // sockets closed with 4008
	WriteTimeouts       int64 // sockets closed because a frame took longer than WriteTimeout to write
	RefusedApprovals    int64 // confirm-resolved frames refused (a socket that superseded a live tab without the tab secret)
	ActiveTabs          int   // tids with a live socket now
	HeldTabs            int   // tids held: live, or closed and kept for Retention
	ParkedTabs          int   // of those, idle ones held without a reader goroutine (Linux)

	BufferBytes    int64 // bytes of log rings and hellos kept now (gauge)
	LogShed        int64 // log entries dropped early for BufferBytes
	ClosedShed     int64 // closed tabs whose buffers were dropped early for BufferBytes
	Throttled      int64 // inbound frames delayed by the per-socket rate
	OverloadCloses int64 // sockets closed with 1013: their hello did not fit BufferBytes, or was shed for a smaller one
	HellosShed     int64 // of those, live tabs closed because they held the largest hello when a smaller one needed room
	HellosTooBig   int64 // sockets closed with 1009: their hello was over MaxHello

	FramesIn, FramesOut int64 // WebSocket messages read from and written to tabs
	BytesIn, BytesOut   int64 // their payload bytes

	MemoryReleases int64 // garbage of a burst of pairings returned to the OS once it was over (release.go)

	Cluster ClusterStats // forwarding to and from other nodes (Config.Cluster)
}

// ConfirmResolved is a tab's confirm-resolved frame.
type ConfirmResolved struct {
	ConfirmID  string          `json:"confirmId"`
	Outcome    string          `json:"outcome"` // confirmed | user-cancelled
	StateAfter json.RawMessage `json:"stateAfter,omitempty"`
}

// Health is what lapd knows about a tab's connection (for observe).
type Health struct {
	Connected     bool  `json:"connected"`
	Visible       *bool `json:"visible,omitempty"`         // nil = the tab never said
	LastHeartbeat int64 `json:"lastHeartbeatAt,omitempty"` // ms
	ConnectedAt   int64 `json:"connectedAt,omitempty"`
	Reconnects    int   `json:"reconnects"`
}

// AppendJSON appends h as json.Marshal writes it (its field order and
// omitempty; TestHealthAsEncodingJSON compares them), without reflection:
// /observe writes it on every call, and the tab's node with every answer to
// a forwarded call that carried its admit.
func (h Health) AppendJSON(b []byte) []byte {
	b = append(b, `{"connected":`...)
	b = strconv.AppendBool(b, h.Connected)
	if h.Visible != nil {
		b = append(b, `,"visible":`...)
		b = strconv.AppendBool(b, *h.Visible)
	}
	if h.LastHeartbeat != 0 {
		b = append(b, `,"lastHeartbeatAt":`...)
		b = strconv.AppendInt(b, h.LastHeartbeat, 10)
	}
	if h.ConnectedAt != 0 {
		b = append(b, `,"connectedAt":`...)
		b = strconv.AppendInt(b, h.ConnectedAt, 10)
	}
	b = append(b, `,"reconnects":`...)
	b = strconv.AppendInt(b, int64(h.Reconnects), 10)
	return append(b, '}')
}

// Hooks let the composition root react to tab events. Each may be nil. They
// are called from the tab's reader goroutine and must not block for long.
type Hooks struct {
	OnPaired          func(tid string, repair bool) // after the socket is registered and hello-ack queued; the tab gets hello-ack once it returns
	OnClosed          func(tid string)              // the tab's socket is gone (not when superseded)
	OnConfirmResolved func(tid string, r ConfirmResolved)
	// OnLogAppend runs after a log-append entry is put in the ring. echo
	// reports that the entry's id is one the server expected back: the id
	// of an rpc sent to this tab (lapd.js logs every rpc it answers) or one
	// announced with ExpectLog (a log-push) — a call the server has
	// already accounted for.
	OnLogAppend func(tid string, entry json.RawMessage, echo bool)
	// OnAdmit decides whether a call for tid may go ahead now (the
	// per-tid rate limit), on the node that holds the tab: Admit calls it
	// here, or on the owner in a cluster. nil = always.
	OnAdmit func(tid string) (ok bool, retryAfterMs int64)
	// OnVersionSkew runs when tid's tab is refused for its hello.lapVersion
	// (< MinClientVersion, closed CloseVersionSkew), before its calls fail
	// and OnClosed runs: a retry never helps, the app's client is too old.
	OnVersionSkew func(tid string)
}

// Config configures a Registry. Zero values mean the documented defaults.
type Config struct {
	Tokens         *tokens.Manager // required
	Audit          *audit.Log      // nil = no audit
	Logger         *slog.Logger    // nil = discard
	AllowedOrigins []string        // exact Origin values allowed besides same-origin
	TrustProxy     int             // > 0: same-origin is judged from X-Forwarded-Proto/-Host (set by trusted proxies only)
	PublicURL      string          // the public origin (https://app.example.com), always allowed
	PingInterval   time.Duration   // default 15s, at least MinPingInterval; a tab that misses two pongs is closed
	RPCTimeout     time.Duration   // default 15s (Call with timeout 0)
	SendQueue      int             // frames queued per tab; default 256; full → tab closed
	WriteTimeout   time.Duration   // default 10s; checked every registry tick (at most 1s)
	MaxFrame       int64           // default 4 MiB
	Retention      time.Duration   // buffers kept after close; default 60s
	MaxClosed      int             // closed tabs whose buffers are kept; default 128
	LogRing        int             // recent-log entries per tid; default 100
	LogRingBytes   int             // bytes of recent-log entries per tid; default 1 MiB
	BufferBytes    int             // rings and hellos of every tid, live or closed; default 128 MiB
	MaxHello       int             // bytes of one tab's hello (as counted in BufferBytes); default 1 MiB; over → 1009
	FrameRate      float64         // inbound frames per second per socket, answers to calls not counted; default 200
	FrameBurst     int             // default 1000
	ByteRate       float64         // inbound bytes per second per socket, answers to calls not counted; default 8 MiB/s
	Hooks          Hooks

	// Cluster joins this Registry to the other lapd nodes on the same NATS
	// (cluster.go): a call for a tab whose socket is on another node is
	// forwarded there. nil = a single node. The Registry does not close it.
	Cluster       *nats.Conn
	ClusterPrefix string // subject prefix; default "lapd"
	NodeID        string // this node's name on the subjects; default random
	// PeerListen, with Cluster, is the TCP address this node's peer link
	// listens on (peer.go): other nodes send their requests for tabs held
	// here on it directly instead of through the NATS server. "" = no
	// link (every request by NATS). PeerAdvertise is the address other
	// nodes dial; default the listener's own (required when PeerListen
	// names every interface).
	PeerListen    string
	PeerAdvertise string
	// PeerTLS is whether the link's listener speaks TLS (peer.go): "on",
	// "off", or "" / "auto" = on unless the address other nodes dial is a
	// loopback one (nodes on one machine).
	PeerTLS string
}

// Registry holds the paired tabs. Safe for concurrent use.
type Registry struct {
	cfg    Config
	hooks  atomic.Pointer[Hooks]
	hellos helloTable
	park   parker
	rel    releaser

	// testHookConnect, set by a test before serving, runs in connect
	// after a successful upgrade, before the token record moves.
	testHookConnect func(tid string)

	mu       sync.Mutex
	sessions map[string]*session // live and recently closed tids
	closed   *list.List          // of *session, oldest close first
	shutting bool
	loopOn   bool          // the heartbeat/sweep loop is running
	stop     chan struct{} // closed by Shutdown

	wg sync.WaitGroup // every goroutine the registry runs or serves in

	cl *cluster // nil on a single node

	malformed, unknown, unknownReplies, refused atomic.Int64
	superseded, hbCloses, overflowCloses        atomic.Int64
	refusedApprovals, writeTimeouts             atomic.Int64

	bufBytes                                 atomic.Int64 // rings and hellos kept
	logDropped, closedShed, throttled        atomic.Int64
	overloadCloses, hellosShed, hellosTooBig atomic.Int64
	lastShedLog                              time.Time // guarded by mu
	framesIn, framesOut, bytesIn, bytesOut   atomic.Int64
}

// session is everything lapd keeps per tid: the live socket (if any), the
// pending calls and watches (which outlive a superseded socket), the cached
// hello and the recent-log ring.
type session struct {
	tid string

	// stateMu orders the token record's connect/disconnect changes for
	// this tid with the registry's view of its sockets (see reserve).
	stateMu       sync.Mutex
	pending       int  // upgrades in progress (reserved, not yet registered)
	disconnectDue bool // a socket closed while an upgrade was pending

	mu          sync.Mutex
	cur         *conn // nil when no socket
	calls       map[string]chan callResult
	watches     map[string]chan callResult
	hello       *Hello
	visible     *bool
	connectedAt int64
	lastHB      int64
	accepts     int
	helloGen    uint64            // bumped by every hello (cluster caches key on it)
	rpcs        atomic.Int64      // Calls made to this tid (for the admin console)
	ring        []json.RawMessage // oldest first, len ≤ LogRing
	ringBytes   int               // bytes of ring
	expect      []string          // log entry ids expected back (rpc ids, ExpectLog), oldest first, ≤ maxExpect
	dropped     bool              // unregistered: buffers gone, nothing more is kept

	closedAt   time.Time     // guarded by Registry.mu
	closedElem *list.Element // guarded by Registry.mu; non-nil while in Registry.closed
}

type callResult struct {
	data json.RawMessage
	err  error
	buf  *bytes.Buffer // non-nil: data aliases this pooled read buffer (see Reply)
}

// New returns a Registry.
func New(cfg Config) (*Registry, error) {
	if cfg.Tokens == nil {
		return nil, errors.New("pairing: Config.Tokens is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PingInterval, DefaultPingInterval)
	cfg.PingInterval = max(cfg.PingInterval, MinPingInterval)
	def(&cfg.RPCTimeout, DefaultRPCTimeout)
	def(&cfg.WriteTimeout, DefaultWriteTimeout)
	def(&cfg.Retention, DefaultRetention)
	if cfg.SendQueue <= 0 {
		cfg.SendQueue = DefaultSendQueue
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.MaxClosed <= 0 {
		cfg.MaxClosed = DefaultMaxClosed
	}
	if cfg.LogRing <= 0 {
		cfg.LogRing = DefaultLogRing
	}
	if cfg.LogRingBytes <= 0 {
		cfg.LogRingBytes = DefaultLogRingBytes
	}
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = DefaultBufferBytes
	}
	if cfg.MaxHello <= 0 {
		cfg.MaxHello = DefaultMaxHello
	}
	if cfg.FrameRate <= 0 {
		cfg.FrameRate = DefaultFrameRate
	}
	if cfg.FrameBurst <= 0 {
		cfg.FrameBurst = DefaultFrameBurst
	}
	if cfg.ByteRate <= 0 {
		cfg.ByteRate = DefaultByteRate
	}
	r := &Registry{cfg: cfg, sessions: map[string]*session{}, closed: list.New(), stop: make(chan struct{})}
	r.park.init(r)
	r.rel.init()
	r.rel.wg = &r.wg
	h := cfg.Hooks
	r.hooks.Store(&h)
	if cfg.Cluster != nil {
		cl, err := newCluster(r, cfg.Cluster, cfg.ClusterPrefix, cfg.NodeID, cfg.PeerListen, cfg.PeerAdvertise, cfg.PeerTLS)
		if err != nil {
			return nil, err
		}
		r.cl = cl
	}
	return r, nil
}

// holds reports whether tid's socket is on this node.
func (r *Registry) holds(tid string) bool {
	r.mu.Lock()
	s := r.sessions[tid]
	shutting := r.shutting
	r.mu.Unlock()
	return s != nil && !shutting && !s.isClosed()
}

// remote reports whether a call for tid goes to another node.
func (r *Registry) remote(tid string) bool {
	if r.cl == nil {
		return false
	}
	r.mu.Lock()
	shutting := r.shutting
	r.mu.Unlock()
	return !shutting && !r.holds(tid)
}

func (r *Registry) helloGen(tid string) uint64 {
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.helloGen
}

// remoteGone: this node forgets what it kept about a tab held elsewhere.
func (r *Registry) remoteGone(tid string) {
	if r.holds(tid) {
		return
	}
	if h := r.hooks.Load(); h.OnClosed != nil {
		h.OnClosed(tid)
	}
}

// Admit is the gate of a call for tid: paired reports whether a socket
// holds tid (here, or on another node in a cluster); retryAfterMs > 0 when
// Hooks.OnAdmit refused the call (the per-tid rate limit, decided where the
// tab lives). err only for a cluster failure other than "nobody holds it".
func (r *Registry) Admit(ctx context.Context, tid string) (paired bool, retryAfterMs int64, err error) {
	if r.remote(tid) {
		return r.cl.admit(ctx, tid)
	}
	if !r.IsPaired(tid) {
		return false, 0, nil
	}
	if h := r.hooks.Load(); h.OnAdmit != nil {
		if ok, ms := h.OnAdmit(tid); !ok {
			return true, max(ms, 1), nil
		}
	}
	return true, 0, nil
}

// SetHooks installs the hooks (the lap server does this in lap.New). Call it
// before serving.
func (r *Registry) SetHooks(h Hooks) { r.hooks.Store(&h) }

// Stats returns the registry's counters.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	active, held := 0, len(r.sessions)
	for _, s := range r.sessions {
		if s.closedElem == nil && !s.isClosed() {
			active++
		}
	}
	r.mu.Unlock()
	return Stats{
		Malformed:           r.malformed.Load(),
		Unknown:             r.unknown.Load(),
		UnknownReplies:      r.unknownReplies.Load(),
		RefusedUpgrades:     r.refused.Load(),
		Superseded:          r.superseded.Load(),
		HeartbeatCloses:     r.hbCloses.Load(),
		QueueOverflowCloses: r.overflowCloses.Load(),
		WriteTimeouts:       r.writeTimeouts.Load(),
		RefusedApprovals:    r.refusedApprovals.Load(),
		ActiveTabs:          active,
		HeldTabs:            held,
		ParkedTabs:          r.park.count(),
		BufferBytes:         r.bufBytes.Load(),
		LogShed:             r.logDropped.Load(),
		ClosedShed:          r.closedShed.Load(),
		Throttled:           r.throttled.Load(),
		OverloadCloses:      r.overloadCloses.Load(),
		HellosShed:          r.hellosShed.Load(),
		HellosTooBig:        r.hellosTooBig.Load(),
		FramesIn:            r.framesIn.Load(),
		FramesOut:           r.framesOut.Load(),
		BytesIn:             r.bytesIn.Load(),
		BytesOut:            r.bytesOut.Load(),
		MemoryReleases:      r.rel.releases.Load(),
		Cluster:             r.clusterStats(),
	}
}

func (r *Registry) clusterStats() ClusterStats {
	if r.cl == nil {
		return ClusterStats{}
	}
	return r.cl.stats()
}

// socket returns the live socket, or nil.
// heldHere reports whether s has a socket and is still registered.
func (s *session) heldHere() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur != nil && !s.dropped
}

// hidden reports whether the tab said its page is hidden (hello's or the
// last visibility frame's visible:false).
func (s *session) hidden() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.visible != nil && !*s.visible
}

func (s *session) socket() *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur == nil
}

// live returns tid's session and its current socket, or an error.
func (r *Registry) live(tid string) (*session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shutting {
		return nil, ErrClosed
	}
	s := r.sessions[tid]
	if s == nil {
		return nil, ErrPaused
	}
	return s, nil
}

// newID returns a random RFC 4122 version 4 UUID.
//
// The ids only need to be unique (a call is matched within its own tab's
// session), so they come from the runtime's ChaCha8 generator rather than
// the system's entropy source (a system call per call on older kernels).
func newID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], mrand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], mrand.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// await registers a waiter under id in m (calls or watches) and returns its
// channel and the socket to send on. expect: the tab will log id.
func (s *session) await(m *map[string]chan callResult, id string, expect bool) (chan callResult, *conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil, nil, ErrPaused
	}
	if len(s.calls)+len(s.watches) >= MaxInFlight {
		return nil, nil, ErrBusy
	}
	if *m == nil {
		*m = map[string]chan callResult{}
	}
	ch := make(chan callResult, 1)
	(*m)[id] = ch
	if expect {
		s.expectLocked(id)
	}
	return ch, s.cur, nil
}

// expectLocked notes that the tab will send a log entry with id.
func (s *session) expectLocked(id string) {
	if len(s.expect) >= maxExpect {
		s.expect = append(s.expect[:0], s.expect[1:]...)
	}
	s.expect = append(s.expect, id)
}

// takeExpectedLocked reports whether id was expected, and forgets it.
func (s *session) takeExpectedLocked(id string) bool {
	if id == "" {
		return false
	}
	for i, e := range s.expect {
		if e == id {
			s.expect = append(s.expect[:i], s.expect[i+1:]...)
			if len(s.expect) == 0 {
				s.expect = nil
			}
			return true
		}
	}
	return false
}

// ExpectLog tells the registry that tid's tab will send a log-append whose
// entry id is id (the server is pushing it a log-push with that entry), so
// that Hooks.OnLogAppend sees it as an echo.
func (r *Registry) ExpectLog(tid, id string) {
	if r.remote(tid) {
		// The echo arrives on the tab's node: that is where it is expected.
		b, _ := json.Marshal(callReq{Expect: id})
		_, _ = r.cl.simple(tid, "expect", b)
		return
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	s.expectLocked(id)
	s.mu.Unlock()
}

// retire removes id from m and delivers res; it reports false when somebody
// else retired id first (then they deliver).
func (s *session) retire(m *map[string]chan callResult, id string, res callResult) bool {
	s.mu.Lock()
	ch, ok := (*m)[id]
	if ok {
		delete(*m, id)
	}
	s.mu.Unlock()
	if ok {
		ch <- res
	}
	return ok
}

// failAll retires every call and watch with err. Caller holds s.mu.
func (s *session) failAllLocked(err error) {
	s.takeAllLocked().fail(err)
}

// pending is a set of retired waiters still to be told their outcome.
type pending []chan callResult

// takeAllLocked retires every call and watch (nobody else can answer them
// any more) and returns their channels. Caller holds s.mu.
func (s *session) takeAllLocked() pending {
	var out pending
	for id, ch := range s.calls {
		out = append(out, ch)
		delete(s.calls, id)
	}
	for id, ch := range s.watches {
		out = append(out, ch)
		delete(s.watches, id)
	}
	return out
}

// fail tells every waiter err. Each channel has room for one result.
func (p pending) fail(err error) {
	for _, ch := range p {
		ch <- callResult{err: err}
	}
}

// wait waits for ch, a timer (nil = none) or ctx, retiring id on the latter two.
func (s *session) wait(m *map[string]chan callResult, id string, ch chan callResult, timer <-chan time.Time, ctx context.Context) callResult {
	var res callResult
	select {
	case res = <-ch:
	case <-timer:
		if s.retire(m, id, callResult{err: ErrTimeout}) {
			return callResult{err: ErrTimeout}
		}
		res = <-ch
	case <-ctx.Done():
		err := ctx.Err()
		if errors.Is(err, context.DeadlineExceeded) && m == &s.watches {
			err = ErrTimeout
		}
		if s.retire(m, id, callResult{err: err}) {
			return callResult{err: err}
		}
		res = <-ch
	}
	return res
}

// Reply is the result of a tab's rpc-reply. A large one aliases the read
// buffer it arrived in (no copy of a 10 KiB observe result per call):
// Release gives the buffer back once Data is no longer used, after which
// Data must not be touched. Release may be called once; a zero Reply's is a
// no-op.
type Reply struct {
	Data json.RawMessage
	buf  *bytes.Buffer
}

// Release returns the reply's buffer for reuse.
func (r Reply) Release() {
	if r.buf != nil {
		putReadBuf(r.buf)
	}
}

// CallReply is Call returning the result without copying it out of the
// read buffer: the caller must Release it.
func (r *Registry) CallReply(ctx context.Context, tid, tool string, args any, timeout time.Duration) (Reply, error) {
	res := r.call(ctx, tid, tool, args, timeout)
	if res.err != nil {
		return Reply{}, res.err
	}
	return Reply{Data: res.data, buf: res.buf}, nil
}

// Call sends {t:'rpc', id, tool, args} to tid's tab and waits for the answer.
// The frame also carries rid, the request id of ctx (audit.WithRequestID),
// when there is one: an optional field a tab may ignore.
// timeout 0 = Config.RPCTimeout. Errors: ErrPaused, ErrTimeout, *RPCError,
// ctx.Err() (and ErrClosed while shutting down, ErrBusy over MaxInFlight).
// args may be json.RawMessage (sent as is) or any JSON-marshalable value.
func (r *Registry) Call(ctx context.Context, tid, tool string, args any, timeout time.Duration) (json.RawMessage, error) {
	res := r.call(ctx, tid, tool, args, timeout)
	if res.buf != nil { // the caller owns what Call returns: copy it out
		data := append(json.RawMessage(nil), res.data...)
		putReadBuf(res.buf)
		return data, res.err
	}
	return res.data, res.err
}

func (r *Registry) call(ctx context.Context, tid, tool string, args any, timeout time.Duration) callResult {
	if timeout <= 0 {
		timeout = r.cfg.RPCTimeout
	}
	if r.remote(tid) {
		return r.cl.call(ctx, tid, tool, args, timeout)
	}
	s, err := r.live(tid)
	if err != nil {
		return callResult{err: err}
	}
	if err := r.admitHere(ctx, tid); err != nil {
		return callResult{err: err}
	}
	s.rpcs.Add(1)
	id := newID()
	frame, err := rpcFrame(id, tool, args, audit.RequestID(ctx))
	if err != nil {
		return callResult{err: err}
	}
	ch, c, err := s.await(&s.calls, id, true)
	if err != nil {
		return callResult{err: err}
	}
	sent := true
	if err := c.send(frame, sendInline); err != nil { // written here when no writer runs
		// The socket went away between await and enqueue: its close (or a
		// successor) retires the call; if nobody has yet, we do.
		if s.retire(&s.calls, id, callResult{err: ErrPaused}) {
			return callResult{err: ErrPaused}
		}
		sent = false
	}
	t := getTimer(timeout)
	res := s.wait(&s.calls, id, ch, t.C, ctx)
	putTimer(t)
	var re *RPCError
	if res.err != nil && sent && !errors.As(res.err, &re) {
		res.err = inDoubt{res.err} // the tab may have run it: see inDoubt
	}
	return res
}

// timerPool holds stopped call timers: one per call was a tenth of the
// registry's garbage under load. (Since Go 1.23 a stopped or reset timer
// never delivers a stale time.)
var timerPool sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	t.Stop()
	timerPool.Put(t)
}

// Push queues a server→tab frame (any JSON-marshalable value with a "t"
// field; json.RawMessage and []byte are sent as is). ErrPaused if tid has no
// socket. It never blocks: a full queue closes the tab (4008).
func (r *Registry) Push(tid string, frame any) error {
	b, err := marshalFrame(frame)
	if err != nil {
		return err
	}
	if r.remote(tid) {
		_, err := r.cl.simple(tid, "push", b)
		return err
	}
	s, err := r.live(tid)
	if err != nil {
		return err
	}
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	if c == nil {
		return ErrPaused
	}
	return c.enqueue(b)
}

// PushLog pushes frame, a log-push whose entry id is id, and expects the
// tab's echo of it (ExpectLog then Push). On another node it is one request
// (op "logpush") that carries ctx's deferred admit (DeferAdmit): refused,
// it fails with *RateLimitError having pushed nothing.
func (r *Registry) PushLog(ctx context.Context, tid, id string, frame any) error {
	b, err := marshalFrame(frame)
	if err != nil {
		return err
	}
	if r.remote(tid) {
		return r.cl.pushLog(ctx, tid, id, b)
	}
	if _, err := r.live(tid); err != nil {
		return err
	}
	if err := r.admitHere(ctx, tid); err != nil {
		return err
	}
	r.ExpectLog(tid, id)
	return r.Push(tid, json.RawMessage(b))
}

// IsPaired reports whether tid has a live socket.
func (r *Registry) IsPaired(tid string) bool {
	s, err := r.live(tid)
	return err == nil && !s.isClosed()
}

// Hello returns tid's cached hello (kept for Retention after the socket
// closes). Tabs that sent identical hellos share one copy: the RawMessage
// fields must not be changed.
func (r *Registry) Hello(tid string) (Hello, bool) {
	if r.remote(tid) {
		if h, ok, err := r.cl.hello(tid); err == nil && ok {
			return h, true
		}
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s == nil {
		return Hello{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hello == nil {
		return Hello{}, false
	}
	return *s.hello, true
}

// Health reports tid's connection health.
func (r *Registry) Health(tid string) Health {
	if r.remote(tid) {
		if h, ok := r.cl.health(tid); ok {
			return h
		}
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s == nil {
		return Health{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := Health{Connected: s.cur != nil, LastHeartbeat: s.lastHB, ConnectedAt: s.connectedAt}
	if s.visible != nil {
		v := *s.visible
		h.Visible = &v
	}
	if s.accepts > 1 {
		h.Reconnects = s.accepts - 1
	}
	return h
}

// Watch pushes watch{id,path}, waits for the matching state-update and pushes
// unwatch{id}. It returns the update's stateAfter; ErrTimeout when ctx's
// deadline passes first; ErrPaused if the socket goes away.
func (r *Registry) Watch(ctx context.Context, tid, path string) (json.RawMessage, error) {
	if r.remote(tid) {
		return r.cl.watch(ctx, tid, path)
	}
	s, err := r.live(tid)
	if err != nil {
		return nil, err
	}
	if err := r.admitHere(ctx, tid); err != nil {
		return nil, err
	}
	id := newID()
	ch, c, err := s.await(&s.watches, id, false)
	if err != nil {
		return nil, err
	}
	w := struct {
		T    string `json:"t"`
		ID   string `json:"id"`
		Path string `json:"path,omitempty"`
	}{"watch", id, path}
	b, _ := json.Marshal(w)
	if err := c.enqueue(b); err != nil {
		if s.retire(&s.watches, id, callResult{err: ErrPaused}) {
			return nil, ErrPaused
		}
	}
	wr := s.wait(&s.watches, id, ch, nil, ctx)
	res, err := wr.data, wr.err
	s.mu.Lock()
	c = s.cur
	s.mu.Unlock()
	if c != nil {
		_ = c.enqueue([]byte(`{"t":"unwatch","id":"` + id + `"}`))
	}
	return res, err
}

// RecentLog returns up to n of tid's log-append entries, newest first,
// optionally only those of kind. n ≤ 0 means all that are kept.
func (r *Registry) RecentLog(tid string, n int, kind string) []json.RawMessage {
	if r.remote(tid) {
		b, _ := json.Marshal(callReq{N: n, Kind: kind})
		if res, err := r.cl.simple(tid, "log", b); err == nil {
			var out []json.RawMessage
			if json.Unmarshal(res, &out) == nil && out != nil {
				return out
			}
		}
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	out := []json.RawMessage{}
	if s == nil {
		return out
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= 0 || n > len(s.ring) {
		n = len(s.ring)
	}
	for i := len(s.ring) - 1; i >= 0 && len(out) < n; i-- {
		e := s.ring[i]
		if kind != "" && entryKind(e) != kind {
			continue
		}
		out = append(out, e)
	}
	return out
}

// AppendLog puts an entry the server made itself (for example a dispatch
// lapd refused before it reached the tab) in tid's recent-actions ring, as a
// log-append from the tab would be, but without calling Hooks.OnLogAppend
// (the caller audits what it did). Entries over MaxLogEntry are not kept;
// the entry counts in the ring's byte budgets like any other.
// ErrPaused if the registry holds nothing for tid.
func (r *Registry) AppendLog(tid string, entry json.RawMessage) error {
	if r.remote(tid) {
		if _, err := r.cl.simple(tid, "append", entry); !errors.Is(err, ErrPaused) {
			return err
		}
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s == nil {
		return ErrPaused
	}
	if len(entry) > MaxLogEntry {
		return nil
	}
	s.mu.Lock()
	if s.dropped {
		s.mu.Unlock()
		return ErrPaused
	}
	delta, _ := s.appendLogLocked(entry, r.cfg.LogRing, r.cfg.LogRingBytes)
	r.bufBytes.Add(int64(delta))
	s.mu.Unlock()
	if r.overBudget() {
		r.shed()
	}
	return nil
}

// Unregister pushes {t:'revoked'}, closes tid's socket (4001), fails its
// calls and drops its buffers (revoke, version skew).
func (r *Registry) Unregister(tid string) {
	r.drop(tid, CloseRevoked, "revoked", "unregistered")
	if r.cl != nil {
		_, _ = r.cl.simple(tid, "unregister", nil)
		r.cl.forgetRemote(tid)
	}
}

// DropRevoked drops tid's socket if this node holds it, as Unregister
// does, without asking other nodes: for a revocation this node learns from
// the token store rather than from the revoking node's request (in a
// cluster, one made while this node was cut off from NATS: the request
// found nobody, and the tab would stay connected with a revoked token).
// It returns at once; the socket is closed on a goroutine of its own.
func (r *Registry) DropRevoked(tid string) {
	if !r.holds(tid) {
		return
	}
	r.mu.Lock()
	if r.shutting {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1) // legal: not shutting, under r.mu (Shutdown sets shutting under it before waiting)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		r.drop(tid, CloseRevoked, "revoked", "unregistered")
	}()
}

// drop removes tid at once: the live socket (if any) gets {t:'revoked'} when
// code is CloseRevoked, and is closed with code.
func (r *Registry) drop(tid string, code int, reason, auditReason string) {
	if h := r.hooks.Load(); code == CloseVersionSkew && h.OnVersionSkew != nil {
		h.OnVersionSkew(tid)
	}
	r.mu.Lock()
	s := r.sessions[tid]
	r.mu.Unlock()
	if s != nil {
		r.dropSession(s, code, reason, auditReason)
	}
}

// dropSession is drop for s, if s is still its tid's session.
func (r *Registry) dropSession(s *session, code int, reason, auditReason string) {
	r.mu.Lock()
	if r.sessions[s.tid] != s {
		r.mu.Unlock()
		return
	}
	delete(r.sessions, s.tid)
	if s.closedElem != nil {
		r.closed.Remove(s.closedElem)
		s.closedElem = nil
	}
	r.mu.Unlock()

	s.mu.Lock()
	c := s.cur
	s.cur = nil
	s.dropped = true
	s.failAllLocked(ErrPaused)
	r.bufBytes.Add(-int64(s.releaseBuffersLocked()))
	s.expect = nil
	s.mu.Unlock()
	if r.cl != nil {
		r.cl.disown(s.tid, s)
	}
	if c == nil {
		return
	}
	if code == CloseRevoked {
		_ = c.enqueue([]byte(`{"t":"revoked"}`))
	}
	c.close(code, reason)
	r.afterClose(s, auditReason)
}

// afterClose runs when s lost its socket for good (not superseded). The
// token record moves to pending-resume only if no newer socket of s is
// registered or being upgraded; with an upgrade pending, the move waits
// for its outcome (connect or unreserve). In a cluster, a tab already
// held by another node leaves the record to that node.
func (r *Registry) afterClose(s *session, reason string) {
	if r.cl != nil && s.socket() == nil && r.cl.liveElsewhere(s.tid) {
		r.cfg.Audit.Record(context.Background(), audit.Entry{TID: s.tid, Event: audit.EventDisconnect, Detail: map[string]any{"reason": reason, "pairedElsewhere": true}})
		if h := r.hooks.Load(); h.OnClosed != nil {
			h.OnClosed(s.tid)
		}
		return
	}
	s.stateMu.Lock()
	if s.socket() == nil {
		if s.pending > 0 {
			s.disconnectDue = true
		} else {
			r.markDisconnected(s.tid)
		}
	}
	s.stateMu.Unlock()
	r.cfg.Audit.Record(context.Background(), audit.Entry{TID: s.tid, Event: audit.EventDisconnect, Detail: map[string]any{"reason": reason}})
	if h := r.hooks.Load(); h.OnClosed != nil {
		h.OnClosed(s.tid)
	}
}

// markDisconnected moves tid's record to pending-resume. Caller holds the
// session's stateMu.
func (r *Registry) markDisconnected(tid string) {
	if _, err := r.cfg.Tokens.Disconnected(context.Background(), tid); err != nil {
		r.cfg.Logger.Warn("pairing: marking the token pending-resume failed", "tid", tid, "err", err)
	}
}

// Shutdown closes every socket with close code 1012 (service restart; the
// client reconnects), fails in-flight calls with ErrClosed, and waits for the
// goroutines it started, or for ctx. New upgrades are refused with 503
// shutting-down from the moment it is called. Calling it twice is fine.
func (r *Registry) Shutdown(ctx context.Context) error {
	if r.cl != nil {
		r.cl.close() // other nodes stop reaching tabs here: they are told to reconnect
	}
	r.mu.Lock()
	if !r.shutting {
		r.shutting = true
		close(r.stop)
	}
	var conns []*conn
	for _, s := range r.sessions {
		s.mu.Lock()
		s.failAllLocked(ErrClosed)
		if s.cur != nil {
			conns = append(conns, s.cur)
		}
		s.mu.Unlock()
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.close(CloseRestart, "server restarting")
	}
	r.park.stop()
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		r.park.closeFDs()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
