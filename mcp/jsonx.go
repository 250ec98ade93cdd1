package mcp

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// This file holds the few JSON primitives the lean renderer needs: split an
// object into its members, and write one, without decoding the values. LAP
// bodies carry the app's state (often the bulk of a result) and the executor
// only forwards it, so it is never decoded (reference/perf-notes.md: "don't
// decode what you only forward"). encoding/json has no API that yields a
// member's raw bytes without copying and validating every value, hence this
// small scanner. It assumes valid JSON (LAP bodies are produced by
// encoding/json or by lapd's own splicing of validated frames) and never
// panics on anything else: it reports false, and callers fall back to the
// body as it came.

// member is one key of a JSON object and its raw value (a sub-slice of the
// input: callers must not modify it).
type member struct {
	key string
	val []byte
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// The scanner looks bytes up in tables: a JSON text has a quote every few
// bytes, so its strings are short, too short for bytes.IndexByte's vector
// loop (or eight bytes at a time) to pay off; measured on observations.

// stopString marks the bytes that stop a scan inside a string.
var stopString = func() (t [256]bool) {
	t['"'], t['\\'] = true, true
	return t
}()

// structural classifies the bytes a container scan stops at.
var structural = func() (t [256]byte) {
	t['"'], t['{'], t['['], t['}'], t[']'] = sQuote, sOpen, sOpen, sClose, sClose
	return t
}()

const (
	sQuote = 1 + iota
	sOpen
	sClose
)

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, bool) {
	j := i + 1
	for {
		for j < len(b) && !stopString[b[j]] {
			j++
		}
		if j >= len(b) {
			return 0, false
		}
		if b[j] == '"' {
			return j + 1, true
		}
		j += 2 // an escape: its second byte never ends the string
	}
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch structural[b[i]] {
			case 0:
				i++
				continue
			case sQuote:
				j, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = j
				continue
			case sOpen:
				depth++
			case sClose:
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	default:
		j := i
		for j < len(b) && !isSpace(b[j]) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ':' {
			j++
		}
		if j == i {
			return 0, false
		}
		return j, true
	}
}

// members splits a JSON object into its members, in order. ok is false when
// b is not an object.
func members(b []byte) (out []member, ok bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, skipWS(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		j, ok := skipString(b, i)
		if !ok {
			return nil, false
		}
		key, ok := unquote(b[i:j])
		if !ok {
			return nil, false
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipWS(b, i+1)
		j, ok = skipValue(b, i)
		if !ok {
			return nil, false
		}
		if out == nil {
			out = make([]member, 0, 8) // the objects read here have a few members
		}
		out = append(out, member{key, b[i:j]})
		i = skipWS(b, j)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			if skipWS(b, i+1) != len(b) {
				return nil, false
			}
			return out, true
		default:
			return nil, false
		}
	}
}

// elements splits a JSON array into its elements. ok is false when b is not an array.
func elements(b []byte) (out [][]byte, ok bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil, skipWS(b, i+1) == len(b)
	}
	for {
		j, ok := skipValue(b, i)
		if !ok {
			return nil, false
		}
		out = append(out, b[i:j])
		i = skipWS(b, j)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			if skipWS(b, i+1) != len(b) {
				return nil, false
			}
			return out, true
		default:
			return nil, false
		}
	}
}

// unquote decodes a JSON string literal (with its quotes).
func unquote(q []byte) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	if k, ok := knownKeys[string(q[1:len(q)-1])]; ok {
		return k, true
	}
	if bytes.IndexByte(q, '\\') < 0 && utf8.Valid(q) {
		return string(q[1 : len(q)-1]), true
	}
	// Escapes, or invalid UTF-8 (which encoding/json turns into U+FFFD, as
	// it must here too, so that the key reads the same everywhere).
	var s string
	if json.Unmarshal(q, &s) != nil {
		return "", false
	}
	return s, true
}

// knownKeys are the keys of LAP bodies this package reads, shared rather
// than allocated for every member of every observation.
var knownKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"state", "actions", "description", "context", "health", "name", "version", "schemaHash",
		"docs", "stateSchema", "messages", "variant", "intent", "source", "requiresConfirm",
		"dispatchMode", "payloadHint", "fieldHints", "available", "unavailableReason",
		"selectorHint", "warning", "examples", "emits", "type", "path", "hint", "summary", "hints",
		"connected", "visible", "status", "stateDiff", "drain", "op", "value", "from",
	} {
		m[k] = k
	}
	return m
}()

// get returns the value of key in ms (nil when absent).
func get(ms []member, key string) []byte {
	for _, m := range ms {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

// jstr decodes a string value ("" when v is not a string).
func jstr(v []byte) string {
	s, _ := unquote(bytes.TrimSpace(v))
	return s
}

// isEmpty reports whether v is absent, null, "", [], {} or false-ish empty.
func isEmpty(v []byte) bool {
	v = bytes.TrimSpace(v)
	switch len(v) {
	case 0:
		return true
	case 2:
		return string(v) == `""` || string(v) == "[]" || string(v) == "{}"
	case 4:
		return string(v) == "null"
	}
	if v[0] == '[' || v[0] == '{' {
		return skipWS(v, 1) == len(v)-1
	}
	return false
}

func isTrue(v []byte) bool { return string(bytes.TrimSpace(v)) == "true" }

// objw writes a JSON object member by member into a byte slice.
type objw struct {
	b []byte
	n int
}

func newObj(b []byte) *objw { return &objw{b: append(b, '{')} }

func (o *objw) key(k string) {
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = strconv.AppendQuote(o.b, k) // keys here are ASCII identifiers
	o.b = append(o.b, ':')
}

// raw writes k with an already-encoded value.
func (o *objw) raw(k string, v []byte) {
	o.key(k)
	o.b = append(o.b, v...)
}

func (o *objw) str(k, v string) {
	o.key(k)
	o.b = appendString(o.b, v)
}

func (o *objw) bool(k string, v bool) {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

func (o *objw) int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

func (o *objw) close() []byte { return append(o.b, '}') }

// appendString appends v as a JSON string.
func appendString(b []byte, v string) []byte { return appendJSONString(b, v) }

const hexDigits = "0123456789abcdef"

// jsonEscape classifies a byte for appendJSONString: 0 is copied as it is;
// '"', '\\', 'n', 'r', 't' are the second byte of a two-byte escape; escU
// (the other control characters) becomes \u00XX; escRune starts a
// multi-byte (or invalid) UTF-8 sequence.
var jsonEscape = func() (t [256]byte) {
	for c := 0; c < 0x20; c++ {
		t[c] = escU
	}
	t['"'], t['\\'], t['\n'], t['\r'], t['\t'] = '"', '\\', 'n', 'r', 't'
	for c := utf8.RuneSelf; c < 0x100; c++ {
		t[c] = escRune
	}
	return t
}()

const (
	escU    = 1
	escRune = 2
)

// appendJSONString appends src as a JSON string literal, as encoding/json
// would but without its HTML escaping (results are read by models and
// clients, never embedded in HTML): quotes, backslashes and control
// characters are escaped, U+2028 and U+2029 too, and each byte of invalid
// UTF-8 becomes U+FFFD.
//
// It is the text copy of every result (the whole structuredContent, JSON,
// so a quote every few bytes): one table look-up per byte, into room made
// once, measured faster on such text than copying the runs between escapes
// or testing eight bytes at a time (BenchmarkAppendJSONString).
func appendJSONString[T string | []byte](b []byte, src T) []byte {
	b = slices.Grow(b, len(src)+len(src)/4+2)
	b = append(b, '"')
	for i := 0; i < len(src); {
		c := src[i]
		switch e := jsonEscape[c]; e {
		case 0:
			b = append(b, c)
			i++
			continue
		case escU:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			i++
			continue
		case escRune:
		default:
			b = append(b, '\\', e)
			i++
			continue
		}
		var r rune
		var size int
		switch s := any(src).(type) {
		case string:
			r, size = utf8.DecodeRuneInString(s[i:])
		case []byte:
			r, size = utf8.DecodeRune(s[i:])
		}
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			b = append(b, src[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
