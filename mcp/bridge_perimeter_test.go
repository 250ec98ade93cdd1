package mcp

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/lapd-dev/lapd/lap"
)

func TestLAPBase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://127.0.0.1:8787/agent/lap/v1":  "http://127.0.0.1:8787/agent/lap/v1",
		"https://app.example/agent/lap/v1/":   "https://app.example/agent/lap/v1",
		"http://h/x/lapd/lap/v1":              "http://h/x/lapd/lap/v1",
		"http://127.0.0.1:9/admin/secret?":    "",
		"http://127.0.0.1:9/admin/secret":     "",
		"http://h/agent/lap/v1?x=1":           "",
		"http://h/agent/lap/v1#f":             "",
		"http://u:p@h/agent/lap/v1":           "",
		"http://h/admin/../agent/lap/v1":      "",
		"ftp://h/agent/lap/v1":                "",
		"http:///agent/lap/v1":                "",
		"http://h/agent/lap/v1/../../admin/x": "",
	} {
		got, err := LAPBase(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("LAPBase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// The stdio bridge POSTed anywhere: connect_session url=<any URL> sent the
// user's bearer to <url>/observe and echoed 200 bytes of the answer to the
// model. Now only a LAP base URL is accepted, redirects are not followed, and
// a body that is not LAP is never repeated.
func TestBridgeSendsTheBearerOnlyToLAP(t *testing.T) {
	t.Parallel()
	const secret = "TOPSECRET-admin-page"
	var mu sync.Mutex
	var seen []string // paths that received the bearer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			mu.Lock()
			seen = append(seen, r.URL.Path)
			mu.Unlock()
		}
		switch r.URL.Path {
		case "/other/lap/v1/observe": // a LAP-shaped path on a server that is not lapd
			http.Error(w, secret, http.StatusNotFound)
		case "/redirect/lap/v1/observe":
			http.Redirect(w, r, "/admin/secret", http.StatusFound)
		case "/html/lap/v1/observe":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html>" + secret + "</html>"))
		default:
			_, _ = w.Write([]byte(secret))
		}
	}))
	defer srv.Close()
	h := newHarness(t, func(c *Config) { c.Client = lap.NewHTTPClient(nil) })
	out := h.call("connect_session", map[string]any{"url": srv.URL + "/admin/secret?", "token": tokA})
	wantError(t, out, CodeInvalidArguments, "/lap/v1")
	out = h.call("connect_session", map[string]any{"line": "connect_session url=" + srv.URL + "/admin/secret token=" + tokA})
	wantError(t, out, CodeInvalidArguments, "/lap/v1")
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the bearer was sent to %v", seen)
	}
	for _, p := range []string{"/other/lap/v1", "/redirect/lap/v1", "/html/lap/v1"} {
		out = h.call("connect_session", map[string]any{"url": srv.URL + p, "token": tokA})
		if !out.IsError || strings.Contains(out.Text, secret) || strings.Contains(out.Text, "html") {
			t.Errorf("%s: %v %q", p, out.IsError, out.Text)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range seen {
		if p == "/admin/secret" {
			t.Error("the redirect was followed with the bearer")
		}
	}
}

func FuzzLAPBase(f *testing.F) {
	f.Add("http://127.0.0.1:8787/agent/lap/v1")
	f.Add("http://127.0.0.1:9/admin/secret?")
	f.Fuzz(func(t *testing.T, raw string) {
		b, err := LAPBase(raw)
		if err != nil {
			return
		}
		u, perr := url.Parse(b)
		if perr != nil || !strings.HasSuffix(u.Path, "/lap/v1") || u.RawQuery != "" || u.Fragment != "" || u.User != nil ||
			(u.Scheme != "http" && u.Scheme != "https") || strings.Contains(u.Path, "/../") {
			t.Fatalf("LAPBase(%q) = %q", raw, b)
		}
		if again, err := LAPBase(b); err != nil || again != b {
			t.Fatalf("not stable: %q → %q → %q, %v", raw, b, again, err)
		}
	})
}
