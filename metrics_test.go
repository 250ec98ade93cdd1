package lapd_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	mcpclient "github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lapdtest"
)

// adminServer runs lapd with Admin on and its AdminHandler on a loopback
// listener of its own.
func adminServer(t *testing.T, cfg lapd.Config) (*lapdtest.Server, *httptest.Server) {
	t.Helper()
	cfg.Admin.Enabled = true
	srv := lapdtest.NewServer(cfg)
	t.Cleanup(srv.Close)
	adm := httptest.NewServer(srv.Lapd.AdminHandler())
	t.Cleanup(adm.Close)
	return srv, adm
}

// scrape GETs /metrics and parses it.
func scrape(t *testing.T, url, token string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", res.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams, string(b)
}

// value is the value of the family's metric with exactly these labels
// (counter, gauge, or a histogram's count); -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.Metric {
		want := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			want[labels[i]] = labels[i+1]
		}
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if want[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// The counters and histograms move under driven calls: LAP over HTTP, MCP
// over /agent/mcp (mcp-go's client), a refusal, a paired tab's frames.
func TestMetricsMoveUnderCalls(t *testing.T) {
	srv, adm := adminServer(t, lapd.Config{})
	ctx := ctxT(t)
	tab, sess, err := srv.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	before, _ := scrape(t, adm.URL, "")
	if v := value(before, "lapd_tabs_connected"); v != 1 {
		t.Errorf("lapd_tabs_connected = %v, want 1", v)
	}
	for range 3 {
		if st, _, m := post(t, srv.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
			t.Fatalf("observe: %d %v", st, m)
		}
	}
	if st, _, _ := post(t, srv.LAPURL()+"/observe", "agt_wrong", `{}`); st != 401 {
		t.Fatalf("bad token: %d", st)
	}

	mc, err := mcpclient.NewStreamableHttpClient(srv.MCPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if err := mc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "t", Version: "1"}
	if _, err := mc.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	callTool := func(name string, args map[string]any) *mcpgo.CallToolResult {
		req := mcpgo.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := mc.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	if r := callTool("connect_session", map[string]any{"line": sess.ConnectLine()}); r.IsError {
		t.Fatalf("connect_session: %+v", r.Content)
	}
	if r := callTool("observe", map[string]any{}); r.IsError {
		t.Fatalf("observe: %+v", r.Content)
	}
	_ = srv.Lapd.Audit().Flush(ctx) // the audit writer is asynchronous

	fams, text := scrape(t, adm.URL, "")
	checks := []struct {
		name   string
		labels []string
		min    float64
	}{
		{"lapd_requests_total", []string{"api", "lap", "route", "/observe", "code", "200"}, 4}, // 3 over HTTP + 1 from MCP
		{"lapd_requests_total", []string{"api", "lap", "route", "/observe", "code", "401"}, 1},
		{"lapd_requests_total", []string{"api", "meta", "route", "/mint", "code", "200"}, 1},
		{"lapd_request_duration_seconds", []string{"api", "lap", "route", "/observe"}, 5},
		{"lapd_rpc_duration_seconds", []string{"tool", "observe"}, 4},
		{"lapd_rpc_calls_total", []string{"tool", "observe", "result", "ok"}, 4},
		{"lapd_mcp_tool_calls_total", []string{"tool", "observe", "era", "legacy", "result", "ok"}, 1},
		{"lapd_mcp_tool_calls_total", []string{"tool", "connect_session", "era", "legacy", "result", "ok"}, 1},
		{"lapd_mcp_tool_duration_seconds", []string{"tool", "observe"}, 1},
		{"lapd_refusals_total", []string{"surface", "lap", "reason", "auth-failed"}, 1},
		{"lapd_audit_events_total", []string{"event", "lap-call"}, 4},
		{"lapd_audit_events_total", []string{"event", "mint"}, 1},
		{"lapd_ws_frames_received_total", nil, 5},
		{"lapd_ws_frames_sent_total", nil, 5},
		{"lapd_ws_received_bytes_total", nil, 100},
		{"lapd_mcp_sessions", []string{"era", "legacy"}, 1},
		{"lapd_tabs_connected", nil, 1},
		{"lapd_audit_entries_total", nil, 6},
		{"go_goroutines", nil, 1},
		{"lapd_kept_bytes", []string{"part", "tab-buffers"}, 100}, // the tab's hello and log ring
		{"lapd_kept_budget_bytes", []string{"part", "tab-buffers"}, lapd.DefaultMaxKeptBytes / 4},
		{"lapd_kept_shed_total", []string{"part", "idempotency"}, 0},
		{"lapd_approvals_pending", nil, 0},
		{"lapd_audit_batches_total", nil, 1},
		{"lapd_audit_batch_entries", nil, 1},
		{"lapd_audit_queue_entries", nil, 0},
		{"lapd_audit_dropped_total", nil, 0},
	}
	for _, c := range checks {
		if v := value(fams, c.name, c.labels...); v < c.min {
			t.Errorf("%s%v = %v, want ≥ %v", c.name, c.labels, v, c.min)
		}
	}
	// Each /observe answered 200 made exactly one observe RPC (3 over HTTP,
	// the MCP observe and connect_session's own).
	moved := func(name string, labels ...string) float64 {
		return value(fams, name, labels...) - max(value(before, name, labels...), 0)
	}
	calls := moved("lapd_requests_total", "api", "lap", "route", "/observe", "code", "200")
	if rpcs := moved("lapd_rpc_calls_total", "tool", "observe", "result", "ok"); calls < 4 || rpcs != calls {
		t.Errorf("/observe 200 moved by %v, observe RPCs by %v: want equal, ≥ 4", calls, rpcs)
	}
	// No label carries a token, a tid or a user id.
	for _, leak := range []string{sess.TID, sess.Token, "agt_"} {
		if strings.Contains(text, leak) {
			t.Errorf("/metrics mentions %q", leak)
		}
	}
}

// Metric names and help follow Prometheus' conventions (promlint), and the
// exposition carries exemplars with request ids in OpenMetrics.
func TestMetricsLint(t *testing.T) {
	srv, adm := adminServer(t, lapd.Config{})
	tab, sess, err := srv.Pair(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	post(t, srv.LAPURL()+"/observe", sess.Token, `{}`, "X-Request-Id", "lint-1")
	_, text := scrape(t, adm.URL, "")
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "lapd_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	for _, fam := range []string{"lapd_requests_total", "lapd_request_duration_seconds", "lapd_rpc_duration_seconds",
		"lapd_mcp_tool_calls_total", "lapd_refusals_total", "lapd_approvals_total", "lapd_tabs_connected", "lapd_build_info"} {
		if !strings.Contains(text, "# TYPE "+fam+" ") {
			t.Errorf("/metrics lacks %s", fam)
		}
	}

	req, _ := http.NewRequest("GET", adm.URL+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(b), `lapd_request_duration_seconds_bucket{api="lap",route="/observe"`) || !strings.Contains(string(b), `# {rid="lint-1"}`) {
		t.Errorf("OpenMetrics exposition lacks the /observe exemplar with rid lint-1:\n%s", grepLines(string(b), "/observe"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// One request id joins a LAP call's response, its audit entry and the rpc
// frame the tab got; a caller's id is kept when valid, replaced when not.
func TestRequestIDJoins(t *testing.T) {
	srv := lapdtest.NewServer(lapd.Config{})
	defer srv.Close()
	ctx := ctxT(t)
	tab, sess, err := srv.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	st, hdr, _ := post(t, srv.LAPURL()+"/observe", sess.Token, `{}`, "X-Request-Id", "join-42")
	if st != 200 || hdr.Get("X-Request-Id") != "join-42" {
		t.Fatalf("observe: %d, X-Request-Id %q", st, hdr.Get("X-Request-Id"))
	}
	e, err := srv.WaitAudit(ctx, func(e audit.Entry) bool { return e.Event == audit.EventLapCall && e.Detail["rid"] == "join-42" })
	if err != nil {
		t.Fatalf("no lap-call audit entry with rid join-42: %v (%v)", err, srv.AuditEntries())
	}
	if e.TID != sess.TID {
		t.Errorf("audit entry of tid %q", e.TID)
	}
	var rids []string
	for _, f := range tab.Frames() {
		if f.T == "rpc" {
			var rid string
			_ = json.Unmarshal(f.Field("rid"), &rid)
			rids = append(rids, rid)
		}
	}
	if len(rids) == 0 || rids[len(rids)-1] != "join-42" {
		t.Errorf("rpc frames' rid: %v, want the last to be join-42", rids)
	}
	// An id that could be a token (or carry anything to escape) is replaced.
	for _, bad := range []string{"agt_abc", `a"b`, strings.Repeat("x", 65)} {
		_, hdr, _ = post(t, srv.LAPURL()+"/observe", sess.Token, `{}`, "X-Request-Id", bad)
		if got := hdr.Get("X-Request-Id"); got == bad || !audit.ValidRequestID(got) {
			t.Errorf("X-Request-Id %q came back as %q", bad, got)
		}
	}
	// Meta routes get one too.
	st, hdr, _ = post(t, srv.URL+"/agent/mint", "", `{}`)
	if st != 200 || !audit.ValidRequestID(hdr.Get("X-Request-Id")) {
		t.Errorf("mint: %d X-Request-Id %q", st, hdr.Get("X-Request-Id"))
	}
}

// /readyz: ready; not ready while an audit sink fails and while draining,
// each check saying why.
func TestReadyz(t *testing.T) {
	fail := &failingSink{}
	srv := lapdtest.NewServer(lapd.Config{AuditSinks: []audit.Sink{fail}})
	defer srv.Close()
	get := func() (int, map[string]any) {
		res, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, m
	}
	if st, m := get(); st != 200 || m["status"] != "ready" {
		t.Fatalf("readyz: %d %v", st, m)
	}
	fail.on.Store(true)
	srv.Lapd.Audit().Record(context.Background(), audit.Entry{Event: audit.EventMint})
	_ = srv.Lapd.Audit().Flush(ctxT(t)) // the audit writer is asynchronous
	st, m := get()
	if st != 503 || m["status"] != "not-ready" || !strings.Contains(checkDetail(m, "audit"), "audit sink failed") {
		t.Errorf("readyz with a failing sink: %d %v", st, m)
	}
	fail.on.Store(false)
	srv.Lapd.LAP().Drain()
	st, m = get()
	if st != 503 || !strings.Contains(checkDetail(m, "draining"), "shutting down") {
		t.Errorf("readyz while draining: %d %v", st, m)
	}
}

func checkDetail(m map[string]any, name string) string {
	cs, _ := m["checks"].([]any)
	for _, c := range cs {
		c, _ := c.(map[string]any)
		if c["name"] == name && c["ok"] == false {
			d, _ := c["detail"].(string)
			return d
		}
	}
	return ""
}

type failingSink struct{ on atomic.Bool }

func (f *failingSink) Write(context.Context, audit.Entry) error {
	if f.on.Load() {
		return io.ErrClosedPipe
	}
	return nil
}
func (f *failingSink) Close() error { return nil }

// Admin.Registerer gets lapd's collectors for a /metrics of the app's own.
func TestMetricsRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := lapdtest.NewServer(lapd.Config{Admin: lapd.AdminConfig{Enabled: true, Registerer: reg}})
	defer srv.Close()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fams {
		names = append(names, f.GetName())
	}
	joined := strings.Join(names, " ")
	if !strings.Contains(joined, "lapd_tabs_connected") || strings.Contains(joined, "go_goroutines") {
		t.Errorf("the app's registry got %v", names)
	}
}
