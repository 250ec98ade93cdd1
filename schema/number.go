package schema

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Bounds on a JSON number in a payload that is validated and anywhere in a
// policy's schemas. The validator (jsonschema v6) reads every number with
// big.Rat.SetString, whose cost grows with the decimal exponent: Go accepts
// exponents up to 1e6, and one 1e1000000 costs about 16 ms and 415 KB, in
// "type":"integer", minimum, multipleOf, enum, const and uniqueItems alike
// (a 5 KB payload of them took 8.5 s of CPU; 100 such keywords in a 7 KB
// policy took 6.3 s to compile and kept 120 MB). The cost pass counts a
// number as one step, which holds only for bounded numbers.
//
// The bounds lose nothing an app can use: the app runs in JavaScript, which
// reads every number as a 64-bit float. A literal of at most MaxNumberLen
// bytes has at most 63 significant digits, so with an exponent beyond
// +MaxNumberExponent its value is over 1e337 (float64 overflows past
// 1.8e308: JavaScript reads Infinity) and beyond −MaxNumberExponent it is
// under 1e-337 (below the smallest subnormal, 4.9e-324: it reads ±0).
// JSON.stringify never writes a number over 24 characters or an exponent
// past ±324. Within the bounds, the largest value the validator builds is
// 10^463 (a 64-character literal with exponent −400), about 1,540 bits:
// each big.Rat operation on it takes microseconds and a few hundred bytes.
const (
	MaxNumberLen      = 64  // bytes of one number literal
	MaxNumberExponent = 400 // |the decimal exponent| written after e or E
)

// numberRule is the sentence a refusal ends with.
var numberRule = fmt.Sprintf("numbers must fit a 64-bit float (|exponent| ≤ %d, ≤ %d characters), as JavaScript reads them", MaxNumberExponent, MaxNumberLen)

// numberOK reports whether the JSON number literal n is within the bounds.
// It reads at most MaxNumberLen bytes: cheap enough for every number of
// every payload.
func numberOK(n string) bool {
	if len(n) > MaxNumberLen {
		return false
	}
	for i := 0; i < len(n); i++ {
		if n[i]|0x20 != 'e' {
			continue
		}
		exp := 0
		for _, c := range []byte(n[i+1:]) { // the sign, then digits
			if c >= '0' && c <= '9' {
				if exp = exp*10 + int(c-'0'); exp > MaxNumberExponent {
					return false
				}
			}
		}
		return true
	}
	return true
}

// hasBadNumber reports whether a decoded value holds a number out of
// bounds (no allocation: the walk of a payload that passes).
func hasBadNumber(v any) bool {
	switch x := v.(type) {
	case json.Number:
		return !numberOK(string(x))
	case map[string]any:
		for _, e := range x {
			if hasBadNumber(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if hasBadNumber(e) {
				return true
			}
		}
	}
	return false
}

// badNumbers lists the numbers out of bounds in v (at most maxFieldErrors),
// walking object members in key order so the same payload always reads the
// same; path is v's JSON Pointer tokens.
func badNumbers(v any, path []string, out []FieldError) []FieldError {
	if len(out) >= maxFieldErrors {
		return out
	}
	switch x := v.(type) {
	case json.Number:
		if !numberOK(string(x)) {
			out = append(out, FieldError{Path: pointer(path), Code: CodeValidatesFailed, Message: numberMessage(string(x))})
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = badNumbers(x[k], append(path, k), out)
		}
	case []any:
		for i, e := range x {
			out = badNumbers(e, append(path, strconv.Itoa(i)), out)
		}
	}
	return out
}

// numberRejection is the schema-error Rejection for a payload v holding
// numbers out of bounds: each in Errors, the first few paths and the rule in
// Detail.
func numberRejection(v any) *Rejection {
	fes := badNumbers(v, nil, nil)
	paths := make([]string, 0, maxDetailErrors)
	for _, fe := range fes[:min(len(fes), maxDetailErrors)] {
		path := fe.Path
		if path == "" {
			path = "(payload)"
		}
		paths = append(paths, path)
	}
	more := ""
	if len(fes) > maxDetailErrors {
		more = " and more"
	}
	what := "number"
	if len(fes) > 1 {
		what = "numbers"
	}
	r := reject(ReasonSchemaError, fmt.Sprintf("%s%s: %s out of range; %s", strings.Join(paths, ", "), more, what, numberRule))
	r.Errors = fes
	return r
}

// numberMessage says what is wrong with the number n.
func numberMessage(n string) string {
	return fmt.Sprintf("number %s is out of range: %s", truncate(n, 24), numberRule)
}
