package lap_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/tokens"
)

func cookieEnv(t *testing.T, mods ...func(*envCfg)) *env {
	ci, err := lap.NewCookieIdentity("sid", strings.Repeat("k", 32))
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, append([]func(*envCfg){func(c *envCfg) { c.lap.Identity = ci; c.noAnon = true }}, mods...)...)
}

func as(uid string) []string {
	return []string{"Cookie", "sid=" + lap.SignCookieValue(uid, strings.Repeat("k", 32))}
}

func TestMint(t *testing.T) {
	t.Parallel()
	e := cookieEnv(t, func(c *envCfg) { c.lap.MintBurst = 2; c.lap.MintRate = 0.0001 })
	if r := e.do("POST", "/agent/mint", "", ""); r.status != 401 || r.code() != "auth-required" {
		t.Errorf("anonymous: %d %s", r.status, r.body)
	}
	r := e.do("POST", "/agent/mint", "", "", as("alice")...)
	if r.status != 200 {
		t.Fatalf("mint: %d %s", r.status, r.body)
	}
	m := r.json(t)
	host := strings.TrimPrefix(e.srv.URL, "http://")
	if !strings.HasPrefix(m["token"].(string), "agt_") || m["tid"] == "" || m["wsUrl"] != "ws://"+host+"/agent/ws" ||
		m["lapUrl"] != e.srv.URL+"/agent/lap/v1" || m["lapVersion"] != float64(2) || m["expiresAt"].(float64) < 1e12 {
		t.Errorf("mint shape: %v", m)
	}
	_ = e.do("POST", "/agent/mint", "", "", as("alice")...)
	r = e.do("POST", "/agent/mint", "", "", as("alice")...)
	if r.status != 429 || r.code() != "rate-limited" || r.header.Get("Retry-After") == "" {
		t.Errorf("third mint: %d %v %s", r.status, r.header, r.body)
	}
	if r := e.do("POST", "/agent/mint", "", "", as("bob")...); r.status != 200 {
		t.Errorf("bob has his own bucket: %d", r.status)
	}
	if len(e.sink.events(audit.EventMint)) != 3 || len(e.sink.events(audit.EventRateLimited)) != 1 {
		t.Errorf("audit mint=%d rate=%d", len(e.sink.events(audit.EventMint)), len(e.sink.events(audit.EventRateLimited)))
	}
}

func TestMintBehindProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.TrustProxy = 1 })
	r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "app.example.com")
	m := r.json(t)
	if m["wsUrl"] != "wss://app.example.com/agent/ws" || m["lapUrl"] != "https://app.example.com/agent/lap/v1" {
		t.Errorf("proxied urls: %v", m)
	}
	e2 := newEnv(t)
	m = e2.do("POST", "/agent/mint", "", "", "X-Forwarded-Host", "evil.example").json(t)
	if strings.Contains(m["wsUrl"].(string), "evil") {
		t.Errorf("untrusted X-Forwarded-Host used: %v", m)
	}
}

func TestResumeAndClaim(t *testing.T) {
	t.Parallel()
	e := cookieEnv(t)
	r := e.do("POST", "/agent/mint", "", "", as("alice")...)
	m := r.json(t)
	token, tid := m["token"].(string), m["tid"].(string)
	tab := e.dial(token)
	if r := e.lapCall(token, "/actions", ""); r.status != 200 {
		t.Fatal(r.status)
	}
	if r := e.do("POST", "/agent/resume/claim", "", `{"tid":"`+tid+`"}`, as("alice")...); r.status != 403 {
		t.Errorf("claim while active: %d %s", r.status, r.body)
	}
	tab.Close()
	waitStatus(t, e, tid, tokens.StatusPendingResume)

	if r := e.do("POST", "/agent/resume/list", "", `{"tids":"x"}`, as("alice")...); r.status != 400 {
		t.Errorf("list bad tids: %d", r.status)
	}
	r = e.do("POST", "/agent/resume/list", "", `{"tids":["`+tid+`","other"]}`, as("alice")...)
	if r.status != 200 || !strings.Contains(string(r.body), tid) || !strings.Contains(string(r.body), `"status":"pending-resume"`) {
		t.Errorf("list: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/agent/resume/list", "", `{"tids":["`+tid+`"]}`, as("mallory")...); strings.Contains(string(r.body), tid) {
		t.Errorf("other uid sees the session: %s", r.body)
	}
	if r := e.do("POST", "/agent/resume/claim", "", `{"tid":"`+tid+`"}`, as("mallory")...); r.status != 403 || r.code() != "revoked" {
		t.Errorf("claim by another uid: %d %s", r.status, r.body)
	}
	r = e.do("POST", "/agent/resume/claim", "", `{"tid":"`+tid+`"}`, as("alice")...)
	if r.status != 200 {
		t.Fatalf("claim: %d %s", r.status, r.body)
	}
	newTok := r.json(t)["token"].(string)
	if newTok == token {
		t.Fatal("token not rotated")
	}
	if r := e.lapCall(token, "/actions", ""); r.status != 401 {
		t.Errorf("old bearer after claim: %d", r.status)
	}
	e.dial(newTok)
	if r := e.lapCall(newTok, "/actions", ""); r.status != 200 {
		t.Errorf("new bearer: %d %s", r.status, r.body)
	}
	if len(e.sink.events(audit.EventClaim)) == 0 {
		t.Error("claim not audited")
	}
}

func TestRevoke(t *testing.T) {
	t.Parallel()
	e := cookieEnv(t)
	m := e.do("POST", "/agent/mint", "", "", as("alice")...).json(t)
	token, tid := m["token"].(string), m["tid"].(string)
	tab := e.dial(token)
	if r := e.lapCall(token, "/actions", ""); r.status != 200 { // activates: sessions lists active records
		t.Fatal(r.status)
	}
	if r := e.do("GET", "/agent/sessions", "", "", as("alice")...); !strings.Contains(string(r.body), tid) {
		t.Errorf("sessions: %s", r.body)
	}
	if r := e.do("GET", "/agent/sessions", "", ""); string(r.body) != `{"sessions":[]}` {
		t.Errorf("anonymous sessions: %s", r.body)
	}
	// Someone else's session and an unknown tid answer alike: 404 with a
	// sentence that says nothing was revoked (the reference's 403 revoked
	// reads like success).
	for who, tid := range map[string]string{"bob": tid, "alice": "no-such-tid"} {
		r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`"}`, as(who)...)
		detail, _ := r.json(t)["error"].(map[string]any)["detail"].(string)
		if r.status != 404 || r.code() != "not-found" || !strings.Contains(detail, "nothing was revoked") || !strings.Contains(detail, `"`+tid+`"`) {
			t.Errorf("revoke %s by %s: %d %s", tid, who, r.status, r.body)
		}
	}
	if r := e.do("POST", "/agent/revoke", "", `{}`, as("alice")...); r.status != 400 {
		t.Errorf("revoke without tid: %d", r.status)
	}
	r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`"}`, as("alice")...)
	if r.status != 200 || string(r.body) != `{"status":"revoked"}` {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if _, err := tab.WaitFor(ctxT(t), "revoked"); err != nil {
		t.Errorf("tab not told: %v", err)
	}
	<-tab.Done()
	if r := e.lapCall(token, "/actions", ""); r.status != 403 || r.code() != "revoked" || !strings.Contains(string(r.body), "new connect line") {
		t.Errorf("LAP after revoke: want 403 revoked saying what to do, got %d %s", r.status, r.body)
	}
	if len(e.sink.events(audit.EventRevoke)) != 1 {
		t.Error("revoke not audited")
	}
}

func TestCORS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.CORSOrigins = []string{"https://app.example.com"} })
	r := e.do("OPTIONS", "/agent/mint", "", "", "Origin", "https://app.example.com", "Access-Control-Request-Method", "POST")
	if r.status != 204 || r.header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		r.header.Get("Access-Control-Allow-Credentials") != "true" || !strings.Contains(r.header.Get("Vary"), "Origin") ||
		!strings.Contains(r.header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Errorf("preflight: %d %v", r.status, r.header)
	}
	r = e.do("POST", "/agent/mint", "", "", "Origin", "https://app.example.com")
	if r.status != 200 || r.header.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Errorf("allowed mint: %d %v", r.status, r.header)
	}
	r = e.do("POST", "/agent/mint", "", "", "Origin", "https://evil.example")
	if r.status != 403 || r.code() != "forbidden-origin" || r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("evil origin: %d %v %s", r.status, r.header, r.body)
	}
	if r := e.do("POST", "/agent/mint", "", "", "Origin", e.srv.URL); r.status != 200 {
		t.Errorf("same origin: %d", r.status)
	}
	_ = http.MethodPost
}

// Behind a proxy lapd's own origin is PublicURL: a page opened on a node's
// own address may not mint, and the refusal names the origin that may.
func TestMintRefusalNamesPublicOrigin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.PublicURL = "https://lapd.example.com" })
	r := e.do("POST", "/agent/mint", "", "", "Origin", e.srv.URL)
	if r.status != 403 || r.code() != "forbidden-origin" {
		t.Fatalf("mint from the node's own address behind a public URL: %d %s, want 403 forbidden-origin", r.status, r.body)
	}
	if want := `lapd's own origin, "https://lapd.example.com",`; !strings.Contains(r.detail(), want) {
		t.Errorf("detail %q does not name lapd's own origin (%s)", r.detail(), want)
	}
	if r := e.do("POST", "/agent/mint", "", "", "Origin", "https://lapd.example.com"); r.status != 200 {
		t.Errorf("mint from the public origin: %d %s", r.status, r.body)
	}
}
