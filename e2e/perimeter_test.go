package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// lapStatus POSTs a LAP route and returns the status, the reconnect hint and
// the error code.
func lapStatus(t *testing.T, base, token, route string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/agent/lap/v1"+route, strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	b, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(b, &env)
	return res.StatusCode, res.Header.Get("X-LLui-Reconnect"), env.Error.Code
}

// After kill -9 the records of live tabs stayed "active": the LLM heard
// "reconnect pending" (Retry-After 5) until the token's 24 h TTL. Now the
// next process gives them a grace from its start-up: pending, then expired.
func TestKill9SessionsExpireAfterGrace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1 := startServer(t, dir)
	sess, err := lapdtest.Mint(ctxT(t, 20*time.Second), nil, s1.URL+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := sess.Pair(ctxT(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	if st, _, _ := lapStatus(t, s1.URL, sess.Token, "/actions"); st != 200 {
		t.Fatalf("first call: %d", st)
	}
	if err := s1.cmd.Process.Kill(); err != nil { // SIGKILL: nothing runs on the way out
		t.Fatal(err)
	}
	<-s1.done
	<-tab.Done()

	s2 := startServer(t, dir, "--grace", "1s")
	st, reconnect, code := lapStatus(t, s2.URL, sess.Token, "/state")
	if st != 503 || code != "paused" || reconnect != "pending" {
		t.Fatalf("right after the restart: %d %s %s, want 503 paused pending", st, code, reconnect)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, reconnect, code = lapStatus(t, s2.URL, sess.Token, "/state")
		if reconnect == "expired" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d %s %s 15 s after a 1 s grace", st, code, reconnect)
		}
		time.Sleep(100 * time.Millisecond) // the grace runs on the wall clock of the real binary
	}
	if !strings.Contains(s2.stderr.String(), "re-pair") {
		t.Errorf("the start-up did not say sessions wait to re-pair:\n%s", s2.stderr.String())
	}
	assertNoSecretsLogged(t, s1, s2)
}

var secretRE = regexp.MustCompile(`(agt|tab)_[A-Za-z0-9_-]{43}`)

// assertNoSecretsLogged checks that no token or tab secret reached a
// server's log (stderr, at debug level) or audit (stdout).
func assertNoSecretsLogged(t *testing.T, servers ...*server) {
	t.Helper()
	for _, s := range servers {
		if m := secretRE.FindString(s.stderr.String() + s.audit.String()); m != "" {
			t.Errorf("a secret reached the log or audit of %s: %s…", s.URL, m[:10])
		}
	}
}

// DNS rebinding against the real binary on its default flags: a page whose
// name resolves to 127.0.0.1 gets nothing, on any route, and each refusal
// is audited.
func TestRebindingRefusedByTheBinary(t *testing.T) {
	t.Parallel()
	s := startServer(t, "")
	port := s.URL[strings.LastIndex(s.URL, ":"):]
	for _, rt := range []struct{ method, path, body string }{
		{"POST", "/agent/mint", "{}"},
		{"GET", "/agent/ws", ""},
		{"POST", "/agent/lap/v1/observe", "{}"},
		{"POST", "/agent/mcp", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`},
		{"POST", "/demo/save", `{"tasks":[]}`},
		{"GET", "/", ""},
	} {
		req, _ := http.NewRequest(rt.method, s.URL+rt.path, strings.NewReader(rt.body))
		req.Host = "rebind.evil.example" + port
		req.Header.Set("Origin", "http://rebind.evil.example"+port)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 403 || !strings.Contains(string(b), "forbidden-host") {
			t.Errorf("%s %s: %d %s", rt.method, rt.path, res.StatusCode, b)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(s.audit.String(), `"forbidden-host"`) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("refusals not audited:\n%s", s.audit.String())
		}
		time.Sleep(50 * time.Millisecond) // the audit sink writes after the response
	}
	// The same requests by a loopback name are served.
	req, _ := http.NewRequest("POST", s.URL+"/agent/mint", strings.NewReader("{}"))
	req.Host = "localhost" + port
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("mint as localhost: %d", res.StatusCode)
	}
}
