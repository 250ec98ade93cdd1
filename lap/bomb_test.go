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
