package lap

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
)

// The policy cache's budget (PolicyCacheBytes, --max-kept-mib's eighth)
// counts a compiled policy at 256 + schema.Policy.Footprint: that must
// cover what the heap holds for it, the cache's entry and the session's
// state included. The worst shape: every session sends a distinct policy
// (a realistic app's: five variants, one confirmed). Tabs of one app
// share one compiled policy, which holds far less than it is counted.
//
//	go test ./lap -run TestPolicySizesCoverTheHeap -v
func TestPolicySizesCoverTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles a thousand policies")
	}
	const n = 1000
	pc := newPolicyCache(1 << 30)
	ctx := t.Context()
	tid := func(i int) string { return fmt.Sprintf("6f1c2d3e-4b5a-4c6d-8e7f-%012d", i) }
	raws := make([]json.RawMessage, n)
	for i := range raws {
		raws[i] = json.RawMessage(fmt.Sprintf(`{"variants":{`+
			`"addTask":{"intent":"Add a task (%d)","schema":{"type":"object","properties":{"title":{"type":"string","minLength":1,"maxLength":200},"due":{"type":"string","format":"date"}},"required":["title"],"additionalProperties":false}},`+
			`"toggleTask":{"intent":"Mark a task done or not done","schema":{"type":"object","properties":{"id":{"type":"integer","minimum":0}},"required":["id"]}},`+
			`"renameTask":{"schema":{"type":"object","properties":{"id":{"type":"integer","minimum":0},"title":{"type":"string","minLength":1,"maxLength":200}},"required":["id","title"]}},`+
			`"deleteTask":{"intent":"Delete a task","requiresConfirm":true,"schema":{"type":"object","properties":{"id":{"type":"integer","minimum":0}},"required":["id"]}},`+
			`"setFilter":{"schema":{"type":"object","properties":{"filter":{"enum":["all","open","done"]}},"required":["filter"]}}}}`, i))
	}
	before := heapNow()
	for i, raw := range raws {
		if _, err := pc.get(ctx, tid(i), raw); err != nil {
			t.Fatal(err)
		}
	}
	after := heapNow()
	kept, bytes, _ := pc.stats()
	if kept != n {
		t.Fatalf("%d policies kept, want %d", kept, n)
	}
	held, counted := float64(after-before)/n, float64(bytes)/n
	t.Logf("%.0f B held per compiled policy (%d B of JSON), %.0f B counted", held, len(raws[0]), counted)
	if held > counted {
		t.Errorf("a compiled policy holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", held, counted, held/counted)
	}
	runtime.KeepAlive(pc)
	runtime.KeepAlive(raws)
}
