package mcp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func keys(ms []member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.key)
	}
	return out
}

func TestMembersAndElements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		keys []string
		ok   bool
	}{
		{`{}`, nil, true},
		{` { "a" : 1 , "b":[1,{"c":"}"}], "d\"e":"x\"}"} `, []string{"a", "b", `d"e`}, true},
		{`{"a":{"b":{"c":[[]]}},"z":null}`, []string{"a", "z"}, true},
		{`{"é\u00e9":true}`, []string{"éé"}, true},
		{`[1]`, nil, false},
		{`{"a":1`, nil, false},
		{`{"a" 1}`, nil, false},
		{`{"a":1} x`, nil, false},
		{`{"a":"unterminated}`, nil, false},
		{``, nil, false},
	} {
		ms, ok := members([]byte(tc.in))
		if ok != tc.ok || !slices.Equal(keys(ms), tc.keys) {
			t.Errorf("members(%s) = %v %v, want %v %v", tc.in, keys(ms), ok, tc.keys, tc.ok)
		}
	}
	es, ok := elements([]byte(` [1, "a,]", {"b":[2]} ,null] `))
	if !ok || len(es) != 4 || string(es[1]) != `"a,]"` || string(es[2]) != `{"b":[2]}` {
		t.Fatalf("elements: %q %v", es, ok)
	}
	if _, ok := elements([]byte(`[1,]`)); ok {
		t.Fatal("elements accepted [1,]")
	}
}

// FuzzMembers: the scanner never panics, and on every JSON object it agrees
// with encoding/json about the members and their values.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":[{"c":"\"}"}]}`, `{"a":"\u00e9","b":-1.5e3,"c":true,"d":null}`, `[1,2]`, `{"a":`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, ok := members(b)
		_, _ = elements(b)
		var want map[string]json.RawMessage
		if json.Unmarshal(b, &want) != nil || want == nil {
			return
		}
		if !ok {
			t.Fatalf("members refused the object %q", b)
		}
		for _, m := range ms {
			w, found := want[m.key]
			if !found {
				t.Fatalf("key %q not in %q", m.key, b)
			}
			if !json.Valid(m.val) {
				t.Fatalf("value of %q is not JSON: %q", m.key, m.val)
			}
			// the last duplicate wins in encoding/json
			if string(compactJSON(lastVal(ms, m.key))) != string(compactJSON(w)) {
				t.Fatalf("value of %q: %q, encoding/json says %q", m.key, lastVal(ms, m.key), w)
			}
		}
	})
}

func lastVal(ms []member, k string) []byte {
	var v []byte
	for _, m := range ms {
		if m.key == k {
			v = m.val
		}
	}
	return v
}

func compactJSON(b []byte) []byte {
	var v any
	_ = json.Unmarshal(b, &v)
	out, _ := json.Marshal(v)
	return out
}

// taskboardMessages is description.messages as lapd.js builds it for the demo.
const taskboardMessages = `{"discriminant":"type","variants":{"addTask":{"title":{"type":"string","hint":"Short task title"},"column":{"type":{"enum":["todo","doing","done"]},"optional":true,"hint":"Board column"}},"toggleDone":{"id":{"type":"number","hint":"Task id (see /tasks in the state)"}},"setFilter":{"filter":{"enum":["all","active","done"]}},"tag":{"labels":{"kind":"array","element":{"enum":["a","b"]}},"meta":{"type":{"kind":"object","shape":{"x-y":"boolean"}},"optional":true}},"save":{},"clearAll":{}}}`

func TestPayloadSigs(t *testing.T) {
	t.Parallel()
	sigs := payloadSigs([]byte(taskboardMessages))
	want := map[string]string{
		"addTask":    "{title: string /* Short task title */, column?: 'todo'|'doing'|'done' /* Board column */}",
		"toggleDone": "{id: number /* Task id (see /tasks in the state) */}",
		"setFilter":  "{filter: 'all'|'active'|'done'}",
		"tag":        `{labels: ('a'|'b')[], meta?: {"x-y": boolean}}`,
	}
	if len(sigs) != len(want) {
		t.Fatalf("sigs %v", sigs)
	}
	for k, v := range want {
		if sigs[k] != v {
			t.Errorf("%s: %q, want %q", k, sigs[k], v)
		}
	}
}

// A lapd.js action entry, as /observe returns it.
const addTaskEntry = `{"variant":"addTask","intent":"Add a task","requiresConfirm":false,"dispatchMode":"shared","source":"always-affordable","selectorHint":null,"payloadHint":{"type":"addTask","title":"…"},"warning":null,"examples":[{"type":"addTask","title":"Buy milk"}],"emits":[],"fieldHints":[{"path":"title","hint":"Short task title"}]}`

func TestLeanEntry(t *testing.T) {
	t.Parallel()
	sigs := payloadSigs([]byte(taskboardMessages))
	for _, tc := range []struct{ in, want string }{
		// defaults, nulls and empties dropped; the signature replaces payloadHint and fieldHints
		{addTaskEntry, `{"variant":"addTask","intent":"Add a task","payload":"{title: string /* Short task title */, column?: 'todo'|'doing'|'done' /* Board column */}","examples":[{"type":"addTask","title":"Buy milk"}]}`},
		// no signature: the hints stay, a bare {"type"} hint goes
		{`{"variant":"x","intent":null,"payloadHint":{"type":"x","n":1},"fieldHints":[{"path":"n","hint":"N"}]}`, `{"variant":"x","payloadHint":{"type":"x","n":1},"fieldHints":[{"path":"n","hint":"N"}]}`},
		{`{"variant":"save","payloadHint":{"type":"save"},"fieldHints":[]}`, `{"variant":"save"}`},
		// what is not default stays; availability is one field
		{`{"variant":"clearAll","requiresConfirm":true,"dispatchMode":"agent-only","warning":"W","available":false,"unavailableReason":"the board is empty","custom":{"k":1}}`,
			`{"variant":"clearAll","requiresConfirm":true,"dispatchMode":"agent-only","warning":"W","custom":{"k":1},"unavailable":"the board is empty"}`},
		{`{"variant":"y","available":false}`, `{"variant":"y","unavailable":"not available right now"}`},
	} {
		a, ok := leanEntry([]byte(tc.in), sigs)
		if !ok || string(a.enc) != tc.want {
			t.Errorf("leanEntry(%s)\n got %s\nwant %s", tc.in, a.enc, tc.want)
		}
	}
	if _, ok := leanEntry([]byte(`{"intent":"no variant"}`), nil); ok {
		t.Error("an entry without variant was accepted")
	}
}

func leanList(t *testing.T, raw string) []leanAction {
	t.Helper()
	as, ok := leanActionList([]byte(raw), nil)
	if !ok {
		t.Fatalf("leanActionList(%s)", raw)
	}
	return as
}

func TestActionsDelta(t *testing.T) {
	t.Parallel()
	shown := leanList(t, `[{"variant":"a","intent":"A"},{"variant":"b","intent":"B","warning":"careful"},{"variant":"c"}]`)
	if d := actionsDelta(shown, leanList(t, `[{"variant":"a","intent":"A","source":"x","emits":[]},{"variant":"b","intent":"B","warning":"careful"},{"variant":"c"}]`)); d != nil {
		t.Fatalf("unchanged (only dropped fields differ) gave %s", d)
	}
	cur := leanList(t, `[{"variant":"a","intent":"A","available":false,"unavailableReason":"empty"},{"variant":"b","intent":"B2"},{"variant":"d","intent":"D"}]`)
	want := `[{"variant":"a","unavailable":"empty"},{"variant":"b","intent":"B2","warning":null},{"variant":"d","intent":"D"},{"variant":"c","removed":true}]`
	if d := actionsDelta(shown, cur); string(d) != want {
		t.Fatalf("delta\n got %s\nwant %s", d, want)
	}
	// back to available: a merge patch removes the field
	if d := actionsDelta(cur[:1], leanList(t, `[{"variant":"a","intent":"A"}]`)); string(d) != `[{"variant":"a","unavailable":null}]` {
		t.Fatalf("back to available: %s", d)
	}
}

func TestBudgetState(t *testing.T) {
	t.Parallel()
	small := `{"a":1}`
	if k, om := budgetState([]byte(small), 100); string(k) != small || om != nil {
		t.Fatalf("small state: %s %s", k, om)
	}
	big := `{"tasks":[` + strings.Repeat(`{"id":1,"title":"x"},`, 49) + `{"id":1,"title":"x"}],"notes":"` + strings.Repeat("n", 300) + `","nextId":51,"a/b":[1]}`
	k, om := budgetState([]byte(big), 200)
	if string(k) != `{"nextId":51,"a/b":[1]}` || string(om) != `{"/tasks":"50 items, 1.0 KB","/notes":"302 B"}` {
		t.Fatalf("big state:\n kept %s\n omitted %s", k, om)
	}
	if k, om := budgetState([]byte(`[`+strings.Repeat(`1,`, 200)+`1]`), 100); k != nil || string(om) != `{"":"201 items, 403 B"}` {
		t.Fatalf("array state: %s %s", k, om)
	}
}

func ops(t *testing.T, s string) []patchOp {
	t.Helper()
	p, ok := patchOps([]byte(s))
	if !ok {
		t.Fatalf("patchOps(%s)", s)
	}
	return p
}

func TestSquashPatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`[{"op":"add","path":"/t/3","value":1},{"op":"replace","path":"/n","value":5},{"op":"add","path":"/t/4","value":2},{"op":"replace","path":"/n","value":6}]`,
			`[{"op":"add","path":"/t/3","value":1},{"op":"add","path":"/t/4","value":2},{"op":"replace","path":"/n","value":6}]`},
		// something in between touches the path or a parent: keep both
		{`[{"op":"replace","path":"/n/a","value":1},{"op":"remove","path":"/n"},{"op":"add","path":"/n","value":{}},{"op":"replace","path":"/n/a","value":2}]`,
			`[{"op":"replace","path":"/n/a","value":1},{"op":"remove","path":"/n"},{"op":"add","path":"/n","value":{}},{"op":"replace","path":"/n/a","value":2}]`},
		{`[{"op":"replace","path":"/n","value":1},{"op":"move","from":"/n","path":"/m"},{"op":"replace","path":"/n","value":2}]`,
			`[{"op":"replace","path":"/n","value":1},{"op":"move","from":"/n","path":"/m"},{"op":"replace","path":"/n","value":2}]`},
		{`[{"op":"replace","path":"/n","value":1},{"op":"add","path":"/n","value":2}]`, `[{"op":"replace","path":"/n","value":1},{"op":"add","path":"/n","value":2}]`},
	} {
		if got := encodePatch(nil, squashPatch(ops(t, tc.in))); string(got) != tc.want {
			t.Errorf("squash %s\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

func TestHealthWrong(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		`{"connected":true,"visible":true,"reconnects":3}`: false,
		`{"connected":true}`:                 false,
		`{"connected":false}`:                true,
		`{"connected":true,"visible":false}`: true,
		`{}`:                                 true,
	} {
		if got := healthWrong([]byte(in)); got != want {
			t.Errorf("healthWrong(%s) = %v", in, got)
		}
	}
}

// FuzzAppendJSONString: the escaper's output decodes to what
// encoding/json's encoding of the same string decodes to.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", `q"b\s`, "ctl\x00\x1f\n\r\t", "é€😀", "bad\xff\xfe utf8", "\u2028\u2029", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ours := appendJSONString(nil, s)
		theirs, _ := json.Marshal(s)
		var a, b string
		if err := json.Unmarshal(ours, &a); err != nil {
			t.Fatalf("%q: our encoding %q does not decode: %v", s, ours, err)
		}
		_ = json.Unmarshal(theirs, &b)
		if a != b {
			t.Fatalf("%q: ours decodes to %q, encoding/json's to %q", s, a, b)
		}
		if !json.Valid(appendJSONString(nil, []byte(s))) {
			t.Fatalf("%q: the []byte form is not valid JSON", s)
		}
		if ref := refJSONString(s); string(ours) != ref || string(appendJSONString([]byte("x"), []byte(s))) != "x"+ref {
			t.Fatalf("%q: encoded as %q, want %q", s, ours, ref)
		}
	})
}

// refJSONString is the escaping appendJSONString promises, rune by rune:
// what a model reads (the text copy of a result) must not change with it.
func refJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == '\u2028' || r == '\u2029':
			fmt.Fprintf(&b, `\u%04x`, r)
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}

// objw.compact writes what compactObject renders, after other members or
// none, and nothing when compactObject has nothing.
func TestObjwCompact(t *testing.T) {
	for _, v := range []string{``, `null`, `{}`, `{"a":null,"b":""}`, `{"a":1,"b":null,"c":[],"d":{"e":null}}`, `"text"`, `[1]`, `[]`, `{"k\u00e9":"v"}`} {
		for _, before := range []bool{false, true} {
			want := newObj(nil)
			got := newObj(nil)
			if before {
				want.int("x", 1)
				got.int("x", 1)
			}
			if c := compactObject([]byte(v)); c != nil {
				want.raw("docs", c)
			}
			got.compact("docs", []byte(v))
			got.str("after", "y")
			want.str("after", "y")
			if w, g := want.close(), got.close(); string(w) != string(g) {
				t.Errorf("compact(%s), before=%v: %s, want %s", v, before, g, w)
			}
		}
	}
}
