package lap_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzLAPBodies sends arbitrary bytes to the LAP routes of a healthy tab: the
// handler must never panic nor answer 500.
func FuzzLAPBodies(f *testing.F) {
	for i, s := range []string{``, `null`, `{}`, `[]`, `{"msg":{"type":"inc"}}`, `{"msg":{"type":5}}`, `{"path":{}}`,
		`{"timeoutMs":-1}`, `{"timeoutMs":1e308}`, `{"n":"x","kind":3}`, `{"text":"hi","intent":[]}`, `{"confirmId":"x","timeoutMs":1}`,
		`{"msg":{"type":"inc"},"idempotencyKey":7}`, "\x00\xff", `{"name":"x","multiple":"yes"}`} {
		f.Add(s, uint8(i))
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, body string, which uint8) {
		routes := []string{"/message", "/state", "/wait", "/query-state", "/narrate", "/query-dom", "/recent-actions", "/would-dispatch", "/confirm-result"}
		route := routes[int(which)%len(routes)]
		e := fuzzEnv(t)
		req := httptest.NewRequest("POST", "/agent/lap/v1"+route, bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+e.token)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req = req.WithContext(ctx)
		w := httptest.NewRecorder()
		e.env.lap.Handler().ServeHTTP(w, req)
		if w.Code == http.StatusInternalServerError {
			t.Fatalf("%s %q: %d %s", route, body, w.Code, w.Body.Bytes())
		}
	})
}

type fuzzState struct {
	env   *env
	token string
}

func fuzzEnv(t *testing.T) fuzzState {
	e := newEnv(t, func(c *envCfg) { c.lap.LAPRate = 1e9; c.lap.LAPBurst = 1 << 30 })
	token, _, _ := e.paired()
	return fuzzState{e, token}
}
