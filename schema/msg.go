package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/internal/jsonscan"
)

// ErrBadMsg is wrapped by every SplitMsg error.
var ErrBadMsg = errors.New("schema: bad msg")

// SplitMsg is the one place lapd reads a msg's variant: it decodes the
// top-level object of msg by exact key and returns the string value of its
// discriminant field ("" means DefaultDiscriminant) and the payload, msg
// without that field (the other members in their order, values byte for
// byte).
//
// Everything that acts on a msg (policy, audit, stored approvals, the
// payload re-delivered to the tab) must take the variant from here: a
// case-insensitive decode (Go's encoding/json into a struct) would read
// {"type":"clearAll","Type":"resetDemo"} as resetDemo while the tab, which
// reads the exact key, runs clearAll. So SplitMsg refuses, with an error
// wrapping ErrBadMsg whose text says what to send instead:
//   - a msg that is not one JSON object, or whose discriminant is missing or
//     not a string;
//   - a discriminant given twice;
//   - any other member whose name equals the discriminant under Unicode case
//     folding ("Type", "TYPE", and for a discriminant with a k or s the
//     Kelvin sign and long s forms), since a decoder on the way may read it
//     as the discriminant.
func SplitMsg(msg json.RawMessage, discriminant string) (variant string, payload json.RawMessage, err error) {
	if discriminant == "" {
		discriminant = DefaultDiscriminant
	}
	// One pass with jsonscan; a msg that is not exactly one valid JSON
	// object goes to the decoder below, whose errors say where it fails.
	found := false
	var first error // the first refusal, in member order (as the decoder meets it)
	out := make([]byte, 1, len(msg)+1)
	out[0] = '{'
	ok := jsonscan.Object(msg, func(key, val []byte) {
		if first != nil {
			return
		}
		switch {
		case string(key) == discriminant:
			if found {
				first = badMsg("msg has %q twice; send it once", discriminant)
				return
			}
			v, ok := jsonscan.String(val)
			if !ok && string(val) != "null" { // null reads as "", as json.Unmarshal into a string does
				first = badMsg("msg.%s must be a string", discriminant)
				return
			}
			variant, found = v, true
			return
		case strings.EqualFold(string(key), discriminant):
			first = badMsg("msg has a field %.40q: name the variant in %q only, and no other field that differs from it only in case (field names are case-sensitive)", string(key), discriminant)
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendKey(out, key)
		out = append(out, ':')
		out = append(out, val...)
	})
	switch {
	case !ok:
		return splitMsgDecoder(msg, discriminant)
	case first != nil:
		return "", nil, first
	case !found:
		return badMsg3("msg.%s must be a string", discriminant)
	}
	return variant, append(out, '}'), nil
}

func badMsg(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadMsg}, a...)...)
}

func badMsg3(format string, a ...any) (string, json.RawMessage, error) {
	return "", nil, badMsg(format, a...)
}

// appendKey appends key as json.Marshal writes the string (HTML-safe).
func appendKey(out, key []byte) []byte {
	for _, c := range key {
		if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			kb, _ := json.Marshal(string(key))
			return append(out, kb...)
		}
	}
	out = append(out, '"')
	out = append(out, key...)
	return append(out, '"')
}

// splitMsgDecoder is SplitMsg with encoding/json's streaming decoder: the
// reference for the one-pass version (FuzzSplitMsg compares them) and its
// path for invalid JSON.
func splitMsgDecoder(msg json.RawMessage, discriminant string) (variant string, payload json.RawMessage, err error) {
	bad := func(format string, a ...any) (string, json.RawMessage, error) {
		return "", nil, fmt.Errorf("%w: "+format, append([]any{ErrBadMsg}, a...)...)
	}
	dec := json.NewDecoder(bytes.NewReader(msg))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad("msg.%s must be a string (msg must be a JSON object)", discriminant)
	}
	out := make([]byte, 0, len(msg))
	out = append(out, '{')
	found := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad("msg.%s must be a string (msg is not valid JSON)", discriminant)
		}
		name, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return bad("msg.%s must be a string (msg is not valid JSON)", discriminant)
		}
		switch {
		case name == discriminant:
			if found {
				return bad("msg has %q twice; send it once", discriminant)
			}
			if err := json.Unmarshal(val, &variant); err != nil {
				return bad("msg.%s must be a string", discriminant)
			}
			found = true
			continue
		case strings.EqualFold(name, discriminant):
			return bad("msg has a field %.40q: name the variant in %q only, and no other field that differs from it only in case (field names are case-sensitive)", name, discriminant)
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		kb, _ := json.Marshal(name)
		out = append(out, kb...)
		out = append(out, ':')
		out = append(out, val...)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return bad("msg.%s must be a string (msg is not valid JSON)", discriminant)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("msg.%s must be a string (msg must be one JSON object)", discriminant)
	}
	if !found {
		return bad("msg.%s must be a string", discriminant)
	}
	return variant, append(out, '}'), nil
}
