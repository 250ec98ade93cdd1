package lapd

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/pairing"
)

// Metrics, in two kinds (docs/OPERATING.md lists every one):
//
//   - On the hot path, only what must be observed per call: a counter and a
//     latency histogram per meta/LAP route, per RPC tool and per MCP tool.
//     Every label combination is resolved when the Server is built, so a
//     call costs client_golang's atomic adds and nothing else: no lock, no
//     allocation, no map write (one exemplar per route and second
//     allocates its label map).
//   - At scrape time, what the parts count anyway (pairing.Stats, the audit
//     log's counters, the MCP session table, approvals pending) is read by a
//     collector, and what the audit stream says (refusals by reason,
//     approvals by outcome, disconnects by reason) is counted by an
//     audit.Sink on the audit writer, off the request path.
//
// No label carries a token, a tid or a user id: every label value comes from
// a fixed list, and anything else is counted as "other".

// latencyBuckets spans a loopback round trip (≈100 µs) to a long poll (2 min).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120}

// statusCodes are the HTTP statuses lapd's routes answer; their counters are
// resolved up front. Any other status takes the slow path (WithLabelValues).
var statusCodes = []int{200, 204, 400, 401, 403, 404, 405, 408, 409, 413, 429, 500, 503, 504}

func statusIndex(code int) int {
	for i, c := range statusCodes {
		if c == code {
			return i
		}
	}
	return -1
}

// lapRouteNames and metaRouteNames are the routes lap serves (lap's
// lapRoutes and metaRoutes).
var (
	lapRouteNames = []string{"/describe", "/observe", "/state", "/query-state", "/actions", "/message",
		"/confirm-result", "/wait", "/narrate", "/query-dom", "/describe-visible", "/context",
		"/recent-actions", "/would-dispatch"}
	metaRouteNames = []string{"/mint", "/resume/list", "/resume/claim", "/revoke", "/sessions"}
	rpcToolNames   = []string{"observe", "get_state", "query_state", "list_actions", "send_message",
		"query_dom", "describe_visible_content", "describe_context", "would_dispatch"}
	rpcResults = []string{"ok", "error", "timeout", "paused", "busy", "closed", "cancelled"}
)

const other = "other"

// metrics is the Prometheus side of a Server: its own registry, the hot-path
// instruments (lap.Observer and mcp.Observer) and the scrape-time collector.
type metrics struct {
	reg *prometheus.Registry

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	routes   map[string]*routeMetrics // "lap /observe" → instruments; read-only after New

	rpcCalls    *prometheus.CounterVec
	rpcDuration *prometheus.HistogramVec
	rpcTools    map[string]*rpcMetrics

	toolCalls    *prometheus.CounterVec
	toolDuration *prometheus.HistogramVec
	tools        map[string]*toolMetrics

	stream *streamMetrics
}

type routeMetrics struct {
	api, route string
	codes      []prometheus.Counter // by statusIndex
	duration   prometheus.Observer
	exemplarAt atomic.Int64 // UnixNano of the last exemplar
}

type rpcMetrics struct {
	results  []prometheus.Counter // by rpcResults index
	duration prometheus.Observer
}

type toolMetrics struct {
	calls    [2][2]prometheus.Counter // [era legacy/modern][ok/error]
	duration prometheus.Observer
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lapd_requests_total",
			Help: "Meta and LAP calls by API (lap, meta), route and HTTP status code.",
		}, []string{"api", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lapd_request_duration_seconds",
			Help:    "Time from a meta or LAP call's arrival to its response, by API and route.",
			Buckets: latencyBuckets,
		}, []string{"api", "route"}),
		rpcCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lapd_rpc_calls_total",
			Help: "RPCs LAP calls sent to tabs, by tool and result (ok, error: the tab answered rpc-error, timeout, paused: no tab, busy, closed: shutting down, cancelled: the caller gave up).",
		}, []string{"tool", "result"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lapd_rpc_duration_seconds",
			Help:    "Round trip of an RPC to a tab over its WebSocket, by tool.",
			Buckets: latencyBuckets,
		}, []string{"tool"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lapd_mcp_tool_calls_total",
			Help: "MCP tool calls on /agent/mcp, by tool, protocol era (legacy, modern) and result (ok, error: an isError result).",
		}, []string{"tool", "era", "result"}),
		toolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lapd_mcp_tool_duration_seconds",
			Help:    "Time to answer an MCP tool call on /agent/mcp, by tool.",
			Buckets: latencyBuckets,
		}, []string{"tool"}),
		routes:   map[string]*routeMetrics{},
		rpcTools: map[string]*rpcMetrics{},
		tools:    map[string]*toolMetrics{},
		stream:   newStreamMetrics(),
	}
	addRoute := func(api, route string) {
		rm := &routeMetrics{api: api, route: route, duration: m.duration.WithLabelValues(api, route)}
		for _, c := range statusCodes {
			rm.codes = append(rm.codes, m.requests.WithLabelValues(api, route, strconv.Itoa(c)))
		}
		m.routes[api+" "+route] = rm
	}
	for _, r := range lapRouteNames {
		addRoute("lap", r)
	}
	for _, r := range metaRouteNames {
		addRoute("meta", r)
	}
	for _, t := range append(rpcToolNames, other) {
		rm := &rpcMetrics{duration: m.rpcDuration.WithLabelValues(t)}
		for _, r := range rpcResults {
			rm.results = append(rm.results, m.rpcCalls.WithLabelValues(t, r))
		}
		m.rpcTools[t] = rm
	}
	m.addTools([]string{other})
	return m
}

// addTools resolves the MCP tool instruments; New calls it before serving
// (the maps are read-only from then on).
func (m *metrics) addTools(names []string) {
	for _, t := range names {
		tm := &toolMetrics{duration: m.toolDuration.WithLabelValues(t)}
		for i, era := range []string{"legacy", "modern"} {
			tm.calls[i][0] = m.toolCalls.WithLabelValues(t, era, "ok")
			tm.calls[i][1] = m.toolCalls.WithLabelValues(t, era, "error")
		}
		m.tools[t] = tm
	}
}

// register adds every lapd collector to reg (not the Go runtime ones).
func (m *metrics) register(reg prometheus.Registerer, c prometheus.Collector) error {
	for _, col := range []prometheus.Collector{m.requests, m.duration, m.rpcCalls, m.rpcDuration,
		m.toolCalls, m.toolDuration, m.stream, c} {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}

// Call implements lap.Observer.
func (m *metrics) Call(api, route string, status int, d time.Duration, rid string) {
	rm := m.routes[api+" "+route]
	if rm == nil { // a route lap added that this list lacks
		m.requests.WithLabelValues(api, other, strconv.Itoa(status)).Inc()
		m.duration.WithLabelValues(api, other).Observe(d.Seconds())
		return
	}
	if i := statusIndex(status); i >= 0 {
		rm.codes[i].Inc()
	} else {
		m.requests.WithLabelValues(api, route, strconv.Itoa(status)).Inc()
	}
	// One exemplar per route and second joins a latency bucket to a
	// request id (and so to its audit entries and log lines).
	now := time.Now().UnixNano()
	if last := rm.exemplarAt.Load(); rid != "" && now-last > int64(time.Second) && rm.exemplarAt.CompareAndSwap(last, now) {
		if eo, ok := rm.duration.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"rid": rid})
			return
		}
	}
	rm.duration.Observe(d.Seconds())
}

// RPC implements lap.Observer.
func (m *metrics) RPC(tool string, d time.Duration, err error) {
	rm := m.rpcTools[tool]
	if rm == nil {
		rm = m.rpcTools[other]
	}
	rm.duration.Observe(d.Seconds())
	rm.results[rpcResult(err)].Inc()
}

// rpcResult is err's index in rpcResults.
func rpcResult(err error) int {
	if err == nil {
		return 0
	}
	if _, ok := err.(*pairing.RPCError); ok { // Call returns it unwrapped; errors.As would allocate
		return 1
	}
	switch {
	case errors.Is(err, pairing.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return 2
	case errors.Is(err, pairing.ErrPaused):
		return 3
	case errors.Is(err, pairing.ErrBusy):
		return 4
	case errors.Is(err, pairing.ErrClosed):
		return 5
	}
	return 6
}

// ToolCall implements mcp.Observer.
func (m *metrics) ToolCall(tool, era string, d time.Duration, isError bool) {
	tm := m.tools[tool]
	if tm == nil {
		tm = m.tools[other]
	}
	e, r := 0, 0
	if era == "modern" {
		e = 1
	}
	if isError {
		r = 1
	}
	tm.calls[e][r].Inc()
	tm.duration.Observe(d.Seconds())
}

// collector reads the parts' own counters at scrape time.
type collector struct {
	s     *Server
	descs map[string]*prometheus.Desc
}

// gauge and counter descriptors of the collector, by name.
var collectorMetrics = []struct {
	name, help string
	labels     []string
}{
	{"lapd_tabs_connected", "Tabs with a live WebSocket now.", nil},
	{"lapd_tabs_held", "Tabs the pairing registry holds: connected, or closed within the grace window.", nil},
	{"lapd_ws_frames_received_total", "WebSocket messages read from tabs.", nil},
	{"lapd_ws_frames_sent_total", "WebSocket messages written to tabs.", nil},
	{"lapd_ws_received_bytes_total", "Payload bytes of the WebSocket messages read from tabs.", nil},
	{"lapd_ws_sent_bytes_total", "Payload bytes of the WebSocket messages written to tabs.", nil},
	{"lapd_ws_frames_dropped_total", "Inbound tab frames dropped, by reason (malformed, unknown-type, unknown-reply: an answer nobody waits for).", []string{"reason"}},
	{"lapd_ws_upgrades_refused_total", "Requests to the tab WebSocket answered with an error instead of an upgrade.", nil},
	{"lapd_ws_closes_total", "Tab sockets lapd closed, by reason (superseded, heartbeat, queue-overflow, overloaded: the hello did not fit the buffer budget, write-timeout: a frame took longer than the write timeout).", []string{"reason"}},
	{"lapd_memory_releases_total", "Times the garbage of a burst of tab pairings was returned to the OS once the burst was over (at most once a minute).", nil},
	{"lapd_approvals_pending", "Approvals waiting for a human now.", nil},
	{"lapd_ws_frames_throttled_total", "Inbound tab frames read late because the socket went over its frame or byte rate (nothing is dropped).", nil},
	{"lapd_kept_bytes", "Bytes of session data kept in memory now, by part (tab-buffers: log rings and hellos; idempotency: remembered /message results; policies: compiled hello.policy; approval-outcomes; approval-payloads).", []string{"part"}},
	{"lapd_kept_budget_bytes", "The byte budget of each part (a share of --max-kept-mib); past it the part sheds.", []string{"part"}},
	{"lapd_kept_shed_total", "Items a part dropped early to stay in its byte budget (log entries and closed tabs' buffers, idempotent results, compiled policies, kept approval outcomes).", []string{"part"}},
	{"lapd_mcp_sessions", "MCP sessions on /agent/mcp by protocol era (the modern era has no sessions: each call names its lapd session).", []string{"era"}},
	{"lapd_audit_entries_total", "Audit entries recorded since start.", nil},
	{"lapd_audit_sink_failures_total", "Audit entry writes a sink failed (the entry is not stored there; the log says which sink).", nil},
	{"lapd_audit_dropped_total", "Audit entries dropped because the audit queue stayed full (each is counted in an audit-overflow entry).", nil},
	{"lapd_audit_queue_entries", "Audit entries waiting for the audit writer now.", nil},
	{"lapd_http_connections", "HTTP connections open now, as counted for --max-conns-per-client and --max-conns (upgraded WebSockets are not; 0 when the server does not use Server.ConnState).", nil},
	{"lapd_http_connections_closed_total", "HTTP connections lapd ended at the connection caps, by reason (refused: answered 503 too-many-connections; made-room: a client at its cap opened another, its longest-idle one was closed).", []string{"reason"}},
	{"lapd_draining", "1 while lapd shuts down (new calls get 503), else 0.", nil},
	{"lapd_cluster_forwarded_total", "Cluster: requests this node sent to the node holding a tab, by outcome (sent; no-responders: no node held it, answered paused; failed: timeout or NATS error). Only with --nats.", []string{"outcome"}},
	{"lapd_cluster_served_total", "Cluster: requests from other nodes served for tabs held here. Only with --nats.", nil},
	{"lapd_cluster_peer_total", "Cluster: the peer link (--peer-listen), by outcome (sent: requests sent on it; fallback: requests meant for it that went by NATS because the node could not be reached or no longer held the tab; refused: inbound connections refused at the handshake). Only with --nats.", []string{"outcome"}},
	{"lapd_cluster_tabs_owned", "Cluster: tabs whose socket is on this node (subscribed on NATS). Only with --nats.", nil},
	{"lapd_build_info", "Always 1; the labels name the build.", []string{"version", "goversion"}},
}

func newCollector(s *Server) *collector {
	c := &collector{s: s, descs: map[string]*prometheus.Desc{}}
	for _, m := range collectorMetrics {
		c.descs[m.name] = prometheus.NewDesc(m.name, m.help, m.labels, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(name string, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, lv...)
	}
	counter := func(name string, v int64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), lv...)
	}
	st := s.registry.Stats()
	gauge("lapd_tabs_connected", float64(st.ActiveTabs))
	gauge("lapd_tabs_held", float64(st.HeldTabs))
	counter("lapd_ws_frames_received_total", st.FramesIn)
	counter("lapd_ws_frames_sent_total", st.FramesOut)
	counter("lapd_ws_received_bytes_total", st.BytesIn)
	counter("lapd_ws_sent_bytes_total", st.BytesOut)
	counter("lapd_ws_frames_dropped_total", st.Malformed, "malformed")
	counter("lapd_ws_frames_dropped_total", st.Unknown, "unknown-type")
	counter("lapd_ws_frames_dropped_total", st.UnknownReplies, "unknown-reply")
	counter("lapd_ws_upgrades_refused_total", st.RefusedUpgrades)
	counter("lapd_ws_closes_total", st.Superseded, "superseded")
	counter("lapd_ws_closes_total", st.HeartbeatCloses, "heartbeat")
	counter("lapd_ws_closes_total", st.QueueOverflowCloses, "queue-overflow")
	counter("lapd_ws_closes_total", st.OverloadCloses, "overloaded")
	counter("lapd_ws_closes_total", st.WriteTimeouts, "write-timeout")
	counter("lapd_ws_closes_total", st.HellosTooBig, "hello-too-big")
	counter("lapd_memory_releases_total", st.MemoryReleases)
	counter("lapd_ws_frames_throttled_total", st.Throttled)
	open, refused, reaped := s.OpenConns()
	gauge("lapd_http_connections", float64(open))
	counter("lapd_http_connections_closed_total", refused, "refused")
	counter("lapd_http_connections_closed_total", reaped, "made-room")
	cs, ls := s.confirm.Stats(), s.lap.Stats()
	gauge("lapd_approvals_pending", float64(cs.Pending))
	b := s.budgets
	for _, k := range []struct {
		part         string
		bytes        int64
		budget, shed int64
	}{
		{"tab-buffers", st.BufferBytes, int64(b.tabBuffers), st.LogShed + st.ClosedShed},
		{"idempotency", int64(ls.IdemBytes), int64(b.idempotency), ls.IdemShed},
		{"policies", int64(ls.PolicyBytes), int64(b.policies), ls.PoliciesEvicted},
		{"approval-outcomes", int64(cs.KeptBytes), int64(b.outcomes), cs.Shed},
		{"approval-payloads", int64(cs.PendingBytes), int64(b.payloads), cs.PendingShed},
	} {
		gauge("lapd_kept_bytes", float64(k.bytes), k.part)
		gauge("lapd_kept_budget_bytes", float64(k.budget), k.part)
		counter("lapd_kept_shed_total", k.shed, k.part)
	}
	if s.mcp != nil {
		gauge("lapd_mcp_sessions", float64(s.mcp.Sessions()), "legacy")
	}
	counter("lapd_audit_entries_total", s.audit.Recorded())
	counter("lapd_audit_sink_failures_total", s.audit.Failures())
	counter("lapd_audit_dropped_total", s.audit.Dropped())
	gauge("lapd_audit_queue_entries", float64(s.audit.Queued()))
	draining := 0.0
	if s.lap.Draining() {
		draining = 1
	}
	gauge("lapd_draining", draining)
	if s.nc != nil {
		cl := st.Cluster
		counter("lapd_cluster_forwarded_total", cl.Forwarded, "sent")
		counter("lapd_cluster_forwarded_total", cl.NoResponders, "no-responders")
		counter("lapd_cluster_forwarded_total", cl.Failures, "failed")
		counter("lapd_cluster_served_total", cl.Served)
		counter("lapd_cluster_peer_total", cl.Direct, "sent")
		counter("lapd_cluster_peer_total", cl.Fallbacks, "fallback")
		counter("lapd_cluster_peer_total", cl.PeerRefused, "refused")
		gauge("lapd_cluster_tabs_owned", float64(cl.Owned))
	}
	gauge("lapd_build_info", 1, s.version, goVersion())
}

// streamMetrics counts what the audit stream says: it is an audit.Sink, so
// it runs where the sinks run (the audit writer), and every counter it may
// touch is resolved up front: counting an entry is a map read and an atomic
// add.
type streamMetrics struct {
	vecs        []prometheus.Collector
	batches     prometheus.Counter
	batchSize   prometheus.Histogram
	events      map[string]prometheus.Counter    // by event
	refusals    map[[2]string]prometheus.Counter // by surface, reason
	approvals   map[string]prometheus.Counter    // by audit event
	disconnects map[string]prometheus.Counter    // by reason
	admin       map[string]prometheus.Counter    // by action
}

var _ audit.BatchSink = (*streamMetrics)(nil)

// refusalCodes are the error codes lapd's refusals carry; anything else
// (a tab's own rpc-error code can be any string) is counted as "other".
var refusalCodes = []string{"auth-failed", "auth-required", "revoked", "paused", "rate-limited",
	"invalid", "schema-error", "timeout", "internal", "method-not-allowed", "payload-too-large",
	"not-found", "shutting-down", "forbidden-origin", "forbidden", "forbidden-host", "capacity",
	"conflict", "outcome-unknown", "busy", "request-timeout", "session-capacity", "too-many-pending",
	"bad-token", "not-loopback", "unavailable", "too-many-connections", other}

var surfaces = []string{"lap", "meta", "ws", "mcp", "admin", other}

var disconnectReasons = []string{"superseded", "send-queue-overflow", "heartbeat-missed", "shutdown",
	"version-skew", "revoked", "frame-too-big", "client-closed", "connection-lost", "unregistered",
	"overloaded", other}

var adminActions = []string{"login", "revoke", other}

func newStreamMetrics() *streamMetrics {
	vec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	events := vec("lapd_audit_events_total", "Audit entries by event (mint, lap-call, confirm-approved, refused, …).", "event")
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lapd_refusals_total",
		Help: "Refused requests by surface (lap, meta, ws, mcp, admin) and reason (the error code: auth-failed, revoked, paused, rate-limited, forbidden-origin, …).",
	}, []string{"surface", "reason"})
	approvals := vec("lapd_approvals_total", "Approvals by outcome: proposed, approved, rejected (by the human), expired (nobody answered).", "outcome")
	disconnects := vec("lapd_tab_disconnects_total", "Tabs whose socket closed for good, by reason (client-closed, connection-lost, heartbeat-missed, revoked, …).", "reason")
	admin := vec("lapd_admin_actions_total", "Actions taken in the admin console, by action (login, revoke).", "action")
	batches := prometheus.NewCounter(prometheus.CounterOpts{Name: "lapd_audit_batches_total",
		Help: "Batches the audit writer handed to the sinks (one transaction or one write each)."})
	batchSize := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lapd_audit_batch_entries",
		Help: "Entries per audit batch.", Buckets: []float64{1, 4, 16, 64, 256, 1024, 4096, 16384}})
	sm := &streamMetrics{
		vecs:        []prometheus.Collector{events, refusals, approvals, disconnects, admin, batches, batchSize},
		batches:     batches,
		batchSize:   batchSize,
		events:      map[string]prometheus.Counter{},
		refusals:    map[[2]string]prometheus.Counter{},
		approvals:   map[string]prometheus.Counter{},
		disconnects: map[string]prometheus.Counter{},
		admin:       map[string]prometheus.Counter{},
	}
	for _, ev := range append(audit.Events(), other) {
		sm.events[ev] = events.WithLabelValues(ev)
	}
	for _, sf := range surfaces {
		for _, c := range refusalCodes {
			sm.refusals[[2]string{sf, c}] = refusals.WithLabelValues(sf, c)
		}
	}
	for ev, o := range map[string]string{audit.EventConfirmProposed: "proposed", audit.EventConfirmApproved: "approved",
		audit.EventConfirmRejected: "rejected", audit.EventConfirmExpired: "expired"} {
		sm.approvals[ev] = approvals.WithLabelValues(o)
	}
	for _, r := range disconnectReasons {
		sm.disconnects[r] = disconnects.WithLabelValues(r)
	}
	for _, a := range adminActions {
		sm.admin[a] = admin.WithLabelValues(a)
	}
	return sm
}

// Describe implements prometheus.Collector.
func (sm *streamMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range sm.vecs {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (sm *streamMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, v := range sm.vecs {
		v.Collect(ch)
	}
}

// Write implements audit.Sink: it counts e.
func (sm *streamMetrics) Write(_ context.Context, e audit.Entry) error {
	sm.count(e)
	return nil
}

// WriteBatch implements audit.BatchSink: the audit writer hands over one
// batch (group commit); count it and its entries.
func (sm *streamMetrics) WriteBatch(_ context.Context, b *audit.Batch) error {
	sm.batches.Inc()
	sm.batchSize.Observe(float64(len(b.Entries)))
	for _, e := range b.Entries {
		sm.count(e)
	}
	return nil
}

// Close implements audit.Sink.
func (sm *streamMetrics) Close() error { return nil }

// pick returns m[k], or m[other] when k is not a known value.
func pick[K comparable](m map[K]prometheus.Counter, k, fallback K) prometheus.Counter {
	if c, ok := m[k]; ok {
		return c
	}
	return m[fallback]
}

func (sm *streamMetrics) count(e audit.Entry) {
	n := 1.0
	if a, ok := number(e.Detail["aggregated"]); ok && a > 0 { // a RecordLimited summary of n entries
		n = a
	}
	pick(sm.events, e.Event, other).Add(n)
	switch e.Event {
	case audit.EventAuthFailed, audit.EventRateLimited, audit.EventRefused:
		code, _ := e.Detail["code"].(string)
		if code == "" {
			switch e.Event {
			case audit.EventAuthFailed:
				code = "auth-failed"
			case audit.EventRateLimited:
				code = "rate-limited"
			}
		}
		ep, _ := e.Detail["endpoint"].(string)
		sf := surface(ep)
		pick(sm.refusals, [2]string{sf, code}, [2]string{sf, other}).Add(n)
	case audit.EventConfirmProposed, audit.EventConfirmApproved, audit.EventConfirmRejected, audit.EventConfirmExpired:
		sm.approvals[e.Event].Add(n)
	case audit.EventDisconnect:
		r, _ := e.Detail["reason"].(string)
		r, _, _ = strings.Cut(r, " ") // "client-closed 1001"
		pick(sm.disconnects, r, other).Add(n)
	case audit.EventAdmin:
		a, _ := e.Detail["action"].(string)
		pick(sm.admin, a, other).Add(n)
	}
}

// surface names where a refusal happened from its endpoint.
func surface(endpoint string) string {
	switch {
	case strings.HasPrefix(endpoint, "/admin"), strings.HasPrefix(endpoint, "/metrics"), strings.HasPrefix(endpoint, "/debug/"):
		return "admin"
	case strings.HasSuffix(endpoint, "/ws"):
		return "ws"
	case strings.HasSuffix(endpoint, "/mcp"):
		return "mcp"
	case strings.Contains(endpoint, "/lap/v1/"):
		return "lap"
	case endpoint == "":
		return other
	}
	return "meta"
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// registerRuntime adds the Go runtime and process collectors.
func registerRuntime(reg prometheus.Registerer) error {
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	return reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// metricsHandler serves reg in the Prometheus text format, or OpenMetrics
// (with exemplars) when the scraper asks for it.
func metricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true, Registry: reg, MaxRequestsInFlight: 4})
}

func goVersion() string { return runtime.Version() }

// keptBudgets are the byte budgets New gave the parts (shares of
// Config.MaxKeptBytes).
type keptBudgets struct {
	tabBuffers, idempotency, policies, outcomes, payloads int
}
