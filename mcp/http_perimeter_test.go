package mcp

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// The DNS-rebinding refusal on /agent/mcp was mcp-go's plain-text 403 and
// not audited: it is now the JSON envelope, audited, and a configured host
// (e.g. the public URL's, behind a proxy on the same machine) is served.
func TestHTTPHostRefusalIsJSONAndAudited(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.AllowedHosts = []string{"lapd.example.com"} })
	req, _ := http.NewRequest(http.MethodPost, hh.srv.URL, strings.NewReader(initBody))
	req.Host = "evil.example"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	if res.StatusCode != http.StatusForbidden || json.Unmarshal(b, &env) != nil || env.Error.Code != "forbidden-host" ||
		!strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("rebinding refusal: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	if !hh.audit.has(audit.EventRefused, "code", "forbidden-host") {
		t.Fatal("host refusal not audited")
	}
	if r := hh.raw(http.MethodPost, "", initBody, map[string]string{"Host": "lapd.example.com"}); r.StatusCode != http.StatusOK {
		t.Fatalf("configured host: %d", r.StatusCode)
	}
}

// rawFrom is hh.raw from a client IP (the harness trusts one proxy).
func (hh *httpHarness) rawFrom(ip, sessionID, body string) *http.Response {
	hh.t.Helper()
	return hh.raw(http.MethodPost, sessionID, body, map[string]string{"X-Forwarded-For": ip})
}

// openConnected initializes a session from ip and connects it with token.
func (hh *httpHarness) openConnected(ip, token string) string {
	hh.t.Helper()
	r := hh.rawFrom(ip, "", initBody)
	if r.StatusCode != http.StatusOK {
		hh.t.Fatalf("initialize from %s: %d", ip, r.StatusCode)
	}
	id := r.Header.Get("Mcp-Session-Id")
	call := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"` + token + `"}}}`
	if r := hh.rawFrom(ip, id, call); r.StatusCode != http.StatusOK {
		hh.t.Fatalf("connect_session from %s: %d", ip, r.StatusCode)
	}
	return id
}

func (hh *httpHarness) alive(ip, id string) bool {
	hh.t.Helper()
	return hh.rawFrom(ip, id, listBody).StatusCode == http.StatusOK
}

func token(i int) string {
	return "agt_" + strings.Repeat(string(rune('a'+i%26)), 42) + string(rune('A'+i/26))
}

// One client used to take every MCP session: connected sessions were never
// evicted, so one IP with 8 anonymous tokens filled all 64 and everyone
// else got 503 for 30 minutes. Now an IP holds at most MaxSessionsPerIP,
// pays for more with its own sessions, and a newcomer from elsewhere always
// gets a slot.
func TestHTTPOneIPCannotTakeEverySession(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) {
		c.MaxSessions, c.MaxSessionsPerIP, c.TrustProxy = 8, 4, 1
		c.CreateRate, c.CreateBurst = 1000, 1000
	})
	const attacker, alice, bob = "198.51.100.1", "203.0.113.5", "2001:db8:1:2::7"
	var mine []string
	for i := range 8 {
		mine = append(mine, hh.openConnected(attacker, token(i)))
	}
	held := 0
	for _, id := range mine {
		if hh.alive(attacker, id) {
			held++
		}
	}
	if held != 4 {
		t.Fatalf("the attacker holds %d sessions, want its cap of 4", held)
	}
	a := hh.openConnected(alice, token(100))
	b := hh.openConnected(bob, token(101))
	for i := 8; i < 24; i++ { // the attacker keeps going
		hh.openConnected(attacker, token(i))
	}
	// another address in bob's /64 counts as bob
	b2 := hh.openConnected("2001:db8:1:2::8", token(102))
	if !hh.alive(alice, a) || !hh.alive(bob, b) || !hh.alive(bob, b2) {
		t.Fatalf("newcomers lost their sessions: alice %v bob %v %v", hh.alive(alice, a), hh.alive(bob, b), hh.alive(bob, b2))
	}
	if n := hh.h.Sessions(); n > 8 {
		t.Fatalf("%d sessions in a table of 8", n)
	}
	if hh.audit.has(audit.EventRateLimited, "reason", "session-capacity") {
		t.Fatal("someone was refused for capacity")
	}
}

// On a loopback install every client shares one IP: the cap per IP does
// not apply there, and the biggest token's sessions go first, so one
// token's flood does not evict another token's session.
func TestHTTPSameIPBiggestTokenFirst(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) {
		c.MaxSessions, c.MaxSessionsPerIP, c.MaxSessionsPerToken = 6, 2, 6
		c.CreateRate, c.CreateBurst = 1000, 1000
	})
	const ip = "127.0.0.1"
	victim := hh.openConnected(ip, tokB)
	for range 20 {
		hh.openConnected(ip, tokA)
	}
	if !hh.alive(ip, victim) {
		t.Fatal("one token's flood evicted another token's only session")
	}
	// The cap per IP does not shrink the table for everyone on the machine.
	if n := hh.h.Sessions(); n != 6 {
		t.Fatalf("%d sessions from loopback, want the whole table (6)", n)
	}
}
