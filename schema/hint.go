package schema

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// Hints are built lazily (the first PayloadHint of a variant) and under a
// budget, because a policy is untrusted: a schema whose required properties
// $ref the root would otherwise expand exponentially.
const (
	maxHintDepth = 16
	maxHintNodes = 2000    // schema nodes visited for one hint
	maxHintBytes = 8 << 10 // a bigger hint is replaced by {}
)

// hinter builds one hint: budget left, and the $refs being expanded (a $ref
// already on the path is a cycle and is never expanded again).
type hinter struct {
	root   map[string]any
	budget int
	refs   []string
}

// payloadHint builds the skeleton payload for a compiled schema document.
func payloadHint(doc any) json.RawMessage {
	if doc == nil {
		return json.RawMessage(`{}`)
	}
	root, _ := doc.(map[string]any)
	h := &hinter{root: root, budget: maxHintNodes}
	v, ok := h.hintFor(doc, 0)
	if _, isObj := v.(map[string]any); !ok || !isObj {
		return json.RawMessage(`{}`)
	}
	b, err := json.Marshal(v)
	if err != nil || len(b) > maxHintBytes {
		return json.RawMessage(`{}`)
	}
	return b
}

// enter follows a local $ref, unless it is already being expanded or the
// budget is spent; leave must be called after a successful enter.
func (h *hinter) enter(ref string) (any, bool) {
	if slices.Contains(h.refs, ref) {
		return nil, false
	}
	target, ok := resolveLocal(h.root, ref)
	if !ok {
		return nil, false
	}
	h.refs = append(h.refs, ref)
	return target, true
}

func (h *hinter) leave() { h.refs = h.refs[:len(h.refs)-1] }

// hintFor returns a placeholder for a value valid against s, or false when
// it cannot tell one without guessing (or only null would do), or the
// budget is spent.
func (h *hinter) hintFor(s any, depth int) (any, bool) {
	m, ok := s.(map[string]any)
	if !ok || depth > maxHintDepth || h.budget <= 0 {
		return nil, false
	}
	h.budget--
	for _, kw := range []string{"const", "default"} {
		if v, ok := m[kw]; ok && v != nil {
			return v, true
		}
	}
	for _, kw := range []string{"examples", "enum"} {
		if vs, ok := m[kw].([]any); ok {
			for _, v := range vs {
				if v != nil {
					return v, true
				}
			}
		}
	}
	if ref, ok := m["$ref"].(string); ok {
		target, ok := h.enter(ref)
		if !ok {
			return nil, false
		}
		defer h.leave()
		return h.hintFor(target, depth+1)
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		if branches, ok := m[kw].([]any); ok {
			for _, b := range branches {
				if v, ok := h.hintFor(b, depth+1); ok {
					return v, true
				}
			}
		}
	}
	typ := schemaType(m)
	if typ == "" {
		if _, ok := m["properties"]; ok {
			typ = "object"
		} else if _, ok := m["allOf"]; ok {
			typ = "object"
		}
	}
	switch typ {
	case "object":
		obj := map[string]any{}
		h.fillObject(obj, m, depth)
		return obj, true
	case "array":
		if n, _ := number(m["minItems"]); n > 0 {
			if v, ok := h.hintFor(m["items"], depth+1); ok {
				return []any{v}, true
			}
		}
		return []any{}, true
	case "string":
		return stringHint(m), true
	case "integer", "number":
		if n, ok := number(m["minimum"]); ok {
			return n, true
		}
		if n, ok := number(m["exclusiveMinimum"]); ok {
			return n + 1, true
		}
		return 0, true
	case "boolean":
		return false, true
	}
	return nil, false
}

// fillObject adds the required properties of m (and of its allOf branches).
func (h *hinter) fillObject(obj, m map[string]any, depth int) {
	props, _ := m["properties"].(map[string]any)
	req, _ := m["required"].([]any)
	for _, r := range req {
		name, ok := r.(string)
		if !ok || h.budget <= 0 {
			continue
		}
		if _, done := obj[name]; done {
			continue
		}
		if v, ok := h.hintFor(props[name], depth+1); ok {
			obj[name] = v
		}
	}
	all, ok := m["allOf"].([]any)
	if !ok || depth >= maxHintDepth {
		return
	}
	for _, b := range all {
		if h.budget <= 0 {
			return
		}
		h.budget--
		bm, _ := b.(map[string]any)
		if ref, ok := bm["$ref"].(string); ok {
			target, ok := h.enter(ref)
			if !ok {
				continue
			}
			if tm, ok := target.(map[string]any); ok {
				h.fillObject(obj, tm, depth+1)
			}
			h.leave()
			continue
		}
		if bm != nil {
			h.fillObject(obj, bm, depth+1)
		}
	}
}

func schemaType(m map[string]any) string {
	switch t := m["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok && s != "null" {
				return s
			}
		}
	}
	return ""
}

func stringHint(m map[string]any) string {
	switch m["format"] {
	case "date-time":
		return "2025-01-01T00:00:00Z"
	case "date":
		return "2025-01-01"
	case "email":
		return "user@example.com"
	case "uri", "url":
		return "https://example.com"
	case "uuid":
		return "00000000-0000-0000-0000-000000000000"
	}
	if n, _ := number(m["minLength"]); n > 0 {
		return strings.Repeat("x", int(min(n, 16)))
	}
	return ""
}

func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	return f, err == nil
}

// resolveLocal follows a "#/…" JSON Pointer inside root.
func resolveLocal(root map[string]any, ref string) (any, bool) {
	if ref == "#" {
		return root, root != nil
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil, false
	}
	var cur any = root
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[tok]; !ok {
			return nil, false
		}
	}
	return cur, true
}
