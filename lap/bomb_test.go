package lap_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/lapd-dev/lapd/lapdtest"
)

// The review's hint bomb over the wire: k required properties that each
// $ref the root, sent as hello.policy, then 8 concurrent /message calls.
// Each used to compile the policy and expand its hint ~k^8 times (k=7:
// 1.2 GB; 8 calls: 3 GB). Now the policy is compiled once, without
// expanding the hint, and every call is answered.
func TestPolicyHintBombOverTheWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var props, req []string
	for i := range 8 {
		props = append(props, fmt.Sprintf(`"p%d":{"$ref":"#"}`, i))
		req = append(req, fmt.Sprintf(`"p%d"`, i))
	}
	pol := `{"variants":{"inc":{"schema":{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]}}}}`
	token, _, _ := e.paired(lapdtest.WithPolicy(json.RawMessage(pol)))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.lapCall(token, "/message", `{"msg":{"type":"inc"}}`)
			if r.status != 200 || !strings.Contains(string(r.body), `"schema-error"`) {
				t.Errorf("/message: %d %.200s", r.status, r.body)
			}
		}()
	}
	wg.Wait()
}

// The review's number bomb over the wire: a msg of 500 × 1e1000000 (5 KB)
// against {"type":"integer"} items took 7.7 s of server CPU (the validator
// reads each with big.Rat) and was dispatched; a 990 KB body, ~25 CPU
// minutes. It is now refused as a schema-error before the validator runs,
// on /message and /would-dispatch, and the tab sees nothing.
func TestNumberBombRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pol := `{"variants":{"setScores":{"schema":{"type":"object","properties":{"scores":{"type":"array","items":{"type":"integer"}}}}}}}`
	setScores := lapdtest.Reducer(func(state any, msg map[string]any) (any, error) {
		return map[string]any{"scores": msg["scores"]}, nil
	})
	token, _, tab := e.paired(lapdtest.WithPolicy(json.RawMessage(pol)), lapdtest.WithState(map[string]any{"scores": []any{}}), lapdtest.WithReducer(setScores),
		lapdtest.WithActions(lapdtest.Action{Variant: "setScores"}))
	bomb := `{"msg":{"type":"setScores","scores":[` + strings.TrimSuffix(strings.Repeat("1e1000000,", 500), ",") + `]}}`
	for route, reason := range map[string]string{"/message": "schema-error", "/would-dispatch": "schema-mismatch"} {
		r := e.lapCall(token, route, bomb)
		m := r.json(t)
		errs, _ := m["errors"].([]any)
		if r.status != 200 || m["status"] != "rejected" || m["reason"] != reason || len(errs) == 0 ||
			!strings.Contains(fmt.Sprint(m["detail"]), "numbers must fit a 64-bit float (|exponent| ≤ 400, ≤ 64 characters)") {
			t.Errorf("%s: %d %.300s, want rejected/%s with the number bound", route, r.status, r.body, reason)
		}
	}
	if n := tab.RPCCount("send_message") + tab.RPCCount("would_dispatch"); n != 0 {
		t.Errorf("%d rpc frames reached the tab", n)
	}
	if got := fmt.Sprint(tab.State()); got != "map[scores:[]]" {
		t.Errorf("tab state = %s, want it unchanged", got)
	}
	// Ordinary numbers still go through.
	if r := e.lapCall(token, "/message", `{"msg":{"type":"setScores","scores":[1,2e300]}}`); !strings.Contains(string(r.body), `"dispatched"`) {
		t.Errorf("ordinary scores: %d %s", r.status, r.body)
	}
}

// A hello.policy whose keywords hold ±1e1000000 (100 subschemas, 7 KB:
// 6.3 s in the one compile slot, 120 MB kept) is refused before it is
// compiled, as other policies over lapd's limits are.
func TestNumberBombPolicyRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var subs []string
	for i := range 100 {
		subs = append(subs, fmt.Sprintf(`"p%d":{"minimum":-1e1000000,"maximum":1e1000000,"multipleOf":1e-1000000}`, i))
	}
	pol := `{"variants":{"v":{"schema":{"properties":{` + strings.Join(subs, ",") + `}}}}}`
	token, _, tab := e.paired(lapdtest.WithPolicy(json.RawMessage(pol)))
	r := e.lapCall(token, "/message", `{"msg":{"type":"v"}}`)
	if r.status != 500 || r.code() != "schema-error" || !strings.Contains(string(r.body), "invalid hello.policy") ||
		!strings.Contains(string(r.body), "numbers must fit a 64-bit float") {
		t.Errorf("/message: %d %.300s, want the policy refused for its numbers", r.status, r.body)
	}
	if n := tab.RPCCount("send_message"); n != 0 {
		t.Errorf("%d send_message frames reached the tab", n)
	}
}
