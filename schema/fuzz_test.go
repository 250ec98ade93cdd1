package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// gen turns fuzz bytes into adversarial JSON: schemas built from the
// keywords that fan out or recurse ($ref cycles, allOf/anyOf,
// dependentSchemas, patternProperties, costly patterns), and payloads to
// check against them.
type gen struct {
	b []byte
	i int
}

func (g *gen) next() byte {
	if g.i >= len(g.b) {
		return 0
	}
	g.i++
	return g.b[g.i-1]
}

var fuzzPatterns = []string{`^a+$`, `(a|b)?(a|b)?(a|b)?(a|b)?x`, `[a-z]{0,300}`, `^\d{1,3}$`, `.*`}

func (g *gen) schema(depth int) string {
	if depth > 6 {
		return `{"type":"string"}`
	}
	two := func() string { return g.schema(depth+1) + "," + g.schema(depth+1) }
	switch g.next() % 13 {
	case 0:
		return fmt.Sprintf(`{"type":"string","pattern":%q}`, fuzzPatterns[int(g.next())%len(fuzzPatterns)])
	case 1:
		return fmt.Sprintf(`{"$ref":"#/$defs/d%d"}`, g.next()%4)
	case 2:
		return `{"allOf":[` + two() + `]}`
	case 3:
		return `{"anyOf":[` + two() + `]}`
	case 4:
		n := int(g.next()%4) + 1
		var props, req []string
		for k := range n {
			props = append(props, fmt.Sprintf(`"p%d":%s`, k, g.schema(depth+1)))
			if g.next()%2 == 0 {
				req = append(req, fmt.Sprintf(`"p%d"`, k))
			}
		}
		return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]}`
	case 5:
		return `{"dependentSchemas":{"a":` + g.schema(depth+1) + `,"b":` + g.schema(depth+1) + `}}`
	case 6:
		return `{"not":` + g.schema(depth+1) + `}`
	case 7:
		return `{"type":"array","minItems":1,"items":` + g.schema(depth+1) + `,"uniqueItems":true}`
	case 8:
		return fmt.Sprintf(`{"patternProperties":{%q:%s},"additionalProperties":%s}`, fuzzPatterns[int(g.next())%len(fuzzPatterns)], g.schema(depth+1), g.schema(depth+1))
	case 9:
		return `{"$ref":"#"}`
	case 10:
		return `{"oneOf":[` + two() + `],"default":{"$ref":"not a ref: data"}}`
	case 11:
		return `{"if":` + g.schema(depth+1) + `,"then":` + g.schema(depth+1) + `,"else":` + g.schema(depth+1) + `}`
	}
	if g.next()%2 == 0 {
		return "true"
	}
	return "false"
}

func (g *gen) value(depth int) string {
	if depth > 8 {
		return `1`
	}
	switch g.next() % 6 {
	case 0:
		n := int(g.next()) % 5
		var kv []string
		for k := range n {
			key := []string{"a", "b", "p0", "p1", "aaaa"}[k]
			kv = append(kv, fmt.Sprintf(`%q:%s`, key, g.value(depth+1)))
		}
		return `{` + strings.Join(kv, ",") + `}`
	case 1:
		n := int(g.next()) % 5
		var vs []string
		for range n {
			vs = append(vs, g.value(depth+1))
		}
		return `[` + strings.Join(vs, ",") + `]`
	case 2:
		return fmt.Sprintf("%q", strings.Repeat("a", int(g.next())*int(g.next())))
	case 3:
		return fmt.Sprint(int(g.next()) - 100)
	case 4:
		return `null`
	}
	return `"x"`
}

// FuzzAdversarialPolicy drives the compiler, the hint builder and Check
// with generated schemas that recurse and fan out: nothing panics, every
// hint is small valid JSON, and Check answers (its cost is bounded by
// MaxCheckSteps and MaxRegexWork, so a blow-up shows as a hang here).
func FuzzAdversarialPolicy(f *testing.F) {
	for _, seed := range [][]byte{
		{2, 1, 0, 1, 1}, {4, 3, 9, 0, 9, 0, 9, 1}, {5, 5, 5, 5, 5, 5, 12, 1},
		{8, 1, 4, 4, 1, 0, 2, 0}, {7, 1, 7, 1, 7, 0, 0, 1, 200, 200},
		{9, 9, 9, 9}, {11, 2, 3, 1, 2, 6, 9},
	} {
		f.Add(seed, []byte{0, 4, 0, 2, 200, 200, 1, 3})
	}
	f.Fuzz(func(t *testing.T, schemaBytes, msgBytes []byte) {
		g := &gen{b: schemaBytes}
		var defs []string
		for k := range 4 {
			defs = append(defs, fmt.Sprintf(`"d%d":%s`, k, g.schema(1)))
		}
		root := g.schema(0)
		if root == "true" || root == "false" {
			root = `{}`
		}
		s := `{"$defs":{` + strings.Join(defs, ",") + `},` + strings.TrimPrefix(root, "{")
		p, err := Parse(json.RawMessage(`{"variants":{"v":{"schema":` + s + `}}}`))
		if err != nil {
			return
		}
		if h := p.PayloadHint("v"); !json.Valid(h) || len(h) > maxHintBytes {
			t.Fatalf("PayloadHint = %.100s (%d bytes)", h, len(h))
		}
		mg := &gen{b: msgBytes}
		payload := strings.TrimPrefix(mg.value(0), "{")
		msg := `{"type":"v"`
		if payload != "" && !strings.HasPrefix(payload, "}") && strings.HasSuffix(payload, "}") && !strings.HasPrefix(payload, "[") {
			msg += "," + payload
		} else {
			msg += "}"
		}
		if !json.Valid([]byte(msg)) {
			msg = `{"type":"v"}`
		}
		if r := p.Check(json.RawMessage(msg)); r != nil {
			switch r.Reason {
			case ReasonInvalid, ReasonSchemaError:
			default:
				t.Fatalf("reason %q", r.Reason)
			}
		}
	})
}

// FuzzSplitMsg: the variant SplitMsg returns is the one a JavaScript tab
// reads (the exact key), and nothing that a case-insensitive decoder could
// read as the discriminant is let through.
func FuzzSplitMsg(f *testing.F) {
	for _, s := range []string{`{"type":"a","x":1}`, `{"type":"a","Type":"b"}`, `{"TYPE":"b"}`, `{"type":"a","type":"b"}`,
		`{"t\u0079pe":"a"}`, `{"type":"a","\u212aind":1}`, `{"kind":"k"}`, `[]`, `{"type":"a"} x`,
		`{"type":null}`, `{"type":"a","Type":1`, `{"a":1,"type":"x"`, `{"<&>":"\u2028","type":"a","é":[1, {"b" : 2}]}`, `{"type":"\u00e9\ud800"}`, `{}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		v, payload, err := SplitMsg(msg, "")
		// The one-pass split answers exactly as the streaming decoder.
		dv, dp, derr := splitMsgDecoder(msg, DefaultDiscriminant)
		if v != dv || !bytes.Equal(payload, dp) || fmt.Sprint(err) != fmt.Sprint(derr) {
			t.Fatalf("SplitMsg(%q) = %q, %q, %v; the decoder: %q, %q, %v", msg, v, payload, err, dv, dp, derr)
		}
		if err != nil {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(msg, &m) != nil {
			t.Fatalf("SplitMsg accepted what encoding/json cannot decode: %q", msg)
		}
		var exact string
		if json.Unmarshal(m["type"], &exact) != nil || exact != v {
			t.Fatalf("variant %q, exact key says %q", v, exact)
		}
		var folded struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(msg, &folded) == nil && folded.Type != v {
			t.Fatalf("a case-insensitive decode reads %q, SplitMsg %q: %q", folded.Type, v, msg)
		}
		var pm map[string]json.RawMessage
		if json.Unmarshal(payload, &pm) != nil {
			t.Fatalf("payload %q is not an object", payload)
		}
		if _, ok := pm["type"]; ok || len(pm) != len(m)-1 {
			t.Fatalf("payload %q from %q", payload, msg)
		}
	})
}
