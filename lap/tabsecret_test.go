package lap_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

// mintTab mints as lapd.js does ({"tab":true}) and pairs the tab with its
// tab secret.
func (e *env) mintTab(hdr ...string) (token, tid, tab string) {
	e.t.Helper()
	r := e.do("POST", "/agent/mint", "", `{"tab":true}`, hdr...)
	if r.status != 200 {
		e.t.Fatalf("mint: %d %s", r.status, r.body)
	}
	m := r.json(e.t)
	tab, _ = m["tabSecret"].(string)
	if !strings.HasPrefix(tab, "tab_") {
		e.t.Fatalf("mint {tab:true} returned no tab secret: %s", r.body)
	}
	return m["token"].(string), m["tid"].(string), tab
}

// proposeClear puts a clearAll (requires confirm) in front of the human and
// returns its confirmId once the server has recorded it.
func proposeClear(t *testing.T, e *env, token string) string {
	t.Helper()
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	id, _ := r.json(t)["confirmId"].(string)
	if id == "" {
		t.Fatalf("no proposal: %d %s", r.status, r.body)
	}
	waitPending(t, e, id)
	return id
}

// The agent token was also the tab's credential: the LLM side opened the
// WebSocket itself, superseded the real tab (4002) and approved its own
// proposal, and the supersede was not audited. A session minted with a tab
// secret now opens its socket only with that secret.
func TestLLMCannotTakeOverTheTab(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, secret := e.mintTab()
	real := e.dial(token, lapdtest.WithTabSecret(secret), lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	id := proposeClear(t, e, token)

	// The LLM side holds the token (it is in the connect line) but not the secret.
	for name, opts := range map[string][]lapdtest.Option{
		"token alone":        nil,
		"token in the query": {lapdtest.WithTokenInQuery()},
		"a made-up secret":   {lapdtest.WithTabSecret("tab_" + strings.Repeat("A", 43))},
	} {
		_, err := lapdtest.Dial(ctxT(t), e.srv.URL+"/agent/ws", token, opts...)
		var de *lapdtest.DialError
		if !errors.As(err, &de) || de.Status != 401 || !strings.Contains(string(de.Body), "tab secret") {
			t.Errorf("%s: the LLM side opened the tab's socket: %v", name, err)
		}
	}
	if real.Count("rpc") == 0 || !e.reg.IsPaired(tid) {
		t.Fatal("the real tab lost its socket")
	}
	select {
	case <-real.Done():
		t.Fatalf("the real tab was closed: %v", real.Err())
	default:
	}
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":1}`); !strings.Contains(string(r.body), "still-pending") {
		t.Errorf("the approval moved: %s", r.body)
	}
	// A reload of the real tab (same secret) supersedes, audited.
	again := e.dial(token, lapdtest.WithTabSecret(secret), lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	<-real.Done()
	if real.CloseStatus() != 4002 {
		t.Errorf("old socket closed with %d, want 4002", real.CloseStatus())
	}
	sup := auditFind(e.sink, func(en audit.Entry) bool { return en.Event == audit.EventSupersede && en.TID == tid })
	if len(sup) != 1 || sup[0].Detail["tabSecret"] != true || sup[0].Detail["approvals"] != true {
		t.Errorf("supersede audit: %+v", sup)
	}
	if _, err := again.WaitFor(ctxT(t), "confirm-sync"); err != nil {
		t.Fatal(err)
	}
	if err := again.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":5000}`); !strings.Contains(string(r.body), `"confirmed"`) {
		t.Errorf("the tab's own approval: %s", r.body)
	}
}

// A session minted without a tab secret (a reference client) still opens
// with the token alone; but a socket that supersedes a live one that way
// cannot approve, and the supersede is audited.
func TestLegacySupersederCannotApprove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid := e.mint()
	real := e.dial(token, lapdtest.WithTokenInQuery(), lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	id := proposeClear(t, e, token)
	llm := e.dial(token, lapdtest.WithTokenInQuery())
	<-real.Done()
	if real.CloseStatus() != 4002 {
		t.Fatalf("real tab closed with %d", real.CloseStatus())
	}
	sup := auditFind(e.sink, func(en audit.Entry) bool { return en.Event == audit.EventSupersede && en.TID == tid })
	if len(sup) != 1 || sup[0].Detail["tabSecret"] != false || sup[0].Detail["approvals"] != false {
		t.Errorf("supersede audit: %+v", sup)
	}
	if err := llm.Send(ctxT(t), map[string]any{"t": "confirm-resolved", "confirmId": id, "outcome": "confirmed"}); err != nil {
		t.Fatal(err)
	}
	auditWait(t, e.sink, func(en audit.Entry) bool {
		return en.Event == audit.EventRefused && en.Detail["code"] == "approval-refused"
	})
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":1}`); !strings.Contains(string(r.body), "still-pending") {
		t.Errorf("the superseder approved: %s", r.body)
	}
	if n := len(e.sink.events(audit.EventConfirmApproved)); n != 0 {
		t.Errorf("confirm-approved audited %d times", n)
	}
}

// Anonymous claim and revoke went by tid alone (uid "" matched everyone,
// the origin came from Host): anyone who read a tid in a log could revoke
// the session, or claim it and lock the page out.
func TestAnonymousClaimAndRevokeNeedProof(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, secret := e.mintTab()
	tab := e.dial(token, lapdtest.WithTabSecret(secret))
	if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`"}`); r.status != 404 {
		t.Fatalf("stranger's revoke by tid: %d %s", r.status, r.body)
	}
	tab.Close()
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	for name, body := range map[string]string{
		"tid alone":    `{"tid":"` + tid + `"}`,
		"agent token":  `{"tid":"` + tid + `","token":"` + token + `"}`,
		"wrong secret": `{"tid":"` + tid + `","tabSecret":"tab_` + strings.Repeat("B", 43) + `"}`,
	} {
		if r := e.do("POST", "/agent/resume/claim", "", body); r.status != 403 || r.code() != "revoked" {
			t.Errorf("claim with %s: %d %s", name, r.status, r.body)
		}
	}
	if rec, _ := e.tm.Get(ctxT(t), tid); rec.Status != tokens.StatusPendingResume {
		t.Fatalf("refused claims moved the record to %s", rec.Status)
	}
	r := e.do("POST", "/agent/resume/claim", "", `{"tid":"`+tid+`","tabSecret":"`+secret+`"}`)
	if r.status != 200 {
		t.Fatalf("claim with the tab secret: %d %s", r.status, r.body)
	}
	m := r.json(t)
	newTok, newSecret := m["token"].(string), m["tabSecret"].(string)
	if newTok == token || newSecret == secret || !strings.HasPrefix(newSecret, "tab_") {
		t.Fatalf("claim did not rotate both credentials: %s", r.body)
	}
	e.dial(newTok, lapdtest.WithTabSecret(newSecret))
	if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`","tabSecret":"`+secret+`"}`); r.status != 404 {
		t.Errorf("revoke with the rotated-away secret: %d", r.status)
	}
	if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`","tabSecret":"`+newSecret+`"}`); r.status != 200 {
		t.Errorf("revoke with the tab secret: %d %s", r.status, r.body)
	}

	// A reference client's session (no tab secret): its token is the proof.
	tok2, tid2 := e.mint()
	if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid2+`"}`); r.status != 404 {
		t.Errorf("legacy revoke by tid alone: %d", r.status)
	}
	if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid2+`","token":"`+tok2+`"}`); r.status != 200 {
		t.Errorf("legacy revoke with the token: %d %s", r.status, r.body)
	}
}

// The session is bound to the browser's Origin (the page that minted it),
// not to the Host header: a page of another (even allowed) origin cannot
// claim it.
func TestClaimBoundToPageOrigin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.CORSOrigins = []string{"https://app.example", "https://other.example"} })
	token, tid, secret := e.mintTab("Origin", "https://app.example")
	tab := e.dial(token, lapdtest.WithTabSecret(secret))
	tab.Close()
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	body := `{"tid":"` + tid + `","tabSecret":"` + secret + `"}`
	for _, o := range []string{"https://other.example", ""} {
		var hdr []string
		if o != "" {
			hdr = []string{"Origin", o}
		}
		if r := e.do("POST", "/agent/resume/claim", "", body, hdr...); r.status != 403 {
			t.Errorf("claim from %q: %d %s", o, r.status, r.body)
		}
	}
	if r := e.do("POST", "/agent/resume/claim", "", body, "Origin", "https://app.example"); r.status != 200 {
		t.Errorf("claim from the minting page: %d %s", r.status, r.body)
	}
	if en := e.sink.events(audit.EventMint); len(en) != 1 || en[0].Detail["origin"] != "https://app.example" {
		t.Errorf("mint audit origin: %+v", en)
	}
}

// auditWait waits until s has recorded an entry that matches (the tab's
// frames are handled on its reader goroutine, after the write returns).
func auditWait(t *testing.T, s *memSink, match func(audit.Entry) bool) audit.Entry {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if es := auditFind(s, match); len(es) > 0 {
			return es[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no matching audit entry")
		}
		time.Sleep(5 * time.Millisecond) // polling an eventually-recorded entry
	}
}
