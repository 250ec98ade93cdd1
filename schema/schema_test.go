package schema

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

const todoPolicy = `{"variants": {
   "addTodo": {"intent": "Add a task", "schema": {"type":"object","properties":{"title":{"type":"string","minLength":1},"due":{"type":"string","format":"date"}},"required":["title"],"additionalProperties":false},
               "requiresConfirm": false, "humanOnly": false, "agentOnly": false, "alwaysAffordable": true,
               "examples": [{"type":"addTodo","title":"Buy milk"}], "warning": null, "emits": []},
   "setFilter": {"schema": {"type":"object","properties":{"filter":{"enum":["all","done","open"]},"q":{"type":"string"}},"required":["filter"]}},
   "move": {"schema": {"$defs":{"pos":{"type":"integer","minimum":0}},"type":"object","properties":{"from":{"$ref":"#/$defs/pos"},"to":{"$ref":"#/$defs/pos"}},"required":["from","to"]}},
   "clearAll": {"intent": "Delete every task", "requiresConfirm": true},
   "resetBoard": {"intent": "Reset (humans only)", "humanOnly": true}}}`

func mustParse(t testing.TB, raw string) *Policy {
	t.Helper()
	p, err := Parse(json.RawMessage(raw))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func TestCheck(t *testing.T) {
	t.Parallel()
	p := mustParse(t, todoPolicy)
	tests := []struct {
		name       string
		msg        string
		reason     string // "" = allowed
		detail     string // substring
		fieldPaths []string
	}{
		{"ok", `{"type":"addTodo","title":"Buy milk"}`, "", "", nil},
		{"ok without schema", `{"type":"clearAll","anything":[1,2]}`, "", "", nil},
		{"ok with local $ref", `{"type":"move","from":0,"to":3}`, "", "", nil},
		{"ok enum", `{"type":"setFilter","filter":"done"}`, "", "", nil},
		{"not json", `{"type":`, "invalid", "msg.type must be a string", nil},
		{"not an object", `["addTodo"]`, "invalid", "msg.type must be a string", nil},
		{"null", `null`, "invalid", "msg.type must be a string", nil},
		{"type missing", `{"title":"x"}`, "invalid", "msg.type must be a string", nil},
		{"type not a string", `{"type":3}`, "invalid", "msg.type must be a string", nil},
		{"unknown variant", `{"type":"nuke"}`, "invalid", "unknown variant: nuke (known: addTodo, clearAll, move, setFilter)", nil},
		{"human-only", `{"type":"resetBoard"}`, "human-only", "resetBoard can only be done by the human in the app; ask them to do it", nil},
		{"too short", `{"type":"addTodo","title":""}`, "schema-error", "/title: minLength", []string{"/title validates-failed"}},
		{"missing required", `{"type":"addTodo"}`, "schema-error", "/title: required property is missing", []string{"/title missing"}},
		{"extra property", `{"type":"addTodo","title":"x","colour":"red"}`, "schema-error", "/colour: property is not allowed", []string{"/colour unexpected-field"}},
		{"wrong type", `{"type":"addTodo","title":7}`, "schema-error", "/title: got number, want string", []string{"/title wrong-type"}},
		{"not in enum", `{"type":"setFilter","filter":"some"}`, "schema-error", "/filter:", []string{"/filter not-in-enum"}},
		{"via $ref", `{"type":"move","from":-1,"to":"x"}`, "schema-error", "/from: minimum: got -1, want 0; /to: got string, want integer", []string{"/from validates-failed", "/to wrong-type"}},
		{"escaped pointer", `{"type":"addTodo","title":"x","a/b~c":1}`, "schema-error", "", []string{"/a~1b~0c unexpected-field"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := p.Check(json.RawMessage(tc.msg))
			if tc.reason == "" {
				if r != nil {
					t.Fatalf("Check = %+v, want allowed", r)
				}
				return
			}
			if r == nil {
				t.Fatalf("Check allowed %s, want %s", tc.msg, tc.reason)
			}
			if r.Status != "rejected" || r.Reason != tc.reason || !strings.Contains(r.Detail, tc.detail) {
				t.Fatalf("Check = %+v, want reason %q detail containing %q", r, tc.reason, tc.detail)
			}
			var paths []string
			for _, fe := range r.Errors {
				paths = append(paths, fe.Path+" "+fe.Code)
				if fe.Message == "" {
					t.Errorf("empty message for %s", fe.Path)
				}
			}
			if tc.fieldPaths != nil && !reflect.DeepEqual(paths, tc.fieldPaths) {
				t.Fatalf("error paths = %q, want %q (errors %+v)", paths, tc.fieldPaths, r.Errors)
			}
		})
	}
}

func TestCheckRejectionJSON(t *testing.T) {
	t.Parallel()
	r := mustParse(t, todoPolicy).Check(json.RawMessage(`{"type":"addTodo"}`))
	b, _ := json.Marshal(r)
	want := `{"status":"rejected","reason":"schema-error","detail":"/title: required property is missing","errors":[{"path":"/title","code":"missing","message":"required property is missing"}]}`
	if string(b) != want {
		t.Fatalf("rejection JSON\n got %s\nwant %s", b, want)
	}
}

func TestNilPolicyAllowsEverything(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"", "null", "  null "} {
		p, err := Parse(json.RawMessage(raw))
		if err != nil || p != nil {
			t.Fatalf("Parse(%q) = %v, %v; want nil, nil", raw, p, err)
		}
	}
	var p *Policy
	if r := p.Check(json.RawMessage(`not even json`)); r != nil {
		t.Fatalf("nil policy rejected: %+v", r)
	}
	if p.Variants() != nil || p.PayloadHint("x") != nil || p.Discriminant() != "type" {
		t.Fatal("nil policy accessors")
	}
	if _, ok := p.Variant("x"); ok {
		t.Fatal("nil policy has a variant")
	}
}

func TestEmptyVariantsRefusesAll(t *testing.T) {
	t.Parallel()
	r := mustParse(t, `{"variants":{}}`).Check(json.RawMessage(`{"type":"a"}`))
	if r == nil || r.Reason != "invalid" || !strings.Contains(r.Detail, "allows no actions") {
		t.Fatalf("Check = %+v", r)
	}
}

func TestCustomDiscriminant(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `{"discriminant":"kind","variants":{"a":{"schema":{"type":"object","additionalProperties":false}}}}`)
	if r := p.Check(json.RawMessage(`{"kind":"a"}`)); r != nil {
		t.Fatalf("Check = %+v (the discriminant must not reach the schema)", r)
	}
	if r := p.Check(json.RawMessage(`{"type":"a"}`)); r == nil || r.Detail != "msg.kind must be a string" {
		t.Fatalf("Check = %+v", r)
	}
}

func TestUnknownVariantListsAtMost20(t *testing.T) {
	t.Parallel()
	vs := map[string]any{}
	for i := range 25 {
		vs[fmt.Sprintf("v%02d", i)] = map[string]any{}
	}
	raw, _ := json.Marshal(map[string]any{"variants": vs})
	r := mustParse(t, string(raw)).Check(json.RawMessage(`{"type":"zzz"}`))
	if r == nil || !strings.Contains(r.Detail, "v19, and 5 more)") || strings.Contains(r.Detail, "v20") {
		t.Fatalf("detail = %q", r.Detail)
	}
	long := strings.Repeat("é", 500)
	r = mustParse(t, string(raw)).Check(json.RawMessage(`{"type":"` + long + `"}`))
	if len(r.Detail) > 500 {
		t.Fatalf("unknown variant name echoed at full length (%d bytes)", len(r.Detail))
	}
}

func TestDetailListsFirstFive(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `{"variants":{"a":{"schema":{"type":"object","required":["a","b","c","d","e","f","g"]}}}}`)
	r := p.Check(json.RawMessage(`{"type":"a"}`))
	if r == nil || len(r.Errors) != 7 || strings.Count(r.Detail, ";") != 4 {
		t.Fatalf("Check = %+v; want 7 errors, 5 in the detail", r)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	many := map[string]any{}
	for i := range MaxVariants + 1 {
		many[fmt.Sprint("v", i)] = map[string]any{}
	}
	tooMany, _ := json.Marshal(map[string]any{"variants": many})
	big := `{"variants":{"a":{"schema":{"description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}}}}`
	tests := []struct{ name, raw, want string }{
		{"not an object", `[1]`, "must be a JSON object"},
		{"no variants", `{}`, `no "variants"`},
		{"variants not an object", `{"variants":[]}`, "must be a JSON object"},
		{"variant not an object", `{"variants":{"a":3}}`, `variant "a"`},
		{"bad discriminant", `{"discriminant":"","variants":{}}`, "discriminant"},
		{"empty name", `{"variants":{"":{}}}`, "variant name"},
		{"schema not a schema", `{"variants":{"a":{"schema":"x"}}}`, `variant "a": schema must be`},
		{"invalid schema", `{"variants":{"a":{"schema":{"type":"objekt"}}}}`, `variant "a": schema:`},
		{"remote ref", `{"variants":{"a":{"schema":{"$ref":"https://example.com/s.json"}}}}`, "remote $ref"},
		{"file ref", `{"variants":{"a":{"schema":{"$ref":"file:///etc/passwd"}}}}`, "remote $ref"},
		{"relative ref", `{"variants":{"a":{"schema":{"$ref":"other.json"}}}}`, "remote $ref"},
		{"missing local ref", `{"variants":{"a":{"schema":{"$ref":"#/$defs/nope"}}}}`, `variant "a"`},
		{"ecmascript regexp", `{"variants":{"a":{"schema":{"pattern":"(?=x)"}}}}`, `variant "a"`},
		{"too many variants", string(tooMany), "over the limit of 1000"},
		{"schema too big", big, "byte limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse(json.RawMessage(tc.raw))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, %v; want error containing %q", p, err, tc.want)
			}
		})
	}
}

func TestVariants(t *testing.T) {
	t.Parallel()
	p := mustParse(t, todoPolicy)
	if got := fmt.Sprint(p.Variants()); got != "[addTodo clearAll move resetBoard setFilter]" {
		t.Fatalf("Variants = %s", got)
	}
	a, ok := p.Variant("addTodo")
	if !ok || a.Intent != "Add a task" || !a.AlwaysAffordable || len(a.Examples) != 1 || a.Warning != "" {
		t.Fatalf("Variant(addTodo) = %+v, %v", a, ok)
	}
	if c, _ := p.Variant("clearAll"); !c.RequiresConfirm {
		t.Fatal("clearAll lost requiresConfirm")
	}
	if _, ok := p.Variant("nope"); ok {
		t.Fatal("unknown variant found")
	}
	p.Variants()[0] = "mutated"
	if p.Variants()[0] != "addTodo" {
		t.Fatal("Variants returned internal slice")
	}
}

func TestPayloadHint(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `{"variants":{
	  "addTodo": {"schema":{"type":"object","properties":{"title":{"type":"string","minLength":3},"note":{"type":"string"}},"required":["title"]}},
	  "all": {"schema":{"type":"object","required":["s","n","i","b","o","a","e","c","d","ex","nullable","anything","onlyNull","ref","email","union"],
	     "$defs":{"pos":{"type":"integer","minimum":1}},
	     "properties":{"s":{"type":"string"},"n":{"type":"number"},"i":{"type":"integer","exclusiveMinimum":4},"b":{"type":"boolean"},
	       "o":{"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"]},"a":{"type":"array","items":{"type":"string"}},
	       "e":{"enum":[null,"red","green"]},"c":{"const":"k"},"d":{"type":"string","default":"dflt"},"ex":{"type":"number","examples":[42]},
	       "nullable":{"type":["null","string"]},"anything":{},"onlyNull":{"type":"null"},"ref":{"$ref":"#/$defs/pos"},
	       "email":{"type":"string","format":"email"},"union":{"oneOf":[{"type":"null"},{"type":"boolean"}]}}}},
	  "free": {},
	  "cycle": {"schema":{"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},"required":["next"]}}}}
	}}`)
	tests := []struct{ variant, want string }{
		{"addTodo", `{"title":"xxx"}`},
		{"all", `{"a":[],"b":false,"c":"k","d":"dflt","e":"red","email":"user@example.com","ex":42,"i":5,"n":0,"nullable":"","o":{"x":false},"ref":1,"s":"","union":false}`},
		{"free", `{}`},
	}
	for _, tc := range tests {
		if got := string(p.PayloadHint(tc.variant)); got != tc.want {
			t.Errorf("PayloadHint(%s)\n got %s\nwant %s", tc.variant, got, tc.want)
		}
	}
	if h := p.PayloadHint("cycle"); !json.Valid(h) || strings.Contains(string(h), "null") {
		t.Errorf("PayloadHint(cycle) = %s", h)
	}
	if p.PayloadHint("nope") != nil {
		t.Error("PayloadHint of an unknown variant is not nil")
	}
}

func BenchmarkCheck(b *testing.B) {
	p := mustParse(b, todoPolicy)
	msg := json.RawMessage(`{"type":"addTodo","title":"Buy milk","due":"2025-05-01"}`)
	b.ReportAllocs()
	for b.Loop() {
		if r := p.Check(msg); r != nil {
			b.Fatal(r)
		}
	}
}

func BenchmarkCheckRejected(b *testing.B) {
	p := mustParse(b, todoPolicy)
	msg := json.RawMessage(`{"type":"addTodo","title":"","extra":1}`)
	b.ReportAllocs()
	for b.Loop() {
		if r := p.Check(msg); r == nil {
			b.Fatal("allowed")
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(todoPolicy), []byte(`{"type":"addTodo","title":"x"}`))
	f.Add([]byte(`{"discriminant":"k","variants":{"a":{"schema":{"$ref":"#"}}}}`), []byte(`{"k":"a"}`))
	f.Add([]byte(`{"variants":{"a":{"schema":{"anyOf":[{"$ref":"#/$defs/x"}],"$defs":{"x":{"required":["q"]}}}}}}`), []byte(`{"type":"a"}`))
	f.Add([]byte(`{"variants":{"setFilter":{"kind":{"enum":["all","done"]},"q":{"type":"string","optional":true}}}}`), []byte(`{"type":"setFilter","kind":"x"}`))
	f.Fuzz(func(t *testing.T, policy, msg []byte) {
		for _, parse := range []func(json.RawMessage) (*Policy, error){Parse, FromCompiler} {
			p, err := parse(policy)
			if err != nil {
				continue
			}
			p.Check(msg)
			for _, name := range p.Variants() {
				if h := p.PayloadHint(name); !json.Valid(h) {
					t.Fatalf("PayloadHint(%q) = %q is not JSON", name, h)
				}
			}
		}
	})
}

func FuzzCheck(f *testing.F) {
	p := mustParse(f, todoPolicy)
	for _, s := range []string{`{"type":"addTodo","title":"x"}`, `{"type":"move","from":1,"to":{}}`, `{"type":1}`, `[]`, `{"type":"resetBoard"}`, `{"type":"addTodo","title":"x","a/b":[1,{"c":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		r := p.Check(msg)
		if r == nil {
			return
		}
		if r.Status != "rejected" || r.Detail == "" {
			t.Fatalf("bad rejection %+v", r)
		}
		switch r.Reason {
		case ReasonInvalid, ReasonHumanOnly, ReasonSchemaError:
		default:
			t.Fatalf("reason %q", r.Reason)
		}
		if len(r.Errors) > maxFieldErrors {
			t.Fatalf("%d field errors", len(r.Errors))
		}
	})
}

func TestFieldErrorCodesForContainers(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `{"variants":{"t":{"schema":{"type":"object","properties":{"tags":{"type":"array","items":{"type":"object","properties":{"n":{"type":"integer"}}}},"meta":{"type":"object"}}}}}}`)
	for msg, want := range map[string]string{
		`{"type":"t","tags":"x"}`:                 "/tags not-array",
		`{"type":"t","meta":1}`:                   "/meta not-object",
		`{"type":"t","tags":[{"n":1},{"n":"x"}]}`: "/tags/1/n wrong-type",
	} {
		r := p.Check(json.RawMessage(msg))
		if r == nil || len(r.Errors) != 1 || r.Errors[0].Path+" "+r.Errors[0].Code != want {
			t.Errorf("%s: %+v, want %s", msg, r, want)
		}
	}
}

func TestReferencePath(t *testing.T) {
	t.Parallel()
	msg := json.RawMessage(`{"type":"t","cells":[{"value":1}],"a.b":{"0":{"c":[[1]]}},"x/y":1}`)
	for ptr, want := range map[string]string{
		"":                "",
		"/title":          "title",
		"/cells/0/value":  "cells[0].value",
		"/cells/7":        "cells[7]",
		"/a.b/0/c/0/0":    `["a.b"].0.c[0][0]`,
		"/x~1y":           "x/y",
		"/missing/deeper": "missing.deeper",
	} {
		if got := ReferencePath(ptr, msg); got != want {
			t.Errorf("ReferencePath(%q) = %q, want %q", ptr, got, want)
		}
	}
}

// The known actions an unknown variant's refusal lists are the model's:
// human-only ones are left out (the model's action list has none either).
func TestUnknownListsModelActions(t *testing.T) {
	pol, err := Parse(json.RawMessage(`{"variants":{"add":{},"reset":{"humanOnly":true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if rej := pol.Check(json.RawMessage(`{"type":"nope"}`)); rej == nil || rej.Detail != "unknown variant: nope (known: add)" {
		t.Fatalf("%+v", rej)
	}
	only, err := Parse(json.RawMessage(`{"variants":{"reset":{"humanOnly":true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if rej := only.Check(json.RawMessage(`{"type":"nope"}`)); rej == nil || !strings.Contains(rej.Detail, "allows the AI no actions") {
		t.Fatalf("%+v", rej)
	}
}
