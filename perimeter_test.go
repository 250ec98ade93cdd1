package lapd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
)

// sink records audit entries.
type sink struct {
	mu  sync.Mutex
	es  []audit.Entry
	log *audit.Log // flushed before reading (the audit log writes asynchronously)
}

func (s *sink) Write(_ context.Context, e audit.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.es = append(s.es, e)
	return nil
}
func (s *sink) Close() error { return nil }
func (s *sink) find(match func(audit.Entry) bool) []audit.Entry {
	if s.log != nil {
		_ = s.log.Flush(context.Background())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []audit.Entry
	for _, e := range s.es {
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}

func do(t *testing.T, method, url, host, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b
}

// DNS rebinding: a page on evil.example whose name resolves to 127.0.0.1
// reaches a loopback lapd with Host: evil.example. Every route refuses it
// (mint, the WebSocket, LAP, MCP, the client, healthz, the demo and its
// save), with the JSON envelope, audited; loopback names, the public URL's
// host and configured hosts are served.
func TestDNSRebindingRefusedOnEveryRoute(t *testing.T) {
	t.Parallel()
	s := &sink{}
	l, srv, _ := start(t, lapd.Config{AllowAnonymous: true, Demo: true, AuditSinks: []audit.Sink{s},
		Hosts: []string{"lapd.test"}, PublicURL: "https://public.example"})
	s.log = l.Audit()
	token, _ := mint(t, srv.URL)
	routes := []struct {
		method, path, body string
		hdr                []string
	}{
		{"POST", "/agent/mint", "{}", nil},
		{"GET", "/agent/ws", "", []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13",
			"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Authorization", "Bearer " + token}},
		{"POST", "/agent/lap/v1/observe", "{}", []string{"Authorization", "Bearer " + token}},
		{"POST", "/agent/mcp", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
			[]string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}},
		{"GET", "/agent/client.js", "", nil},
		{"GET", "/healthz", "", nil},
		{"GET", "/", "", nil},
		{"POST", "/demo/save", `{"tasks":[]}`, nil},
	}
	for _, rt := range routes {
		st, _, b := do(t, rt.method, srv.URL+rt.path, "evil.example:8787", rt.body, rt.hdr...)
		var env struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(b, &env)
		if st != http.StatusForbidden || env.Error.Code != "forbidden-host" {
			t.Errorf("%s %s with Host evil.example: %d %s", rt.method, rt.path, st, b)
		}
		refused := s.find(func(e audit.Entry) bool {
			return e.Event == audit.EventRefused && e.Detail["code"] == "forbidden-host" && e.Detail["endpoint"] == rt.path
		})
		if len(refused) != 1 || refused[0].Detail["host"] != "evil.example:8787" {
			t.Errorf("%s %s: refusal audited %d times: %v", rt.method, rt.path, len(refused), refused)
		}
	}
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "lapd.test:" + port, "public.example", "app.localhost:" + port} {
		if st, _, b := do(t, "POST", srv.URL+"/agent/mint", host, "{}"); st != 200 {
			t.Errorf("mint with Host %s: %d %s", host, st, b)
		}
	}
}

// A cross-site page could POST a form to the demo's /demo/save on the
// user's own localhost (no rebinding needed): a foreign Origin is refused.
func TestDemoSaveRefusesCrossSite(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{Demo: true})
	if st, _, b := do(t, "POST", srv.URL+"/demo/save", "", `{"tasks":[]}`, "Origin", "https://evil.example", "Content-Type", "text/plain"); st != http.StatusForbidden {
		t.Errorf("cross-site save: %d %s", st, b)
	}
	if st, _, b := do(t, "POST", srv.URL+"/demo/save", "", `{"tasks":[]}`, "Origin", srv.URL); st != 200 {
		t.Errorf("same-origin save: %d %s", st, b)
	}
}

// trickle opens a raw connection, sends the headers of a POST with a
// 100-byte body and its first byte, and returns the connection.
func trickle(t *testing.T, base, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	return c
}

// A body that trickles in is cut at the read deadline: the server answers
// (408) and lets go of the connection instead of holding it for as long as
// the client likes.
func TestTrickledBodyIsCut(t *testing.T) {
	t.Parallel()
	_, srv, _ := start(t, lapd.Config{AllowAnonymous: true, BodyReadTimeout: 200 * time.Millisecond})
	for _, path := range []string{"/agent/mint", "/agent/lap/v1/state", "/agent/mcp"} {
		c := trickle(t, srv.URL, path)
		// The failsafe only bounds a failing test; the server must answer long before.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("%s: no answer to a trickled body: %v", path, err)
			continue
		}
		res.Body.Close()
		if res.StatusCode < 400 || (path == "/agent/mint" && res.StatusCode != http.StatusRequestTimeout) {
			t.Errorf("%s: trickled body answered %d", path, res.StatusCode)
		}
	}
}
