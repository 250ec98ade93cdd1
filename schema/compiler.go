package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

const maxCompilerDepth = 32

// FromCompiler converts the reference compiler's msg schema (what a
// reference tab sends as hello.msgSchema) into an equivalent Policy:
//
//	{"discriminant":"type","variants":{"setFilter":{
//	   "kind":{"enum":["all","done"]},
//	   "q":{"type":"string","optional":true,"hint":"search text"}}}}
//
// Each variant is a map of field name to field spec. A spec is one of
// "string", "number", "boolean", "unknown" (any value, implicitly optional),
// {"enum":[…]}, {"kind":"object","shape":{…}}, {"kind":"array","element":spec},
// {"kind":"discriminated-union","discriminant":"k","variants":{"a":{…shape}}},
// or the rich wrapper {"type":spec, "optional", "hint", "priority",
// "validates"}. "hint" becomes the property's description. "validates" is a
// JavaScript expression the reference tab compiles with new Function; the
// server never evaluates JavaScript, so it is ignored here. Extra fields are
// allowed, as in the reference's default lenient mode. A spec of any other
// shape is an error naming its path: nothing is guessed.
//
// lapd does not enforce msgSchema by default (the reference tab enforces it
// leniently itself); FromCompiler is for embedding apps that opt in. The
// returned Policy has no annotations (the compiler sends them separately).
// JSON null or empty input gives a nil Policy.
func FromCompiler(msgSchema json.RawMessage) (*Policy, error) {
	msgSchema = bytes.TrimSpace(msgSchema)
	if len(msgSchema) == 0 || string(msgSchema) == "null" {
		return nil, nil
	}
	if len(msgSchema) > MaxPolicyBytes {
		return nil, fmt.Errorf("schema: msgSchema is %d bytes, over the %d byte limit", len(msgSchema), MaxPolicyBytes)
	}
	var in struct {
		Discriminant *string                    `json:"discriminant"`
		Variants     map[string]json.RawMessage `json:"variants"`
	}
	dec := json.NewDecoder(bytes.NewReader(msgSchema))
	dec.UseNumber()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("schema: msgSchema must be {\"discriminant\",\"variants\"}: %w", err)
	}
	if in.Variants == nil {
		return nil, errors.New(`schema: msgSchema has no "variants" object`)
	}
	if len(in.Variants) > MaxVariants {
		return nil, fmt.Errorf("schema: msgSchema has %d variants, over the limit of %d", len(in.Variants), MaxVariants)
	}
	out := map[string]any{}
	if in.Discriminant != nil {
		out["discriminant"] = *in.Discriminant
	}
	variants := map[string]any{}
	for name, raw := range in.Variants {
		var shape any
		if err := decodeNumber(raw, &shape); err != nil {
			return nil, fmt.Errorf("schema: msgSchema variant %q: %w", name, err)
		}
		s, err := convertShape(shape, "variants."+name, 0)
		if err != nil {
			return nil, fmt.Errorf("schema: msgSchema %w", err)
		}
		variants[name] = map[string]any{"schema": s}
	}
	out["variants"] = variants
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("schema: msgSchema: %w", err)
	}
	return Parse(raw)
}

func decodeNumber(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// convertShape turns a field map into an object schema.
func convertShape(shape any, path string, depth int) (map[string]any, error) {
	fields, ok := shape.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: a shape must be an object of field specs, got %s", path, describe(shape))
	}
	props := make(map[string]any, len(fields))
	required := []any{}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		s, optional, err := convertField(fields[name], path+"."+name, depth+1)
		if err != nil {
			return nil, err
		}
		props[name] = s
		if !optional {
			required = append(required, name)
		}
	}
	out := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		out["required"] = required
	}
	return out, nil
}

// convertField turns one field spec into a schema and tells whether the
// field may be absent.
func convertField(spec any, path string, depth int) (map[string]any, bool, error) {
	if depth > maxCompilerDepth {
		return nil, false, fmt.Errorf("%s: nested deeper than %d levels", path, maxCompilerDepth)
	}
	switch s := spec.(type) {
	case string:
		switch s {
		case "string", "number", "boolean":
			return map[string]any{"type": s}, false, nil
		case "unknown":
			return map[string]any{}, true, nil
		}
		return nil, false, fmt.Errorf("%s: unknown field type %.40q (want string, number, boolean or unknown)", path, s)
	case map[string]any:
		if enum, ok := s["enum"]; ok {
			vals, ok := enum.([]any)
			if !ok || len(vals) == 0 {
				return nil, false, fmt.Errorf("%s: enum must be a non-empty array", path)
			}
			return map[string]any{"enum": vals}, false, nil
		}
		if k, ok := s["kind"]; ok {
			out, err := convertKind(k, s, path, depth)
			return out, false, err
		}
		if t, ok := s["type"]; ok {
			return convertRich(t, s, path, depth)
		}
		return nil, false, fmt.Errorf("%s: unknown field spec with keys %s (want enum, kind or type)", path, keys(s))
	}
	return nil, false, fmt.Errorf("%s: unknown field spec %s", path, describe(spec))
}

func convertKind(k any, s map[string]any, path string, depth int) (map[string]any, error) {
	switch k {
	case "object":
		return convertShape(s["shape"], path, depth)
	case "array":
		el, ok := s["element"]
		if !ok {
			return nil, fmt.Errorf("%s: array without element", path)
		}
		items, _, err := convertField(el, path+"[]", depth+1)
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": "array", "items": items}, nil
	case "discriminated-union":
		disc, ok := s["discriminant"].(string)
		if !ok || disc == "" {
			return nil, fmt.Errorf("%s: discriminated-union without a string discriminant", path)
		}
		vs, ok := s["variants"].(map[string]any)
		if !ok || len(vs) == 0 {
			return nil, fmt.Errorf("%s: discriminated-union without variants", path)
		}
		names := make([]string, 0, len(vs))
		for name := range vs {
			names = append(names, name)
		}
		slices.Sort(names)
		enum := make([]any, len(names))
		branches := make([]any, len(names))
		for i, name := range names {
			shape, err := convertShape(vs[name], fmt.Sprintf("%s(%s=%s)", path, disc, name), depth+1)
			if err != nil {
				return nil, err
			}
			enum[i] = name
			branches[i] = map[string]any{
				"if":   map[string]any{"properties": map[string]any{disc: map[string]any{"const": name}}},
				"then": shape,
			}
		}
		return map[string]any{
			"type":       "object",
			"properties": map[string]any{disc: map[string]any{"enum": enum}},
			"required":   []any{disc},
			"allOf":      branches,
		}, nil
	}
	return nil, fmt.Errorf("%s: unknown kind %s (want object, array or discriminated-union)", path, describe(k))
}

func convertRich(t any, s map[string]any, path string, depth int) (map[string]any, bool, error) {
	out, implicitOptional, err := convertField(t, path, depth+1)
	if err != nil {
		return nil, false, err
	}
	optional := implicitOptional
	if o, ok := s["optional"]; ok {
		b, ok := o.(bool)
		if !ok {
			return nil, false, fmt.Errorf("%s: optional must be a boolean", path)
		}
		optional = optional || b
	}
	if h, ok := s["hint"].(string); ok && h != "" {
		out["description"] = h
	}
	return out, optional, nil
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%.40q", v)
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object with keys " + keys(v)
	}
	return fmt.Sprintf("%T", v)
}

func keys(m map[string]any) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	if len(ks) > 8 {
		ks = append(ks[:8], "…")
	}
	return "[" + strings.Join(ks, ", ") + "]"
}
