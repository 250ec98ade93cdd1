// Package jsonscan validates JSON and splits an object into its top-level
// members in one pass, without decoding the values.
//
// lapd forwards what a tab answers (an observe result is ~10 KiB of app
// state) without decoding it, but it must still know that the frame is JSON
// and find the frame's envelope fields. encoding/json does that with two
// full passes over the bytes — checkValid, then the decoder skipping each
// json.RawMessage — at ~100 MB/s, which was 40% of lapd's CPU per /observe
// (see docs/PERFORMANCE.md). This package does it in one pass, ~10× faster:
//
//	ok := jsonscan.Object(frame, func(key, value []byte) {
//		switch string(key) {
//		case "t":
//			t, _ = jsonscan.String(value)
//		case "result":
//			result = value // raw bytes, aliasing frame
//		}
//	})
//
// It accepts exactly what json.Valid accepts (the RFC 8259 grammar, nesting
// at most MaxDepth; like encoding/json it does not check UTF-8), which a
// differential fuzz test against encoding/json pins. Keys are passed raw
// (between the quotes); a key with escapes or non-ASCII bytes is decoded as
// encoding/json decodes it first. A
// key that appears twice is reported twice (the last one wins for a caller
// that assigns, as with encoding/json).
package jsonscan

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting accepted (encoding/json's limit).
const MaxDepth = 10000

// Valid reports whether b is exactly one JSON value (with optional
// surrounding white space).
func Valid(b []byte) bool {
	i, ok := value(b, skipWS(b, 0), MaxDepth)
	return ok && skipWS(b, i) == len(b)
}

// Object reports whether b is exactly one JSON object and calls fn for each
// of its top-level members, in order, with the key (unescaped, without
// quotes) and the raw value (trimmed, aliasing b). fn is called only while
// the object is valid so far; when Object returns false, the members
// already reported belong to an invalid document and must be discarded.
func Object(b []byte, fn func(key, value []byte)) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ks := i
		var ok bool
		if i, ok = str(b, i); !ok {
			return false
		}
		key := b[ks+1 : i-1]
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		vs := i
		if i, ok = value(b, i, MaxDepth-1); !ok { // inside the outer container
			return false
		}
		if needsDecode(key) {
			var k string
			if json.Unmarshal(b[ks:ks+len(key)+2], &k) != nil {
				return false
			}
			key = []byte(k)
		}
		fn(key, b[vs:i])
		i = skipWS(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// Array reports whether b is exactly one JSON array and calls fn for each of
// its elements, in order, with the raw value (trimmed, aliasing b). As with
// Object, fn is called only while the array is valid so far.
func Array(b []byte, fn func(value []byte)) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		vs := i
		var ok bool
		if i, ok = value(b, i, MaxDepth-1); !ok { // inside the outer container
			return false
		}
		fn(b[vs:i])
		i = skipWS(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// String returns the string a raw JSON string value holds; ok is false when
// v is not a string.
func String(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if !hasEscape(inner) {
		for _, c := range inner {
			if c >= utf8.RuneSelf { // let encoding/json replace invalid UTF-8, as it always has
				var s string
				if json.Unmarshal(v, &s) != nil {
					return "", false
				}
				return s, true
			}
		}
		return string(inner), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// Bool returns the value of a raw JSON true or false.
func Bool(v []byte) (b, ok bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// Float returns the value of a raw JSON number.
func Float(v []byte) (float64, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil
}

// needsDecode reports whether a raw key must go through encoding/json to
// read as encoding/json reads it (escapes; invalid UTF-8 becomes U+FFFD).
func needsDecode(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

func hasEscape(b []byte) bool {
	for _, c := range b {
		if c == '\\' {
			return true
		}
	}
	return false
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value skips the value starting at b[i] (no leading white space) and
// returns the index after it. Containers are walked with an explicit stack,
// so nesting costs no Go stack.
func value(b []byte, i int, maxDepth int) (int, bool) {
	var fixed [64]byte
	stack := fixed[:0] // '{' or '[' per open container
	var ok bool
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; {
		case c == '"':
			if i, ok = str(b, i); !ok {
				return i, false
			}
		case c == '{':
			if len(stack) >= maxDepth { // an empty container counts too
				return i, false
			}
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			stack = append(stack, '{')
			if i, ok = memberKey(b, i); !ok {
				return i, false
			}
			continue
		case c == '[':
			if len(stack) >= maxDepth { // an empty container counts too
				return i, false
			}
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			stack = append(stack, '[')
			continue
		case c == '-' || (c >= '0' && c <= '9'):
			if i, ok = number(b, i); !ok {
				return i, false
			}
		case c == 't':
			if i, ok = literal(b, i, "true"); !ok {
				return i, false
			}
		case c == 'f':
			if i, ok = literal(b, i, "false"); !ok {
				return i, false
			}
		case c == 'n':
			if i, ok = literal(b, i, "null"); !ok {
				return i, false
			}
		default:
			return i, false
		}
		// A value ended at i: close containers until the next value starts.
		for {
			if len(stack) == 0 {
				return i, true
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, false
			}
			top := stack[len(stack)-1]
			if b[i] == ',' {
				i = skipWS(b, i+1)
				if top == '{' {
					if i, ok = memberKey(b, i); !ok {
						return i, false
					}
				}
				break
			}
			if (top == '{' && b[i] == '}') || (top == '[' && b[i] == ']') {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return i, false
		}
	}
}

// memberKey skips `"key" :` and the white space after it.
func memberKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := str(b, i)
	if !ok {
		return i, false
	}
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return skipWS(b, i+1), true
}

const (
	lo7  = 0x0101010101010101
	hi7  = 0x8080808080808080
	quot = '"' * lo7
	bsl  = '\\' * lo7
	ctl  = 0x20 * lo7
)

// plain reports whether none of the 8 bytes in w is '"', '\\' or < 0x20.
func plain(w uint64) bool {
	// hasless(w, 0x20) and haszero(w^x): the classic SWAR tests.
	less := (w - ctl) & ^w & hi7
	q := (w ^ quot)
	hasQ := (q - lo7) & ^q & hi7
	s := (w ^ bsl)
	hasS := (s - lo7) & ^s & hi7
	return less|hasQ|hasS == 0
}

// special marks the bytes a string cannot hold as they are: '"', '\\'
// and the control characters.
var special = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str skips the string starting at b[i] == '"'.
func str(b []byte, i int) (int, bool) {
	i++
	for {
		for i+8 <= len(b) {
			if !plain(binary.LittleEndian.Uint64(b[i:])) {
				break
			}
			i += 8
		}
		if i >= len(b) {
			return i, false
		}
		// Plain bytes one at a time up to the special one (within 8).
		for i < len(b) && !special[b[i]] {
			i++
		}
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, false
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return i, false
					}
				}
				i += 6
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default:
			i++
		}
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// number skips -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i].
func number(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, false
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, false
		}
	}
	return i, true
}

func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}
