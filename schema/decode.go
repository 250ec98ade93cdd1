package schema

import (
	"bytes"
	"encoding/json"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/lapd-dev/lapd/internal/jsonscan"
)

// Payloads up to these bounds are decoded for the validator with jsonscan;
// larger or deeper ones with jsonschema.UnmarshalJSON (a json.Decoder). A
// nested value is scanned once per level above it, so the bounds keep the
// fast path's worst case near the decoder's.
const (
	fastDecodeBytes = 4 << 10
	fastDecodeDepth = 16
)

// decodePayload decodes a payload for the validator into what
// jsonschema.UnmarshalJSON returns (map[string]any, []any, json.Number,
// string, bool, nil; FuzzDecodePayload compares them), without a decoder's
// allocations for the usual small payload. bad is true when the payload
// holds a number out of bounds (numberOK): the validator must not see it.
func decodePayload(payload []byte) (v any, bad bool, err error) {
	if len(payload) <= fastDecodeBytes {
		if v, ok := decodeValue(payload, 0); ok {
			return v, false, nil // its numbers were checked as they were read
		}
	}
	v, err = jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return nil, false, err
	}
	return v, hasBadNumber(v), nil
}

// decodeValue decodes one JSON value; ok is false when it is invalid,
// nested deeper than fastDecodeDepth, or holds a number out of bounds (the
// decoder's path then says where).
func decodeValue(v []byte, depth int) (any, bool) {
	v = bytes.TrimLeft(v, " \t\r\n")
	if len(v) == 0 || depth > fastDecodeDepth {
		return nil, false
	}
	switch v[0] {
	case '{':
		m := map[string]any{}
		good := true
		ok := jsonscan.Object(v, func(k, val []byte) {
			x, ok := decodeValue(val, depth+1)
			good = good && ok
			m[string(k)] = x
		})
		return m, ok && good
	case '[':
		a := []any{}
		good := true
		ok := jsonscan.Array(v, func(val []byte) {
			x, ok := decodeValue(val, depth+1)
			good = good && ok
			a = append(a, x)
		})
		return a, ok && good
	case '"':
		if !jsonscan.Valid(v) {
			return nil, false
		}
		return jsonscan.String(bytes.TrimRight(v, " \t\r\n"))
	}
	if !jsonscan.Valid(v) {
		return nil, false
	}
	v = bytes.TrimRight(v, " \t\r\n")
	switch v[0] {
	case 't':
		return true, true
	case 'f':
		return false, true
	case 'n':
		return nil, true
	}
	n := json.Number(v)
	return n, numberOK(string(n))
}
