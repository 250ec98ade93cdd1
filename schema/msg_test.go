package schema

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSplitMsg(t *testing.T) {
	t.Parallel()
	ok := []struct{ msg, disc, variant, payload string }{
		{`{"type":"addTodo","title":"x"}`, "", "addTodo", `{"title":"x"}`},
		{` { "title" : [1, 2] , "type" : "a" } `, "", "a", `{"title":[1, 2]}`},
		{`{"type":"clearAll"}`, "type", "clearAll", `{}`},
		{`{"t\u0079pe":"esc","n":1}`, "", "esc", `{"n":1}`}, // an escaped key is the same key
		{`{"kind":"k","type":"payload field"}`, "kind", "k", `{"type":"payload field"}`},
	}
	for _, tc := range ok {
		v, p, err := SplitMsg(json.RawMessage(tc.msg), tc.disc)
		if err != nil || v != tc.variant || string(p) != tc.payload {
			t.Errorf("SplitMsg(%s, %q) = %q, %s, %v; want %q, %s", tc.msg, tc.disc, v, p, err, tc.variant, tc.payload)
		}
	}
	bad := []struct{ msg, disc, detail string }{
		{`{"type":"clearAll","Type":"resetDemo"}`, "", `field "Type"`},
		{`{"Type":"resetDemo","type":"clearAll"}`, "", `field "Type"`},
		{`{"type":"addTodo","TYPE":"x"}`, "", `field "TYPE"`},
		{`{"kind":"a","\u212aind":"b"}`, "kind", "differs from it only in case"}, // Kelvin sign folds to k
		{`{"type":"a","type":"b"}`, "", `"type" twice`},
		{`{"Type":"a"}`, "", `field "Type"`},
		{`{"type":1}`, "", "msg.type must be a string"},
		{`["type"]`, "", "msg.type must be a string"},
		{`{"type":"a"} {}`, "", "one JSON object"},
		{`{"type":"a"`, "", "not valid JSON"},
		{``, "", "msg.type must be a string"},
	}
	for _, tc := range bad {
		_, _, err := SplitMsg(json.RawMessage(tc.msg), tc.disc)
		if !errors.Is(err, ErrBadMsg) || !strings.Contains(err.Error(), tc.detail) {
			t.Errorf("SplitMsg(%s) error = %v, want ErrBadMsg containing %q", tc.msg, err, tc.detail)
		}
	}
}

// A case-variant duplicate of the discriminant is refused by Check too, so a
// policy never allows what the tab would read as another variant.
func TestCheckCaseVariantDiscriminant(t *testing.T) {
	t.Parallel()
	p := mustParse(t, todoPolicy)
	for _, msg := range []string{
		`{"type":"clearAll","Type":"resetBoard"}`,
		`{"type":"addTodo","title":"x","TYPE":"x"}`,
	} {
		r := p.Check(json.RawMessage(msg))
		if r == nil || r.Reason != ReasonInvalid || !strings.Contains(r.Detail, "case-sensitive") {
			t.Errorf("Check(%s) = %+v, want invalid (case-variant discriminant)", msg, r)
		}
	}
}
