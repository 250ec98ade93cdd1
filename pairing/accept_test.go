package pairing

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

func TestRefusedBeforeUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(_ *Config, tc *tokens.Config) { tc.Grace = -1 })
	ctx := context.Background()

	revoked, revokedTID := e.mint("u")
	if _, err := e.tm.Revoke(ctx, revokedTID, tokens.Owner{UID: "u"}); err != nil {
		t.Fatal(err)
	}
	graceGone, graceTID := e.mint("")
	e.pair(graceGone).ws.Close(websocket.StatusNormalClosure, "")
	if got := recv(t, e.closed); got != graceTID {
		t.Fatalf("closed %q", got)
	}
	good, _ := e.mint("")

	tests := []struct {
		name   string
		token  string
		header http.Header
		status int
		code   string
		tid    string
	}{
		{"missing token", "", nil, 401, "auth-failed", ""},
		{"unknown token", "agt_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", nil, 401, "auth-failed", ""},
		{"malformed token", "nope", nil, 401, "auth-failed", ""},
		{"revoked", revoked, nil, 403, "revoked", revokedTID},
		{"grace passed", graceGone, nil, 401, "auth-failed", graceTID},
		{"cross-origin", good, http.Header{"Origin": {"https://evil.example"}}, 403, "forbidden-origin", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.reg.Stats().RefusedUpgrades
			ws, resp, err := e.dialRaw(tc.token, dialOpts{header: tc.header})
			if err == nil {
				ws.CloseNow()
				t.Fatal("dial succeeded")
			}
			if resp == nil {
				t.Fatalf("no HTTP response: %v", err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (no upgrade must happen)", resp.StatusCode, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content-type %q", ct)
			}
			var body struct {
				Error struct{ Code, Detail string } `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil || body.Error.Code != tc.code {
				t.Fatalf("body %s, want code %q", raw, tc.code)
			}
			// Every refusal says what to do, not only what went wrong.
			if d := body.Error.Detail; len(d) < 40 || !strings.Contains(d, ";") && !strings.Contains(d, ":") {
				t.Errorf("detail %q does not say what to do", d)
			}
			if got := e.reg.Stats().RefusedUpgrades; got != before+1 {
				t.Errorf("RefusedUpgrades %d → %d", before, got)
			}
		})
	}
	refusals := e.sink.find(audit.EventRefused)
	if len(refusals) != len(tests) {
		t.Fatalf("%d refused audit entries, want %d", len(refusals), len(tests))
	}
	for i, a := range refusals {
		d := a.Detail
		if d["endpoint"] != "/agent/ws" || d["status"] != tests[i].status || d["code"] != tests[i].code || a.TID != tests[i].tid {
			t.Errorf("audit %d = %+v, want %+v", i, a, tests[i])
		}
	}
	// The refused tokens did not move: the good one still pairs.
	e.pair(good)
}

func TestOriginCheck(t *testing.T) {
	t.Parallel()
	direct := newEnv(t, func(c *Config, _ *tokens.Config) { c.AllowedOrigins = []string{"https://app.example"} })
	proxied := newEnv(t, func(c *Config, _ *tokens.Config) {
		c.AllowedOrigins = []string{"https://app.example"}
		c.TrustProxy = 1
		c.PublicURL = "https://lapd.example"
	})
	host := direct.srv.Listener.Addr().String()
	phost := proxied.srv.Listener.Addr().String()
	forwarded := http.Header{"Origin": {"https://public.example"}, "X-Forwarded-Proto": {"https, http"}, "X-Forwarded-Host": {"public.example"}}
	tests := []struct {
		name   string
		e      *env
		header http.Header
		ok     bool
	}{
		{"no origin", direct, nil, true},
		{"same origin", direct, http.Header{"Origin": {"http://" + host}}, true},
		{"allowlisted", direct, http.Header{"Origin": {"https://app.example"}}, true},
		// Without --trust-proxy a direct client could write X-Forwarded-* to
		// make any Origin look same-origin.
		{"forwarded without trusted proxy", direct, forwarded, false},
		{"forwarded same origin", proxied, forwarded, true},
		{"public url", proxied, http.Header{"Origin": {"https://lapd.example"}}, true},
		{"cross origin", direct, http.Header{"Origin": {"https://evil.example"}}, false},
		{"scheme mismatch", direct, http.Header{"Origin": {"https://" + host}}, false},
		{"forwarded host mismatch", proxied, http.Header{"Origin": {"http://" + phost}, "X-Forwarded-Host": {"public.example"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.e
			tok, _ := e.mint("")
			ws, resp, err := e.dialRaw(tok, dialOpts{header: tc.header})
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				ws.CloseNow()
				return
			}
			if err == nil {
				ws.CloseNow()
				t.Fatal("cross-site WebSocket accepted")
			}
			if resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Fatalf("resp %v err %v, want 403", resp, err)
			}
		})
	}
}

func TestTokenForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	t.Run("subprotocol", func(t *testing.T) {
		tok, _ := e.mint("")
		ws, _, err := e.dialRaw("", dialOpts{subprotocols: []string{Subprotocol, TokenProtocolPrefix + tok}})
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		if got := ws.Subprotocol(); got != Subprotocol {
			t.Fatalf("selected %q, want %q", got, Subprotocol)
		}
	})
	t.Run("bearer header", func(t *testing.T) {
		tok, _ := e.mint("")
		ws, _, err := e.dialRaw("", dialOpts{header: http.Header{"Authorization": {"Bearer " + tok}}})
		if err != nil {
			t.Fatal(err)
		}
		ws.CloseNow()
	})
	t.Run("query wins over header", func(t *testing.T) {
		tok, _ := e.mint("")
		ws, _, err := e.dialRaw(tok, dialOpts{header: http.Header{"Authorization": {"Bearer agt_wrong"}}})
		if err != nil {
			t.Fatal(err)
		}
		ws.CloseNow()
	})
	t.Run("plain GET is not an upgrade", func(t *testing.T) {
		tok, tid := e.mint("")
		resp, err := http.Get(e.srv.URL + "/agent/ws?token=" + tok)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d", resp.StatusCode)
		}
		rec, _ := e.tm.Get(context.Background(), tid)
		if rec.Status != tokens.StatusAwaitingWS {
			t.Fatalf("a plain GET moved the token to %s", rec.Status)
		}
	})
	t.Run("POST", func(t *testing.T) {
		resp, err := http.Post(e.srv.URL+"/agent/ws", "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
}
