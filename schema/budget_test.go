package schema

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// allocated returns the bytes allocated while fn runs (tests calling it are
// not parallel, so nothing else allocates meanwhile).
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// rootBomb is the review's policy: k required properties that each $ref the
// root. Its hint used to expand about k^8 times at Parse (k=6: 213 bytes,
// 2.3 s, 378 MB).
func rootBomb(k int) string {
	var props, req []string
	for i := range k {
		props = append(props, fmt.Sprintf(`"p%d":{"$ref":"#"}`, i))
		req = append(req, fmt.Sprintf(`"p%d"`, i))
	}
	return `{"variants":{"v":{"schema":{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]}}}}`
}

// chainBomb has no cycle but fans out: $defs d0..d(n-1), each with k
// required properties referring to the next.
func chainBomb(k, n int) string {
	var defs []string
	for d := range n {
		var props, req []string
		for i := range k {
			next := `{"type":"string"}`
			if d+1 < n {
				next = fmt.Sprintf(`{"$ref":"#/$defs/d%d"}`, d+1)
			}
			props = append(props, fmt.Sprintf(`"p%d":%s`, i, next))
			req = append(req, fmt.Sprintf(`"p%d"`, i))
		}
		defs = append(defs, fmt.Sprintf(`"d%d":{"type":"object","properties":{%s},"required":[%s]}`, d, strings.Join(props, ","), strings.Join(req, ",")))
	}
	return `{"variants":{"v":{"schema":{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/d0"}}}}`
}

func TestHintBombIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
	}{
		{"root cycle k=6", rootBomb(6)},
		{"root cycle k=8", rootBomb(8)},
		{"chain k=6 n=14", chainBomb(6, 14)},
	} {
		var p *Policy
		var hint json.RawMessage
		n := allocated(func() {
			var err error
			if p, err = Parse(json.RawMessage(tc.policy)); err != nil {
				t.Fatalf("%s: Parse: %v", tc.name, err)
			}
			hint = p.PayloadHint("v")
			hint = p.PayloadHint("v") // built once
		})
		if n > 16<<20 {
			t.Errorf("%s: Parse + PayloadHint allocated %d MB, want < 16 MB", tc.name, n>>20)
		}
		if len(hint) > maxHintBytes || !json.Valid(hint) {
			t.Errorf("%s: hint %d bytes: %.80s", tc.name, len(hint), hint)
		}
	}
	// A cycle is never expanded, the rest of the hint still is.
	p := mustParse(t, `{"variants":{"tree":{"schema":{"$defs":{"node":{"type":"object","properties":{"name":{"type":"string","minLength":2},"child":{"$ref":"#/$defs/node"}},"required":["name","child"]}},"$ref":"#/$defs/node"}}}}`)
	if got := string(p.PayloadHint("tree")); got != `{"name":"xx"}` {
		t.Errorf("recursive hint = %s", got)
	}
}

func TestCompileWorkIsBounded(t *testing.T) {
	many := `{"variants":{"v":{"schema":{"allOf":[` + strings.Repeat(`{},`, 80_000) + `{}]}}}}`
	var vs []string
	for i := range 1000 {
		vs = append(vs, fmt.Sprintf(`"v%d":{"schema":{"allOf":[`+strings.Repeat(`{},`, 999)+`{}]}}`, i))
	}
	wide := `{"variants":{` + strings.Join(vs, ",") + `}}`
	for name, pol := range map[string]string{"80k subschemas": many, "1000 variants x 1000": wide} {
		var err error
		n := allocated(func() { _, err = Parse(json.RawMessage(pol)) })
		if err == nil || !strings.Contains(err.Error(), "objects and arrays") {
			t.Errorf("%s: Parse error = %v, want the node limit", name, err)
		}
		if n > 64<<20 {
			t.Errorf("%s: Parse allocated %d MB before refusing", name, n>>20)
		}
	}
	deep := `{"variants":{"v":{"schema":` + strings.Repeat(`{"not":`, 2000) + `{}` + strings.Repeat(`}`, 2000) + `}}}`
	if _, err := Parse(json.RawMessage(deep)); err == nil || !strings.Contains(err.Error(), "deeper than") {
		t.Errorf("2000-deep schema (it took 35 s to compile): Parse error = %v, want the depth limit", err)
	}
	for _, tc := range []struct{ pattern, want string }{
		{strings.Repeat("a", MaxPatternLen+1), "byte limit"},
		{`[a-z]{0,1000}[a-z]{0,1000}[a-z]{0,1000}`, "instructions"},
	} {
		pol := fmt.Sprintf(`{"variants":{"v":{"schema":{"type":"string","pattern":%q}}}}`, tc.pattern)
		if _, err := Parse(json.RawMessage(pol)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pattern %.30s…: Parse error = %v, want %q", tc.pattern, err, tc.want)
		}
	}
	for _, ref := range []string{`"$dynamicRef":"#meta"`, `"$ref":"https://json-schema.org/draft/2020-12/schema"`} {
		if _, err := Parse(json.RawMessage(`{"variants":{"v":{"schema":{` + ref + `}}}}`)); err == nil {
			t.Errorf("%s: Parse accepted it", ref)
		}
	}
}

// Check stops at its budget instead of running for minutes: a long string
// against a costly pattern (the review: 501 chars × 100 KB ≈ 50 s of CPU), and
// schemas whose applicators fan out.
func TestCheckWorkIsBounded(t *testing.T) {
	costly := strings.Repeat(`(a|b)?`, 80) + `x`
	var deps, allOf []string
	const depth = 26
	for i := range depth {
		next := fmt.Sprintf(`{"$ref":"#/$defs/d%d"}`, i+1)
		if i+1 == depth {
			next = `false`
		}
		deps = append(deps, fmt.Sprintf(`"d%d":{"dependentSchemas":{"a":%s,"b":%s}}`, i, next, next))
		allOf = append(allOf, fmt.Sprintf(`"d%d":{"allOf":[%s,%s]}`, i, next, next))
	}
	tests := []struct {
		name, schema, msg, want string
	}{
		{"pattern on 100 KB", fmt.Sprintf(`{"properties":{"s":{"type":"string","pattern":%q}}}`, costly),
			`{"type":"v","s":"` + strings.Repeat("a", 100_000) + `"}`, "too long to check against a pattern"},
		{"pattern on 50 KB", fmt.Sprintf(`{"properties":{"s":{"type":"string","pattern":%q}}}`, costly),
			`{"type":"v","s":"` + strings.Repeat("a", 50_000) + `"}`, "units of regex work"},
		{"patternProperties over many keys", fmt.Sprintf(`{"patternProperties":{%q:{}}}`, costly),
			`{"type":"v"` + strings.Repeat(`,"`+strings.Repeat("a", 100)+`":1`, 1) + manyKeys(5000) + `}`, "regex work"},
		{"dependentSchemas fan-out under not", `{"not":{"$ref":"#/$defs/d0"},"$defs":{` + strings.Join(deps, ",") + `}}`,
			`{"type":"v","a":1,"b":2}`, "too complex to check"},
		{"allOf fan-out", `{"$ref":"#/$defs/d0","$defs":{` + strings.Join(allOf, ",") + `}}`,
			`{"type":"v"}`, "too complex to check"},
	}
	for _, tc := range tests {
		p := mustParse(t, `{"variants":{"v":{"schema":`+tc.schema+`}}}`)
		r := p.Check(json.RawMessage(tc.msg))
		if r == nil || r.Reason != ReasonSchemaError || !strings.Contains(r.Detail, tc.want) {
			t.Errorf("%s: Check = %+v, want schema-error %q", tc.name, r, tc.want)
		}
	}
	// Ordinary payloads stay well inside the budget.
	p := mustParse(t, `{"variants":{"v":{"schema":{"type":"object","properties":{"s":{"type":"string","pattern":"^[a-z]+$"},"tags":{"type":"array","items":{"type":"string","pattern":"^#"}}}}}}}`)
	if r := p.Check(json.RawMessage(`{"type":"v","s":"` + strings.Repeat("a", 20_000) + `","tags":["#a","#b"]}`)); r != nil {
		t.Errorf("ordinary payload rejected: %+v", r)
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `,"k%05d%s":1`, i, strings.Repeat("a", 20))
	}
	return b.String()
}

// BenchmarkCheckAtBudget is the most a Check may cost: a fan-out schema
// just inside MaxCheckSteps, and a pattern just inside MaxRegexWork.
func BenchmarkCheckAtBudget(b *testing.B) {
	var allOf []string
	const depth = 15 // 2^16 evaluations < MaxCheckSteps
	for i := range depth {
		next := fmt.Sprintf(`{"$ref":"#/$defs/d%d"}`, i+1)
		if i+1 == depth {
			next = `{"type":"object"}`
		}
		allOf = append(allOf, fmt.Sprintf(`"d%d":{"allOf":[%s,%s]}`, i, next, next))
	}
	costly := strings.Repeat(`(a|b)?`, 80) + `x`
	for _, tc := range []struct{ name, schema, msg string }{
		{"fan-out", `{"$ref":"#/$defs/d0","$defs":{` + strings.Join(allOf, ",") + `}}`, `{"type":"v"}`},
		{"regex", fmt.Sprintf(`{"properties":{"s":{"type":"string","pattern":%q}}}`, costly), `{"type":"v","s":"` + strings.Repeat("a", MaxRegexWork/330) + `"}`},
	} {
		p := mustParse(b, `{"variants":{"v":{"schema":`+tc.schema+`}}}`)
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if r := p.Check(json.RawMessage(tc.msg)); r != nil && strings.Contains(r.Detail, "too") {
					b.Fatal(r.Detail)
				}
			}
		})
	}
}

// BenchmarkParseAtLimit compiles policies just inside the node limits: the
// costliest shapes found (the compiler is superlinear in one schema's size
// and depth).
func BenchmarkParseAtLimit(b *testing.B) {
	flat := `{"allOf":[` + strings.Repeat(`{},`, MaxVariantNodes-3) + `{}]}`
	nested := strings.Repeat(`{"not":`, MaxSchemaDepth-1) + `{}` + strings.Repeat(`}`, MaxSchemaDepth-1)
	props := strings.Repeat(`{"properties":{"a":`, MaxSchemaDepth/2-1) + `{}` + strings.Repeat(`}}`, MaxSchemaDepth/2-1)
	for _, tc := range []struct {
		name   string
		schema string
		n      int
	}{
		{"flat", flat, MaxPolicyNodes / MaxVariantNodes},
		{"nested not", nested, MaxPolicyNodes / MaxSchemaDepth},
		{"nested properties", props, MaxPolicyNodes / MaxSchemaDepth},
	} {
		var vs []string
		for i := range tc.n {
			vs = append(vs, fmt.Sprintf(`"v%d":{"schema":%s}`, i, tc.schema))
		}
		pol := json.RawMessage(`{"variants":{` + strings.Join(vs, ",") + `}}`)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(pol); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
