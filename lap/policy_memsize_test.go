package lap

import (
	"encoding/json"
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/pairing"
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
	before := heaptest.Live()
	for i, raw := range raws {
		if _, err := pc.get(ctx, tid(i), raw); err != nil {
			t.Fatal(err)
		}
	}
	after := heaptest.Live()
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

// The /describe cache keeps the encoded description per tid. Tabs of one
// app send the same hello, so their descriptions are one shared copy: what
// a tid holds beyond it must stay small (it was a copy of the whole
// description, ~1.5 KB here, uncounted: 10,000 observing tabs of a
// Taskboard-size app held tens of MB).
//
//	go test ./lap -run TestDescribeCacheShares -v
func TestDescribeCacheShares(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MBs")
	}
	const n = 10000
	h := pairing.Hello{AppName: "Taskboard", AppVersion: "1.4.2", SchemaHash: "sha256:" + strings.Repeat("ab", 32),
		MsgSchema:   json.RawMessage(`{"discriminant":"type","variants":{"addTask":{"title":"string"},"toggleTask":{"id":"number"},"deleteTask":{"id":"number"}}}`),
		StateSchema: json.RawMessage(`{"type":"object","properties":{"tasks":{"type":"array","items":{"type":"object"}}}}`),
		Docs:        json.RawMessage(`"` + strings.Repeat("A board of tasks. ", 60) + `"`)}
	var d descCache
	tid := func(i int) string { return fmt.Sprintf("6f1c2d3e-4b5a-4c6d-8e7f-%012d", i) }
	tids := make([]string, n)
	for i := range tids {
		tids[i] = tid(i)
	}
	before := heaptest.Live()
	var enc []byte
	for _, id := range tids {
		enc = d.get(id, h)
	}
	after := heaptest.Live()
	held := float64(after-before) / n
	t.Logf("%.0f B held per tid for a %d-byte description shared by %d tabs", held, len(enc), n)
	if held > 384 {
		t.Errorf("each tid holds %.0f B for the same description (%d bytes): it is not shared", held, len(enc))
	}
	h2 := h
	h2.AppVersion = "1.4.3"
	d.get(tids[0], h2) // a new hello releases the tid's hold on the old description
	if len(d.shared) != 2 || d.shared[d.m[tids[1]].key].refs != n-1 {
		t.Errorf("after one tab's new hello: %d shared descriptions, want 2 (the old one held by %d tabs)", len(d.shared), n-1)
	}
	for _, id := range tids {
		d.drop(id)
	}
	if len(d.m) != 0 || len(d.shared) != 0 {
		t.Errorf("after drop: %d entries, %d shared descriptions", len(d.m), len(d.shared))
	}
	runtime.KeepAlive(tids)
}
