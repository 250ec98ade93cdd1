package schema

import (
	"encoding/json"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The cost of checking one msg is bounded before the validator runs: a
// policy comes from the tab and a msg from the LLM side, and an anonymous
// token holder controls both. Two things could otherwise make one Check
// take minutes: schemas whose applicators fan out (allOf of $refs of allOf
// of …, dependentSchemas, patternProperties) and regular expressions whose
// compiled program is large, run over a long string (the Go engine is linear
// in the string, times the program size).
const (
	// MaxCheckSteps bounds the (subschema, value) evaluations of one Check
	// (about 50 ms of CPU at the limit; BenchmarkCheckAtBudget).
	MaxCheckSteps = 100_000
	// MaxRegexWork bounds, per Check, the sum over every pattern match of
	// the string's bytes times the pattern's compiled program size (about
	// 4–13 ns per unit on one core: 20–50 ms; BenchmarkCheckAtBudget).
	MaxRegexWork = 4_000_000
	// MaxPatternLen caps the source of one "pattern"/"patternProperties" regex.
	MaxPatternLen = 1000
	// MaxPatternProgram caps its compiled program (instructions).
	MaxPatternProgram = 5000
	// MaxPatternInput caps the bytes of a string checked against a pattern.
	MaxPatternInput = 64 << 10
)

// lapdRegexp is the validator's regexp: Go's regexp plus its program size.
type lapdRegexp struct {
	*regexp.Regexp
	prog int
}

// compileRegexp is the compiler's RegexpEngine: Go syntax (RE2), with the
// source and compiled program capped.
func compileRegexp(s string) (jsonschema.Regexp, error) {
	if len(s) > MaxPatternLen {
		return nil, fmt.Errorf("pattern is %d bytes, over the %d byte limit", len(s), MaxPatternLen)
	}
	re, err := syntax.Parse(s, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	if len(prog.Inst) > MaxPatternProgram {
		return nil, fmt.Errorf("pattern %.40q compiles to %d instructions, over the limit of %d; simplify it (fewer counted repetitions)", s, len(prog.Inst), MaxPatternProgram)
	}
	r, err := regexp.Compile(s)
	if err != nil {
		return nil, err
	}
	return &lapdRegexp{Regexp: r, prog: len(prog.Inst)}, nil
}

// costCheck walks msg the way the validator will, over-approximating (every
// branch of anyOf/oneOf/if is taken, every patternProperty matches), and
// counts the work; it stops at the first budget overrun. A msg within
// budget here is within budget in the validator.
type costCheck struct {
	steps int
	regex int
	path  []string
	fail  string // why the budget ran out (a sentence)
}

func (c *costCheck) over() bool { return c.fail != "" }

func (c *costCheck) step(n int) bool {
	c.steps -= n
	if c.steps < 0 && c.fail == "" {
		c.fail = fmt.Sprintf("the payload is too complex to check against this action's schema (over %d steps); send a smaller payload", MaxCheckSteps)
	}
	return !c.over()
}

func (c *costCheck) pointer() string {
	if len(c.path) == 0 {
		return "(payload)"
	}
	return pointer(c.path)
}

func (c *costCheck) match(re jsonschema.Regexp, s string) bool {
	r, ok := re.(*lapdRegexp)
	prog := 1
	if ok {
		prog = r.prog
	}
	if len(s) > MaxPatternInput {
		if c.fail == "" {
			c.fail = fmt.Sprintf("%s: string of %d bytes is too long to check against a pattern (limit %d bytes)", c.pointer(), len(s), MaxPatternInput)
		}
		return false
	}
	c.regex -= max(len(s), 1) * prog
	if c.regex < 0 && c.fail == "" {
		c.fail = fmt.Sprintf("%s: the payload's strings are too long to check against this action's patterns (over %d units of regex work); send shorter strings", c.pointer(), MaxRegexWork)
	}
	return !c.over()
}

// checkCost reports "" when validating v against s stays within budget,
// else a sentence saying what is too big.
func checkCost(s *jsonschema.Schema, v any) string {
	c := &costCheck{steps: MaxCheckSteps, regex: MaxRegexWork}
	c.visit(s, v, nil)
	return c.fail
}

// visit counts s applied to v; chain holds the schemas applied in place to v
// so far (an in-place cycle is the validator's error, not a loop).
func (c *costCheck) visit(s *jsonschema.Schema, v any, chain []*jsonschema.Schema) {
	if s == nil || c.over() || !c.step(1) {
		return
	}
	if s.Bool != nil {
		return
	}
	for _, x := range chain {
		if x == s {
			return
		}
	}
	if s.Types != nil && !s.Types.IsEmpty() && !typeAllows(typeNames(*s.Types), v) {
		return // the validator stops at the type
	}
	if s.Enum != nil && !c.step(len(s.Enum.Values)) {
		return
	}
	if s.Format != nil {
		if str, ok := v.(string); ok && !c.step(len(str)/64) {
			return
		}
	}
	chain = append(chain, s)
	for _, sub := range []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else} {
		c.visit(sub, v, chain)
	}
	if s.DynamicRef != nil {
		c.visit(s.DynamicRef.Ref, v, chain)
	}
	for _, list := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for _, sub := range list {
			c.visit(sub, v, chain)
		}
	}
	switch v := v.(type) {
	case map[string]any:
		c.object(s, v, chain)
	case []any:
		c.array(s, v)
	case string:
		if s.Pattern != nil {
			c.match(s.Pattern, v)
		}
		if s.MinLength != nil || s.MaxLength != nil {
			c.step(len(v) / 64)
		}
	}
}

func (c *costCheck) object(s *jsonschema.Schema, obj map[string]any, chain []*jsonschema.Schema) {
	for name, dep := range s.Dependencies {
		if sub, ok := dep.(*jsonschema.Schema); ok {
			if _, present := obj[name]; present {
				c.visit(sub, obj, chain)
			}
		}
	}
	for name, sub := range s.DependentSchemas {
		if _, present := obj[name]; present {
			c.visit(sub, obj, chain)
		}
	}
	c.step(len(s.Required))
	for name, val := range obj {
		if c.over() {
			return
		}
		c.path = append(c.path, name)
		c.visit(s.Properties[name], val, nil)
		for re, sub := range s.PatternProperties {
			if !c.match(re, name) { // over budget
				break
			}
			c.visit(sub, val, nil) // as if it matched
		}
		if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
			c.visit(sub, val, nil)
		}
		c.visit(s.PropertyNames, name, nil)
		c.visit(s.UnevaluatedProperties, val, nil)
		c.path = c.path[:len(c.path)-1]
	}
}

func (c *costCheck) array(s *jsonschema.Schema, arr []any) {
	if s.UniqueItems && !c.step(size(arr, c.steps)) {
		return
	}
	prefix := s.PrefixItems
	var rest []*jsonschema.Schema
	switch it := s.Items.(type) {
	case []*jsonschema.Schema:
		prefix = it
	case *jsonschema.Schema:
		rest = append(rest, it)
	}
	if sub, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		rest = append(rest, sub)
	}
	rest = append(rest, s.Items2020, s.Contains, s.UnevaluatedItems)
	for i, val := range arr {
		if c.over() {
			return
		}
		c.path = append(c.path, strconv.Itoa(i))
		if i < len(prefix) {
			c.visit(prefix[i], val, nil)
		}
		for _, sub := range rest {
			c.visit(sub, val, nil)
		}
		c.path = c.path[:len(c.path)-1]
	}
}

// size counts the values in v, stopping past limit.
func size(v any, limit int) int {
	n := 1
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			if n > limit {
				break
			}
			n += size(x, limit-n)
		}
	case []any:
		for _, x := range v {
			if n > limit {
				break
			}
			n += size(x, limit-n)
		}
	case string:
		n += len(v) / 64
	}
	return n
}

// typeNamesOf caches Types.ToStrings, which allocates, per distinct set of
// types (a few per policy): the check runs once per subschema per /message.
var typeNamesOf sync.Map // jsonschema.Types → []string

func typeNames(tt jsonschema.Types) []string {
	if v, ok := typeNamesOf.Load(tt); ok {
		return v.([]string)
	}
	names := tt.ToStrings()
	typeNamesOf.Store(tt, names)
	return names
}

// typeAllows reports whether the validator's "type" check lets v through
// (integer and number are not told apart: that only over-approximates).
func typeAllows(types []string, v any) bool {
	var t string
	switch v.(type) {
	case nil:
		t = "null"
	case bool:
		t = "boolean"
	case json.Number, float64:
		t = "number"
	case string:
		t = "string"
	case []any:
		t = "array"
	case map[string]any:
		t = "object"
	default:
		return true
	}
	for _, want := range types {
		if want == t || (want == "integer" && t == "number") {
			return true
		}
	}
	return false
}
