package schema

import (
	"encoding/json"
	"strings"
	"testing"
)

const refMsgSchema = `{"discriminant":"type","variants":{
  "setFilter":{"kind":{"enum":["all","done"]},"q":{"type":"string","optional":true,"hint":"search text","priority":"should","validates":"v.length<80"}},
  "editCell":{"cells":{"kind":"array","element":{"kind":"object","shape":{"value":"number","note":"unknown"}}}},
  "setFormat":{"format":{"kind":"discriminated-union","discriminant":"kind","variants":{
      "range":{"min":"number","max":"number"},
      "text":{"upper":"boolean"}}}},
  "ping":{}
}}`

func TestFromCompiler(t *testing.T) {
	t.Parallel()
	p, err := FromCompiler(json.RawMessage(refMsgSchema))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		msg    string
		reason string
		path   string
	}{
		{`{"type":"setFilter","kind":"all"}`, "", ""},
		{`{"type":"setFilter","kind":"all","q":"milk","extra":true}`, "", ""}, // lenient: extra fields pass
		{`{"type":"setFilter","kind":"some"}`, "schema-error", "/kind"},
		{`{"type":"setFilter","q":"x"}`, "schema-error", "/kind"},
		{`{"type":"setFilter","kind":"all","q":3}`, "schema-error", "/q"},
		{`{"type":"editCell","cells":[{"value":1},{"value":2,"note":{"any":"thing"}}]}`, "", ""},
		{`{"type":"editCell","cells":[{"value":"1"}]}`, "schema-error", "/cells/0/value"},
		{`{"type":"editCell","cells":{}}`, "schema-error", "/cells"},
		{`{"type":"setFormat","format":{"kind":"range","min":1,"max":2}}`, "", ""},
		{`{"type":"setFormat","format":{"kind":"range","min":1}}`, "schema-error", "/format/max"},
		{`{"type":"setFormat","format":{"kind":"text","upper":"no"}}`, "schema-error", "/format/upper"},
		{`{"type":"setFormat","format":{"kind":"other"}}`, "schema-error", "/format/kind"},
		{`{"type":"ping"}`, "", ""},
		{`{"type":"pong"}`, "invalid", ""},
	}
	for _, tc := range tests {
		r := p.Check(json.RawMessage(tc.msg))
		switch {
		case tc.reason == "" && r != nil:
			t.Errorf("Check(%s) = %+v, want allowed", tc.msg, r)
		case tc.reason != "" && (r == nil || r.Reason != tc.reason):
			t.Errorf("Check(%s) = %+v, want %s", tc.msg, r, tc.reason)
		case tc.path != "" && (len(r.Errors) == 0 || r.Errors[0].Path != tc.path):
			t.Errorf("Check(%s) errors = %+v, want first path %s", tc.msg, r.Errors, tc.path)
		}
	}
	if h := string(p.PayloadHint("setFilter")); h != `{"kind":"all"}` {
		t.Errorf("PayloadHint(setFilter) = %s", h)
	}
	if h := string(p.PayloadHint("setFormat")); !strings.Contains(h, `"kind":"range"`) && !strings.Contains(h, `"kind":"text"`) {
		t.Errorf("PayloadHint(setFormat) = %s", h)
	}
}

func TestFromCompilerErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, raw, want string }{
		{"no variants", `{"discriminant":"type"}`, `no "variants"`},
		{"shape not object", `{"variants":{"a":"string"}}`, "variants.a: a shape must be an object"},
		{"unknown bare type", `{"variants":{"a":{"n":"integer"}}}`, `variants.a.n: unknown field type "integer"`},
		{"unknown kind", `{"variants":{"a":{"n":{"kind":"tuple"}}}}`, `variants.a.n: unknown kind "tuple"`},
		{"unknown spec", `{"variants":{"a":{"n":{"of":"string"}}}}`, "variants.a.n: unknown field spec with keys [of]"},
		{"array spec", `{"variants":{"a":{"n":["string"]}}}`, "variants.a.n: unknown field spec an array"},
		{"empty enum", `{"variants":{"a":{"n":{"enum":[]}}}}`, "variants.a.n: enum must be"},
		{"array without element", `{"variants":{"a":{"n":{"kind":"array"}}}}`, "variants.a.n: array without element"},
		{"nested unknown", `{"variants":{"a":{"n":{"kind":"array","element":{"kind":"object","shape":{"x":"date"}}}}}}`, `variants.a.n[].x: unknown field type "date"`},
		{"union without discriminant", `{"variants":{"a":{"n":{"kind":"discriminated-union","variants":{"x":{}}}}}}`, "discriminant"},
		{"union bad variant", `{"variants":{"a":{"f":{"kind":"discriminated-union","discriminant":"k","variants":{"x":{"y":"int"}}}}}}`, `variants.a.f(k=x).y: unknown field type "int"`},
		{"rich bad type", `{"variants":{"a":{"n":{"type":"text","optional":true}}}}`, `variants.a.n: unknown field type "text"`},
		{"rich bad optional", `{"variants":{"a":{"n":{"type":"string","optional":"yes"}}}}`, "optional must be a boolean"},
		{"too deep", `{"variants":{"a":{"n":` + strings.Repeat(`{"kind":"array","element":`, 40) + `"string"` + strings.Repeat("}", 40) + `}}}`, "nested deeper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := FromCompiler(json.RawMessage(tc.raw))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("FromCompiler = %v, want error containing %q", err, tc.want)
			}
		})
	}
	if p, err := FromCompiler(json.RawMessage(`null`)); p != nil || err != nil {
		t.Fatalf("FromCompiler(null) = %v, %v", p, err)
	}
}

func TestFromCompilerRichUnknownIsOptional(t *testing.T) {
	t.Parallel()
	p, err := FromCompiler(json.RawMessage(`{"variants":{"a":{"x":{"type":"unknown","hint":"anything"},"y":{"type":{"kind":"object","shape":{"z":"string"}}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Check(json.RawMessage(`{"type":"a","y":{"z":"s"}}`)); r != nil {
		t.Fatalf("Check = %+v", r)
	}
	if r := p.Check(json.RawMessage(`{"type":"a"}`)); r == nil || r.Errors[0].Path != "/y" {
		t.Fatalf("Check = %+v, want /y missing", r)
	}
	if h := string(p.PayloadHint("a")); h != `{"y":{"z":""}}` {
		t.Fatalf("PayloadHint = %s (unknown fields must be left out)", h)
	}
}
