package schema

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestNumberOK(t *testing.T) {
	t.Parallel()
	long := "1." + strings.Repeat("0", MaxNumberLen-2) // MaxNumberLen bytes
	for _, tc := range []struct {
		n  string
		ok bool
	}{
		{"0", true}, {"-12", true}, {"3.25", true}, {"123456789012345678901234567890", true},
		{"1e400", true}, {"1E+400", true}, {"-1e-400", true}, {"2.5e-0400", true},
		{"1e00000000000000000000000000400", true},
		{long, true}, {long + "1", false}, {long[:MaxNumberLen-4] + "e400", true},
		{"1e401", false}, {"1e-401", false}, {"-1E+401", false}, {"1e1000000", false},
		{"1e-1000000", false}, {"0e999999", false},
		{"1e" + strings.Repeat("9", 40), false}, // no overflow of the exponent's int
	} {
		if got := numberOK(tc.n); got != tc.ok {
			t.Errorf("numberOK(%s) = %v, want %v", tc.n, got, tc.ok)
		}
	}
	// Whatever JavaScript (or Go) writes for a float64 is within bounds.
	for _, f := range []float64{math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 2.2250738585072014e-308, 1 / 3.0, -1e21, 9007199254740993} {
		for _, s := range []string{strconv.FormatFloat(f, 'g', -1, 64), strconv.FormatFloat(f, 'e', -1, 64), strconv.FormatFloat(f, 'f', -1, 64)} {
			if len(s) <= MaxNumberLen && !numberOK(s) {
				t.Errorf("numberOK(%s) = false", s)
			}
		}
	}
}

const numbersPolicy = `{"variants":{
  "setScores":{"schema":{"type":"object","properties":{"scores":{"type":"array","items":{"type":"integer"}}}}},
  "get":{"schema":{"type":"object","properties":{"id":{"type":"integer","minimum":1}}}}}}`

// A payload number past the bounds is refused before the validator reads
// it with big.Rat: 500 × 1e1000000 (5 KB) took 8.5 s of CPU in Check and
// passed "type":"integer"; one cost 32 ms against "minimum":1.
func TestCheckRefusesHugeNumbers(t *testing.T) {
	t.Parallel()
	p := mustParse(t, numbersPolicy)
	scores := strings.TrimSuffix(strings.Repeat("1e1000000,", 500), ",")
	for _, tc := range []struct {
		name, msg string
		paths     []string // the first Errors
		detail    string
	}{
		{"500 in an array (decoder path)", `{"type":"setScores","scores":[` + scores + `]}`,
			[]string{"/scores/0", "/scores/1"}, "/scores/0, /scores/1, /scores/2, /scores/3, /scores/4 and more: numbers out of range; numbers must fit a 64-bit float"},
		{"one against minimum (fast path)", `{"type":"get","id":1e1000000}`, []string{"/id"}, "/id: number out of range; numbers must fit a 64-bit float (|exponent| ≤ 400, ≤ 64 characters)"},
		{"negative exponent", `{"type":"get","id":1E-401}`, []string{"/id"}, "/id: number out of range"},
		{"too many digits", `{"type":"get","id":1` + strings.Repeat("0", MaxNumberLen) + `}`, []string{"/id"}, "/id: number out of range"},
		// Where no keyword looks: enum, const and uniqueItems would still hash it.
		{"nested, unvalidated", `{"type":"get","id":2,"x":{"b":[0,{"c":-1e999}],"a":1e-500}}`, []string{"/x/a", "/x/b/1/c"}, "/x/a, /x/b/1/c: numbers out of range"},
		{"past the fast path's size", `{"type":"get","pad":"` + strings.Repeat("x", fastDecodeBytes) + `","id":1e401}`, []string{"/id"}, "/id: number out of range"},
	} {
		r := p.Check(json.RawMessage(tc.msg))
		if r == nil || r.Reason != ReasonSchemaError || !strings.Contains(r.Detail, tc.detail) {
			t.Errorf("%s: Check = %+v, want schema-error %q", tc.name, r, tc.detail)
			continue
		}
		if len(r.Errors) < len(tc.paths) || len(r.Errors) > maxFieldErrors {
			t.Errorf("%s: %d errors: %+v", tc.name, len(r.Errors), r.Errors)
			continue
		}
		for i, path := range tc.paths {
			if fe := r.Errors[i]; fe.Path != path || fe.Code != CodeValidatesFailed || !strings.Contains(fe.Message, "64-bit float") {
				t.Errorf("%s: error %d = %+v, want %s", tc.name, i, fe, path)
			}
		}
	}
	// Numbers within the bounds are the validator's as before.
	for msg, ok := range map[string]bool{
		`{"type":"get","id":1.5e300}`: true, `{"type":"get","id":1e400}`: true, `{"type":"get","id":0.5}`: false,
		`{"type":"setScores","scores":[1,-2,30000000000000000000000000000]}`: true, `{"type":"get","id":1e-400}`: false,
	} {
		if r := p.Check(json.RawMessage(msg)); (r == nil) != ok || (r != nil && strings.Contains(r.Detail, "64-bit")) {
			t.Errorf("%s: Check = %+v, want allowed %v", msg, r, ok)
		}
	}
}

// A schema number past the bounds is refused before the compiler reads it:
// 100 subschemas with minimum/maximum/multipleOf ±1e±1000000 (7 KB) took
// 6.3 s to compile and kept 120 MB.
func TestParseRefusesHugeNumbers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ schema, path string }{
		{`{"minimum":-1e1000000}`, "/minimum"},
		{`{"maximum":1e401}`, "/maximum"},
		{`{"exclusiveMinimum":1e-401}`, "/exclusiveMinimum"},
		{`{"exclusiveMaximum":1E+1000000}`, "/exclusiveMaximum"},
		{`{"properties":{"n":{"multipleOf":1e-1000000}}}`, "/properties/n/multipleOf"},
		{`{"const":1e1000000}`, "/const"},
		{`{"enum":["a",{"b":[1e1000000]}]}`, "/enum/1/b/0"},
		{`{"default":1e1000000}`, "/default"},
		{`{"examples":[1e1000000]}`, "/examples/0"},
		{`{"$defs":{"n":{"minimum":1` + strings.Repeat("0", MaxNumberLen) + `}}}`, "/$defs/n/minimum"},
		{`{"maxLength":1e1000000}`, "/maxLength"},
	} {
		_, err := Parse(json.RawMessage(`{"variants":{"v":{"schema":` + tc.schema + `}}}`))
		if err == nil || !strings.Contains(err.Error(), `variant "v": `+tc.path+": number ") || !strings.Contains(err.Error(), "numbers must fit a 64-bit float") {
			t.Errorf("%s: Parse error = %v, want the number bound at %s", tc.schema, err, tc.path)
		}
	}
	// The reference compiler's format is compiled by Parse too.
	if _, err := FromCompiler(json.RawMessage(`{"variants":{"v":{"k":{"enum":[1,1e1000000]}}}}`)); err == nil || !strings.Contains(err.Error(), "64-bit float") {
		t.Errorf("FromCompiler error = %v, want the number bound", err)
	}
	if _, err := Parse(json.RawMessage(`{"variants":{"v":{"schema":{"minimum":-1e400,"maximum":1e400,"multipleOf":1e-400,"const":1e400}}}}`)); err != nil {
		t.Errorf("numbers within the bounds: %v", err)
	}
}

// Footprint counts what the compiled numeric keywords keep: a big.Rat each,
// up to ~400 bytes within the bounds (not the policy's bytes, which are
// ~15 per number).
func TestFootprintCountsNumbers(t *testing.T) {
	lo := "-0." + strings.Repeat("0", MaxNumberLen-9) + "1e-400" // MaxNumberLen bytes
	for _, kw := range []string{
		`"minimum":1e-400,"maximum":1e400,"exclusiveMinimum":1e-400,"exclusiveMaximum":1e400,"multipleOf":1e-400`,
		fmt.Sprintf(`"minimum":%s,"maximum":%s,"exclusiveMinimum":%[1]s,"exclusiveMaximum":%[2]s,"multipleOf":%s`, lo, strings.Repeat("9", MaxNumberLen-4)+"e400", lo[1:]),
	} {
		var subs []string
		for i := range MaxVariantNodes/2 - 1 {
			subs = append(subs, fmt.Sprintf(`"p%d":{%s}`, i, kw))
		}
		raw := json.RawMessage(`{"variants":{"v":{"schema":{"properties":{` + strings.Join(subs, ",") + `}}}}}`)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		p := mustParse(t, string(raw))
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept := int(after.HeapAlloc) - int(before.HeapAlloc)
		if p.Footprint() < kept {
			t.Errorf("%.40s…: Footprint %d KB, but the policy keeps %d KB", kw, p.Footprint()>>10, kept>>10)
		}
		runtime.KeepAlive(p)
	}
}
