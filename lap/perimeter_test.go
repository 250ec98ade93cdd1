package lap_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
)

// A full rate-limit table used to refuse every new key (429 for everyone
// once 100,000 distinct forwarded addresses had minted); now the least
// recently used key makes room.
func TestRateTableFullEvictsInsteadOfRefusing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.TrustProxy = 1; c.lap.MaxRateKeys = 8 })
	for i := range 20 {
		xff := fmt.Sprintf("198.51.100.%d", i)
		if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", xff); r.status != 200 {
			t.Fatalf("mint from %s with a full table: %d %s", xff, r.status, r.body)
		}
	}
	if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", "203.0.113.1"); r.status != 200 {
		t.Fatalf("a newcomer after the flood: %d %s", r.status, r.body)
	}
}

// One IPv6 subscriber holds a whole /64: its addresses share one bucket.
func TestMintRateGroupsIPv6By64(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.TrustProxy = 1; c.lap.MintBurst = 2; c.lap.MintRate = 0.0001 })
	for i, want := range []int{200, 200, 429} {
		xff := fmt.Sprintf("2001:db8:aa:bb::%x", i+1)
		if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", xff); r.status != want {
			t.Fatalf("mint %d from %s: %d %s, want %d", i, xff, r.status, r.body, want)
		}
	}
	if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", "2001:db8:aa:cc::1"); r.status != 200 {
		t.Fatalf("another /64: %d %s", r.status, r.body)
	}
}

// Small perimeter findings, each failing on the old code: a lower-case
// "bearer" scheme was refused on LAP (the WebSocket accepted it); GET reached
// LAP routes; a 401 had no WWW-Authenticate; malformed JSON on a route whose
// fields are all optional answered 200.
func TestLAPSmallPerimeter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, _ := e.paired()
	if r := e.do("POST", "/agent/lap/v1/state", "", "{}", "Authorization", "bearer "+token); r.status != 200 {
		t.Errorf("lower-case bearer: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/agent/lap/v1/state", "", "{}", "Authorization", "BEARER  "+token); r.status != 200 {
		t.Errorf("upper-case bearer: %d %s", r.status, r.body)
	}
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		r := e.do(m, "/agent/lap/v1/state", token, "")
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" || r.code() != "method-not-allowed" {
			t.Errorf("%s /state: %d %v %s", m, r.status, r.header, r.body)
		}
	}
	if n := len(auditFind(e.sink, func(en audit.Entry) bool { return en.Detail["code"] == "method-not-allowed" })); n != 3 {
		t.Errorf("405s audited %d times, want 3", n)
	}
	if r := e.lapCall("", "/state", "{}"); r.status != 401 || r.header.Get("WWW-Authenticate") != `Bearer realm="lapd"` {
		t.Errorf("no bearer: %d %q", r.status, r.header.Get("WWW-Authenticate"))
	}
	if r := e.lapCall("agt_nope", "/state", "{}"); r.status != 401 || r.header.Get("WWW-Authenticate") != `Bearer realm="lapd", error="invalid_token"` {
		t.Errorf("bad bearer: %d %q", r.status, r.header.Get("WWW-Authenticate"))
	}
	for _, body := range []string{"{", `{"path":`, "nul"} {
		if r := e.lapCall(token, "/state", body); r.status != 400 || r.code() != "invalid" {
			t.Errorf("/state %q: %d %s", body, r.status, r.body)
		}
	}
	for _, body := range []string{"", "{}", "null", "[]"} { // valid JSON that is not an object still reads as null
		if r := e.lapCall(token, "/state", body); r.status != 200 {
			t.Errorf("/state %q: %d %s", body, r.status, r.body)
		}
	}
	if r := e.do("POST", "/agent/mint", "", "{"); r.status != 400 || r.code() != "invalid" {
		t.Errorf("mint with malformed JSON: %d %s", r.status, r.body)
	}
	ws, res, err := websocket.Dial(ctxT(t), e.srv.URL+"/agent/ws", nil)
	if err == nil {
		ws.CloseNow()
		t.Fatal("WebSocket without a token accepted")
	}
	if res == nil || res.StatusCode != 401 || res.Header.Get("WWW-Authenticate") != `Bearer realm="lapd"` {
		t.Errorf("WS without token: %v %v", res, err)
	}
}

// auditFind returns the entries s recorded that match.
func auditFind(s *memSink, match func(audit.Entry) bool) []audit.Entry {
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
