package schema

import (
	"encoding/json"
	"strconv"
	"strings"
)

const maxHintDepth = 16

// payloadHint builds the skeleton payload for a compiled schema document.
func payloadHint(doc any) json.RawMessage {
	root, _ := doc.(map[string]any)
	h, ok := hintFor(doc, root, 0)
	if _, isObj := h.(map[string]any); !ok || !isObj {
		return json.RawMessage(`{}`)
	}
	b, err := json.Marshal(h)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

// hintFor returns a placeholder for a value valid against s, or false when
// it cannot tell one without guessing (or only null would do).
func hintFor(s any, root map[string]any, depth int) (any, bool) {
	m, ok := s.(map[string]any)
	if !ok || depth > maxHintDepth {
		return nil, false
	}
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
		if target, ok := resolveLocal(root, ref); ok {
			return hintFor(target, root, depth+1)
		}
		return nil, false
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		if branches, ok := m[kw].([]any); ok {
			for _, b := range branches {
				if h, ok := hintFor(b, root, depth+1); ok {
					return h, true
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
		fillObject(obj, m, root, depth)
		return obj, true
	case "array":
		if n, _ := number(m["minItems"]); n > 0 {
			if h, ok := hintFor(m["items"], root, depth+1); ok {
				return []any{h}, true
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
func fillObject(obj, m, root map[string]any, depth int) {
	props, _ := m["properties"].(map[string]any)
	req, _ := m["required"].([]any)
	for _, r := range req {
		name, ok := r.(string)
		if !ok {
			continue
		}
		if _, done := obj[name]; done {
			continue
		}
		if h, ok := hintFor(props[name], root, depth+1); ok {
			obj[name] = h
		}
	}
	if all, ok := m["allOf"].([]any); ok && depth < maxHintDepth {
		for _, b := range all {
			if bm, ok := b.(map[string]any); ok {
				if ref, ok := bm["$ref"].(string); ok {
					if t, ok := resolveLocal(root, ref); ok {
						bm, _ = t.(map[string]any)
					}
				}
				if bm != nil {
					fillObject(obj, bm, root, depth+1)
				}
			}
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
