package mcp

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// boardState is a board of n tasks, task k done when done[k].
func boardState(n int, filter string, done map[int]bool) string {
	var ts []string
	for i := 0; i < n; i++ {
		ts = append(ts, fmt.Sprintf(`{"id":%d,"title":"task number %d with a title of some length","done":%v}`, i+1, i+1, done[i]))
	}
	return `{"tasks":[` + strings.Join(ts, ",") + `],"filter":"` + filter + `"}`
}

// wait_for_change without a path answers with what changed since the model
// last saw the state: the diffs send_message showed it are not repeated, a
// user's change made before the wait began is included, and the next wait
// starts from this one's state.
func TestWaitForChangeDiff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":` + boardState(20, "all", nil) + `,"actions":[],"description":{"name":"Board"},"context":null,"health":{"connected":true}}`), nil
	})
	h.connect(tokA)
	h.lap.on("/message", func(int, fakeCall) (any, error) {
		return dispatched(`[{"op":"add","path":"/tasks/20","value":{"id":21,"title":"new","done":false}}]`, "[]"), nil
	})
	if out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "add"}}); out.IsError {
		t.Fatal(out.Text)
	}
	with21 := func(filter string, done map[int]bool) string {
		s := boardState(20, filter, done)
		return strings.Replace(s, `],"filter"`, `,{"id":21,"title":"new","done":false}],"filter"`, 1)
	}
	waits := []string{with21("done", map[int]bool{3: true}), with21("all", map[int]bool{3: true})}
	h.lap.on("/wait", func(n int, _ fakeCall) (any, error) {
		return json.RawMessage(`{"status":"changed","stateAfter":` + waits[n-1] + `}`), nil
	})
	out := h.call("wait_for_change", nil)
	if out.IsError || out.Text != `{"status":"changed","stateDiff":[{"op":"replace","path":"/filter","value":"done"},{"op":"replace","path":"/tasks/3/done","value":true}]}` {
		t.Fatalf("first wait: %s", out.Text)
	}
	out = h.call("wait_for_change", nil)
	if out.Text != `{"status":"changed","stateDiff":[{"op":"replace","path":"/filter","value":"all"}]}` {
		t.Fatalf("second wait: %s", out.Text)
	}
}

// The whole state when lapd does not know what the model saw (a state over
// maxViewBytes was never kept), and when it is not longer than the patch.
func TestWaitForChangeWhole(t *testing.T) {
	t.Parallel()
	big := boardState(1000, "all", nil) // > 64 KiB
	if len(big) <= maxViewBytes {
		t.Fatalf("state of %d bytes is not over the view limit", len(big))
	}
	h := newHarness(t, nil)
	h.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":` + big + `,"actions":[],"description":{"name":"Board"},"context":null,"health":{"connected":true}}`), nil
	})
	h.connect(tokA)
	after := boardState(1000, "done", nil)
	h.lap.on("/wait", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"status":"changed","stateAfter":` + after + `}`), nil
	})
	if out := h.call("wait_for_change", nil); out.SC["stateAfter"] == nil || out.SC["stateDiff"] != nil {
		t.Fatalf("unknown view: want stateAfter, got %.200s", out.Text)
	}

	h2 := newHarness(t, nil)
	h2.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":{"a":1},"actions":[],"description":{"name":"T"},"context":null,"health":{"connected":true}}`), nil
	})
	h2.connect(tokA)
	h2.lap.on("/wait", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"status":"changed","stateAfter":{"b":2}}`), nil
	})
	if out := h2.call("wait_for_change", nil); out.Text != `{"status":"changed","stateAfter":{"b":2}}` {
		t.Fatalf("short state: %s", out.Text)
	}

	// A state of at most 1 KiB comes whole, as LAP (and the reference)
	// answers, even where a patch would be shorter.
	small := boardState(6, "all", nil)
	if len(small) > stateBudget {
		t.Fatalf("state of %d bytes is not small", len(small))
	}
	h3 := newHarness(t, nil)
	h3.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":` + small + `,"actions":[],"description":{"name":"T"},"context":null,"health":{"connected":true}}`), nil
	})
	h3.connect(tokA)
	h3.lap.on("/wait", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"status":"changed","stateAfter":` + boardState(6, "all", map[int]bool{2: true}) + `}`), nil
	})
	if out := h3.call("wait_for_change", nil); out.SC["stateAfter"] == nil || out.SC["stateDiff"] != nil {
		t.Fatalf("small state: %s", out.Text)
	}
}

// viewDiff applies the shown patches and diffs like lapd.js's
// computeStateDiff (objects: removes first, then keys in order; arrays:
// shared prefix, removes from the end, then adds).
func TestViewDiff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		view  string
		ops   []string
		after string
		want  string
	}{
		{`{"a":1,"b":[1,2,3]}`, nil, `{"a":1,"b":[1,9]}`, `[{"op":"replace","path":"/b/1","value":9},{"op":"remove","path":"/b/2"}]`},
		{`{"z":1,"a/b":{"~":1}}`, nil, `{"a/b":{"~":2},"c":"<&>"}`, `[{"op":"remove","path":"/z"},{"op":"replace","path":"/a~1b/~0","value":2},{"op":"add","path":"/c","value":"<&>"}]`},
		{`{"l":[1]}`, []string{`[{"op":"add","path":"/l/1","value":2},{"op":"add","path":"/l/-","value":3}]`, `[{"op":"remove","path":"/l/0"}]`}, `{"l":[2,3,4]}`, `[{"op":"add","path":"/l/2","value":4}]`},
		{`{"n":1.0}`, nil, `{"n":1}`, `[]`},
		{`{"o":{"x":1}}`, nil, `{"o":[1]}`, `[{"op":"replace","path":"/o","value":[1]}]`},
		{`[1]`, []string{`[{"op":"replace","path":"","value":{"k":true}}]`}, `{"k":false}`, `[{"op":"replace","path":"/k","value":false}]`},
	} {
		ops := make([][]byte, len(tc.ops))
		for i, o := range tc.ops {
			ops[i] = []byte(o)
		}
		got, ok := viewDiff([]byte(tc.view), ops, []byte(tc.after))
		if !ok || string(got) != tc.want {
			t.Errorf("viewDiff(%s, %v, %s) = %s %v, want %s", tc.view, tc.ops, tc.after, got, ok, tc.want)
		}
	}
	for _, bad := range []string{`[{"op":"remove","path":"/nope"}]`, `[{"op":"move","from":"/a","path":"/b"}]`, `[{"op":"replace","path":"/a/5","value":1}]`, `not json`} {
		if _, ok := viewDiff([]byte(`{"a":[1]}`), [][]byte{[]byte(bad)}, []byte(`{}`)); ok {
			t.Errorf("a patch that does not apply (%s) gave a diff", bad)
		}
	}
}

// An approved action on a state over 1 KiB: the change since the model's
// last look, complete, instead of a stateAfter cut to 1 KiB — from
// send_message's approval wait and from get_confirm_result.
func TestConfirmedDiff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":` + boardState(30, "all", nil) + `,"actions":[],"description":{"name":"Board"},"context":null,"health":{"connected":true}}`), nil
	})
	h.connect(tokA)
	h.lap.on("/message", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"status":"confirmed","stateAfter":` + boardState(30, "all", map[int]bool{7: true}) + `}`), nil
	})
	out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "finish"}})
	if out.SC["stateAfter"] != nil || mcpJSON(out.SC["stateDiff"]) != `[{"op":"replace","path":"/tasks/7/done","value":true}]` || !strings.Contains(mcpStr(out.SC["next"]), "stateDiff") {
		t.Fatalf("confirmed in send_message: %s", out.Text)
	}
	h.lap.on("/confirm-result", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"status":"confirmed","stateAfter":` + boardState(30, "done", map[int]bool{7: true}) + `}`), nil
	})
	out = h.call("get_confirm_result", map[string]any{"confirmId": "c1"})
	if out.SC["stateAfter"] != nil || mcpJSON(out.SC["stateDiff"]) != `[{"op":"replace","path":"/filter","value":"done"}]` {
		t.Fatalf("get_confirm_result: %s", out.Text)
	}
}

func TestAppendOps(t *testing.T) {
	t.Parallel()
	ops, _ := patchOps([]byte(`[{"op":"add","path":"/a","value":1}]`))
	if got := string(appendOps([]byte(`[]`), ops)); got != `[{"op":"add","path":"/a","value":1}]` {
		t.Fatal(got)
	}
	if got := string(appendOps([]byte(`[{"op":"remove","path":"/b"}]`), ops)); got != `[{"op":"remove","path":"/b"},{"op":"add","path":"/a","value":1}]` {
		t.Fatal(got)
	}
}
