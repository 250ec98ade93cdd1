package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/lapd-dev/lapd/admin"
	"github.com/lapd-dev/lapd/audit"
)

// fakeBackend is a Backend over fixed data that records what it was asked.
type fakeBackend struct {
	mu      sync.Mutex
	revoked []string
	filters []audit.Filter
	entries []audit.Entry // oldest first
	noAudit bool
}

func (b *fakeBackend) Overview(context.Context) admin.Overview {
	return admin.Overview{Version: "test", Tabs: 1, Metrics: true, Calls: 10, Errors: 2}
}

func (b *fakeBackend) Sessions(context.Context, int) ([]admin.Session, int, error) {
	return []admin.Session{{TID: "t1", App: "Taskboard", Status: "active", Connected: true, Calls: 3}}, 1, nil
}

func (b *fakeBackend) Revoke(_ context.Context, tid string) error {
	if tid != "t1" {
		return admin.ErrUnknownSession
	}
	b.mu.Lock()
	b.revoked = append(b.revoked, tid)
	b.mu.Unlock()
	return nil
}

func (b *fakeBackend) Audit(_ context.Context, f audit.Filter) ([]audit.Entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.filters = append(b.filters, f)
	if b.noAudit {
		return nil, admin.ErrNoAudit
	}
	var out []audit.Entry
	for _, e := range b.entries {
		if f.TID == "" || e.TID == f.TID {
			out = append(out, e)
		}
	}
	end := max(len(out)-f.Offset, 0)
	return out[max(end-f.Limit, 0):end], nil
}

// recorder is an audit sink kept in memory.
type recorder struct {
	log     *audit.Log // flushed before reading: the audit writer is asynchronous
	mu      sync.Mutex
	entries []audit.Entry
}

func (r *recorder) Write(_ context.Context, e audit.Entry) error {
	r.mu.Lock()
	r.entries = append(r.entries, e)
	r.mu.Unlock()
	return nil
}
func (r *recorder) Close() error { return nil }

func (r *recorder) all() []audit.Entry {
	_ = r.log.Flush(context.Background())
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Entry(nil), r.entries...)
}

func (r *recorder) events() []string {
	_ = r.log.Flush(context.Background())
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.entries {
		out = append(out, e.Event+":"+str(e.Detail["code"])+str(e.Detail["action"]))
	}
	return out
}

func str(v any) string { s, _ := v.(string); return s }

func newConsole(t *testing.T, token string, b admin.Backend) (*admin.Handler, *recorder) {
	t.Helper()
	rec := &recorder{}
	log := audit.New(audit.Config{Sinks: []audit.Sink{rec}})
	rec.log = log
	t.Cleanup(func() { log.Close() })
	h, err := admin.New(admin.Config{Backend: b, Token: token, Audit: log})
	if err != nil {
		t.Fatal(err)
	}
	return h, rec
}

type req struct {
	method, path, body string
	remote, host       string
	hdr                []string
}

func do(t *testing.T, h http.Handler, r req) (int, map[string]any, http.Header) {
	t.Helper()
	if r.method == "" {
		r.method = "GET"
	}
	hr := httptest.NewRequest(r.method, "http://x"+r.path, strings.NewReader(r.body))
	hr.RemoteAddr = "127.0.0.1:5555"
	hr.Host = "127.0.0.1:9090"
	if r.remote != "" {
		hr.RemoteAddr = r.remote
	}
	if r.host != "" {
		hr.Host = r.host
	}
	if r.body != "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(r.hdr); i += 2 {
		hr.Header.Set(r.hdr[i], r.hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, hr)
	var m map[string]any
	b, _ := io.ReadAll(w.Result().Body)
	_ = json.Unmarshal(b, &m)
	return w.Code, m, w.Result().Header
}

const tok = "0123456789abcdef-admin"

func TestTokenRequired(t *testing.T) {
	h, rec := newConsole(t, tok, &fakeBackend{})
	for _, c := range []struct {
		name string
		hdr  []string
		want int
	}{
		{"none", nil, 401},
		{"wrong", []string{"Authorization", "Bearer " + tok + "x"}, 401},
		{"prefix", []string{"Authorization", "Bearer " + tok[:10]}, 401},
		{"basic", []string{"Authorization", "Basic " + tok}, 401},
		{"right", []string{"Authorization", "Bearer " + tok}, 200},
		{"case", []string{"Authorization", "bearer " + tok}, 200},
	} {
		st, m, hdr := do(t, h, req{path: "/admin/api/overview", hdr: c.hdr, remote: "192.0.2.7:1234", host: "admin.example:9090"})
		if st != c.want {
			t.Errorf("%s: %d %v, want %d", c.name, st, m, c.want)
		}
		if st == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: 401 without WWW-Authenticate", c.name)
		}
	}
	ev := rec.events()
	if n := strings.Count(strings.Join(ev, " "), "auth-failed:bad-token"); n != 4 {
		t.Errorf("audit: %v, want 4 auth-failed bad-token", ev)
	}
	for _, e := range rec.all() {
		b, _ := json.Marshal(e)
		if strings.Contains(string(b), tok[:10]) {
			t.Errorf("the token reached the audit: %s", b)
		}
	}
	// The static page needs no token (it holds no data) and is locked down.
	st, _, hdr := do(t, h, req{path: "/admin/", host: "admin.example:9090", remote: "192.0.2.7:1"})
	if st != 200 || !strings.Contains(hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("page: %d CSP %q", st, hdr.Get("Content-Security-Policy"))
	}
	if _, m, _ := do(t, h, req{path: "/admin/mode"}); m["mode"] != "token" {
		t.Errorf("mode: %v", m)
	}
	if _, err := admin.New(admin.Config{Backend: &fakeBackend{}, Token: "short"}); err == nil {
		t.Error("a short token was accepted")
	}
}

func TestLoopbackOnly(t *testing.T) {
	h, rec := newConsole(t, "", &fakeBackend{})
	if st, _, _ := do(t, h, req{path: "/admin/api/overview"}); st != 200 {
		t.Errorf("loopback: %d", st)
	}
	if st, _, _ := do(t, h, req{path: "/admin/api/overview", remote: "[::1]:4000", host: "localhost:9090"}); st != 200 {
		t.Errorf("::1 with Host localhost: %d", st)
	}
	if st, m, _ := do(t, h, req{path: "/admin/api/overview", remote: "192.0.2.7:1"}); st != 403 || m["error"].(map[string]any)["code"] != "not-loopback" {
		t.Errorf("remote client: %d %v", st, m)
	}
	// DNS rebinding: a page at evil.example resolving to 127.0.0.1.
	if st, m, _ := do(t, h, req{path: "/admin/api/overview", host: "evil.example:9090"}); st != 403 || m["error"].(map[string]any)["code"] != "forbidden-host" {
		t.Errorf("rebinding Host: %d %v", st, m)
	}
	if st, _, _ := do(t, h, req{path: "/admin/", host: "evil.example:9090"}); st != 403 {
		t.Errorf("page under a rebinding Host: %d", st)
	}
	// CSRF: a cross-site page posting to 127.0.0.1.
	if st, _, _ := do(t, h, req{method: "POST", path: "/admin/api/revoke", body: `{"tid":"t1"}`, hdr: []string{"Origin", "https://evil.example"}}); st != 403 {
		t.Errorf("cross-origin revoke: %d", st)
	}
	if st, _, _ := do(t, h, req{method: "POST", path: "/admin/api/revoke", body: `{"tid":"t1"}`, hdr: []string{"Content-Type", "text/plain"}}); st != 415 {
		t.Errorf("text/plain revoke: %d", st)
	}
	if ev := strings.Join(rec.events(), " "); strings.Count(ev, "refused:") != 4 {
		t.Errorf("audit: %s, want 4 refusals", ev)
	}
}

func TestActionsAudited(t *testing.T) {
	b := &fakeBackend{}
	h, rec := newConsole(t, "", b)
	if st, m, _ := do(t, h, req{method: "POST", path: "/admin/api/login", body: `{}`}); st != 200 || m["mode"] != "loopback" {
		t.Errorf("login: %d %v", st, m)
	}
	same := []string{"Origin", "http://127.0.0.1:9090"}
	if st, m, _ := do(t, h, req{method: "POST", path: "/admin/api/revoke", body: `{"tid":"t1"}`, hdr: same}); st != 200 {
		t.Errorf("revoke: %d %v", st, m)
	}
	if st, m, _ := do(t, h, req{method: "POST", path: "/admin/api/revoke", body: `{"tid":"nope"}`}); st != 404 || !strings.Contains(m["error"].(map[string]any)["detail"].(string), "refresh") {
		t.Errorf("revoke unknown: %d %v", st, m)
	}
	if st, _, _ := do(t, h, req{method: "POST", path: "/admin/api/revoke", body: `{}`}); st != 400 {
		t.Errorf("revoke without tid: %d", st)
	}
	if st, _, _ := do(t, h, req{path: "/admin/api/revoke"}); st != 405 {
		t.Errorf("GET revoke: %d", st)
	}
	if len(b.revoked) != 1 {
		t.Errorf("revoked %v", b.revoked)
	}
	if ev := strings.Join(rec.events(), " "); ev != "admin:login admin:revoke" {
		t.Errorf("audit: %s", ev)
	}
	for _, e := range rec.all() {
		if e.Detail["ip"] != "127.0.0.1" {
			t.Errorf("admin entry without the client ip: %v", e)
		}
	}
}

func TestAuditPaging(t *testing.T) {
	b := &fakeBackend{}
	for i := range 7 {
		b.entries = append(b.entries, audit.Entry{At: int64(1000 + i), TID: "t1", Event: audit.EventLapCall})
	}
	h, _ := newConsole(t, "", b)
	page := func(q string) ([]int64, bool) {
		st, m, _ := do(t, h, req{path: "/admin/api/audit?" + q})
		if st != 200 {
			t.Fatalf("audit %s: %d %v", q, st, m)
		}
		var ats []int64
		for _, e := range m["entries"].([]any) {
			ats = append(ats, int64(e.(map[string]any)["at"].(float64)))
		}
		return ats, m["more"].(bool)
	}
	p1, more := page("limit=3&tid=t1&event=lap-call&since=5&until=99999")
	if len(p1) != 3 || p1[0] != 1006 || p1[2] != 1004 || !more {
		t.Errorf("page 1: %v more=%v (newest first)", p1, more)
	}
	p3, more := page("limit=3&offset=6")
	if len(p3) != 1 || p3[0] != 1000 || more {
		t.Errorf("page 3: %v more=%v", p3, more)
	}
	f := b.filters[0]
	if f.TID != "t1" || f.Event != "lap-call" || f.Since != 5 || f.Until != 99999 || f.Limit != 4 {
		t.Errorf("filter passed on: %+v", f)
	}
	if st, _, _ := do(t, h, req{path: "/admin/api/audit?event=nonsense"}); st != 400 {
		t.Errorf("unknown event: %d", st)
	}
	b.noAudit = true
	if st, m, _ := do(t, h, req{path: "/admin/api/audit"}); st != 404 || m["error"].(map[string]any)["code"] != "no-audit" {
		t.Errorf("no audit: %d %v", st, m)
	}
}
