package lapdtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var printer = message.NewPrinter(language.English)

// App describes the app a Tab plays, the way a page describes itself to
// lapd.js's createAgent: a name, a state, the actions with their payload
// schemas and policy, and how each action changes the state.
//
//	app := lapdtest.App{
//		Name:  "Todo",
//		State: map[string]any{"todos": []any{}},
//		Actions: []lapdtest.Action{{
//			Variant: "add", Intent: "Add a task",
//			Schema:  json.RawMessage(`{"type":"object","properties":{"title":{"type":"string"}},"required":["title"]}`),
//			Apply: func(state any, msg map[string]any) (any, error) {
//				st := state.(map[string]any)
//				st["todos"] = append(st["todos"].([]any), msg["title"])
//				return st, nil
//			},
//		}},
//	}
//	tab, err := lapdtest.Dial(ctx, wsURL, token, lapdtest.WithApp(app))
//
// The tab sends hello with appName, appVersion, docs, msgSchema and policy
// built from Actions as lapd.js builds them, so the server enforces the
// same policy it would for the real page.
type App struct {
	Name    string // hello.appName; default "lapdtest"
	Version string // hello.appVersion; default "1.0.0"
	Docs    any    // hello.docs, e.g. {"purpose": "…"}; nil = none
	State   any    // the initial state (any JSON value); nil = {}
	Actions []Action
	// Reduce applies a msg whose Action has no Apply (a reducer-style app).
	// With neither, dispatching that action answers rejected/invalid.
	Reduce Reducer
}

// WithApp makes the tab play app (replacing the demo app).
func WithApp(app App) Option {
	return func(c *config) {
		if app.Name == "" {
			app.Name = "lapdtest"
		}
		if app.Version == "" {
			app.Version = "1.0.0"
		}
		c.hello.AppName, c.hello.AppVersion = app.Name, app.Version
		c.hello.Docs = nil
		if app.Docs != nil {
			c.hello.Docs, _ = json.Marshal(app.Docs)
		}
		c.state = app.State
		if c.state == nil {
			c.state = map[string]any{}
		}
		c.actions = append([]Action(nil), app.Actions...)
		c.reducer = appReducer(c.actions, app.Reduce)
		c.hello.Policy = BuildPolicy(c.actions)
		c.hello.MsgSchema = buildMsgSchema(c.actions)
		h := sha256.Sum256(bytes.Join([][]byte{c.hello.MsgSchema, c.hello.StateSchema, c.hello.Policy}, []byte{0}))
		c.hello.SchemaHash = hex.EncodeToString(h[:8])
	}
}

// appReducer routes a msg to its action's Apply, else to reduce.
func appReducer(actions []Action, reduce Reducer) Reducer {
	return func(state any, msg map[string]any) (any, error) {
		typ, _ := msg["type"].(string)
		for _, a := range actions {
			if a.Variant == typ && a.Apply != nil {
				return a.Apply(state, msg)
			}
		}
		if reduce != nil {
			return reduce(state, msg)
		}
		return nil, fmt.Errorf("no Apply for %q and no App.Reduce", typ)
	}
}

// DemoApp is the app a Tab plays by default, as an App: a counter and a todo
// list with inc, addTodo{title} (schema: a non-empty string title),
// clearAll (requires confirm) and reset (human-only).
func DemoApp() App {
	acts := DemoActions()
	for i := range acts {
		if acts[i].Variant == "addTodo" {
			acts[i].Schema = json.RawMessage(`{"type":"object","properties":{"title":{"type":"string","minLength":1}},"required":["title"],"additionalProperties":false}`)
		}
	}
	return App{
		Name:    "lapdtest",
		State:   map[string]any{"count": 0, "todos": []any{}},
		Docs:    map[string]any{"purpose": "A fake app for tests"},
		Actions: acts,
		Reduce:  demoReducer,
	}
}

// BuildPolicy is hello.policy for actions, as lapd.js's buildPolicy builds
// it: {"variants":{name:{intent?, schema?, requiresConfirm?, humanOnly?}}}.
func BuildPolicy(actions []Action) json.RawMessage {
	vars := map[string]any{}
	for _, a := range actions {
		v := map[string]any{}
		if a.Intent != "" {
			v["intent"] = a.Intent
		}
		if len(a.Schema) > 0 {
			v["schema"] = a.Schema
		}
		if a.RequiresConfirm {
			v["requiresConfirm"] = true
		}
		if a.HumanOnly {
			v["humanOnly"] = true
		}
		vars[a.Variant] = v
	}
	b, _ := json.Marshal(map[string]any{"variants": vars})
	return b
}

// buildMsgSchema is hello.msgSchema in the reference's compiler shape
// ({discriminant, variants: {name: {field: type | {type, optional}}}}),
// human-only variants included, as lapd.js sends it.
func buildMsgSchema(actions []Action) json.RawMessage {
	vars := map[string]any{}
	for _, a := range actions {
		vars[a.Variant] = compilerShape(decodeSchema(a.Schema), 0)
	}
	b, _ := json.Marshal(map[string]any{"discriminant": "type", "variants": vars})
	return b
}

func decodeSchema(raw json.RawMessage) map[string]any {
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return m
}

func compilerShape(s map[string]any, depth int) map[string]any {
	shape := map[string]any{}
	props, _ := s["properties"].(map[string]any)
	req := map[string]bool{}
	if r, ok := s["required"].([]any); ok {
		for _, k := range r {
			if k, ok := k.(string); ok {
				req[k] = true
			}
		}
	}
	for k, sub := range props {
		sm, _ := sub.(map[string]any)
		f := compilerField(sm, depth)
		hint, _ := sm["description"].(string)
		if req[k] && hint == "" {
			shape[k] = f
			continue
		}
		spec := map[string]any{"type": f}
		if !req[k] {
			spec["optional"] = true
		}
		if hint != "" {
			spec["hint"] = hint
		}
		shape[k] = spec
	}
	return shape
}

func compilerField(s map[string]any, depth int) any {
	if s == nil || depth > 6 {
		return "unknown"
	}
	if e, ok := s["enum"].([]any); ok {
		return map[string]any{"enum": e}
	}
	switch schemaType(s) {
	case "string", "boolean":
		return schemaType(s)
	case "number", "integer":
		return "number"
	case "array":
		items, _ := s["items"].(map[string]any)
		return map[string]any{"kind": "array", "element": compilerField(items, depth+1)}
	case "object":
		return map[string]any{"kind": "object", "shape": compilerShape(s, depth+1)}
	}
	if _, ok := s["properties"]; ok {
		return map[string]any{"kind": "object", "shape": compilerShape(s, depth+1)}
	}
	return "unknown"
}

// schemaType is the schema's "type", the first non-null one of a list.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if x, ok := x.(string); ok && x != "null" {
				return x
			}
		}
	}
	return ""
}

// payloadHint is lapd.js's payloadHint: {type, …required fields} with
// placeholders that are never null; nil when the action has no schema.
func payloadHint(variant string, raw json.RawMessage) any {
	s := decodeSchema(raw)
	if s == nil {
		return nil
	}
	out := map[string]any{}
	if body, ok := skeleton(s, 0, true).(map[string]any); ok {
		out = body
	}
	out["type"] = variant
	return out
}

func skeleton(s map[string]any, depth int, forceObject bool) any {
	if s == nil || depth > 6 {
		return nil
	}
	if v, ok := s["default"]; ok && v != nil {
		return v
	}
	if ex, ok := s["examples"].([]any); ok && len(ex) > 0 && ex[0] != nil {
		return ex[0]
	}
	if v, ok := s["const"]; ok && v != nil {
		return v
	}
	if e, ok := s["enum"].([]any); ok {
		for _, v := range e {
			if v != nil {
				return v
			}
		}
	}
	t := schemaType(s)
	if forceObject {
		t = "object"
	}
	switch t {
	case "string":
		if n, _ := s["minLength"].(float64); n > 0 {
			return "…"
		}
		return ""
	case "number", "integer":
		if n, ok := s["minimum"].(float64); ok {
			return n
		}
		return 0
	case "boolean":
		return false
	case "array":
		return []any{}
	case "object", "":
		props, _ := s["properties"].(map[string]any)
		if props == nil {
			if t == "object" {
				return map[string]any{}
			}
			return nil
		}
		o := map[string]any{}
		req, _ := s["required"].([]any)
		for _, k := range req {
			k, _ := k.(string)
			sub, _ := props[k].(map[string]any)
			if v := skeleton(sub, depth+1, false); v != nil {
				o[k] = v
			}
		}
		return o
	}
	return nil
}

// fieldHints is lapd.js's fieldHints: [{path, hint}] from the schema's
// property descriptions, nested objects with dotted paths.
func fieldHints(raw json.RawMessage) []any {
	out := []any{}
	var walk func(s map[string]any, prefix string, depth int)
	walk = func(s map[string]any, prefix string, depth int) {
		props, _ := s["properties"].(map[string]any)
		if props == nil || depth > 6 {
			return
		}
		keys := make([]string, 0, len(props))
		for k := range props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sub, _ := props[k].(map[string]any)
			if sub == nil {
				continue
			}
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			if d, _ := sub["description"].(string); d != "" {
				out = append(out, map[string]any{"path": p, "hint": d})
			}
			walk(sub, p, depth+1)
		}
	}
	walk(decodeSchema(raw), "", 0)
	return out
}

// compileSchemas compiles each action's payload schema for the tab's own
// gate (lapd.js validates in the tab too, whatever the server did).
func compileSchemas(actions []Action) (map[string]*jsonschema.Schema, error) {
	out := map[string]*jsonschema.Schema{}
	for _, a := range actions {
		if len(a.Schema) == 0 {
			continue
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(a.Schema))
		if err != nil {
			return nil, fmt.Errorf("lapdtest: action %s: schema: %w", a.Variant, err)
		}
		c := jsonschema.NewCompiler()
		url := "mem:///" + a.Variant + ".json"
		if err := c.AddResource(url, doc); err != nil {
			return nil, fmt.Errorf("lapdtest: action %s: schema: %w", a.Variant, err)
		}
		s, err := c.Compile(url)
		if err != nil {
			return nil, fmt.Errorf("lapdtest: action %s: schema: %w", a.Variant, err)
		}
		out[a.Variant] = s
	}
	return out, nil
}

// payloadErrors validates msg without its "type" against s:
// [{path, message}] in lapd.js's shape, nil when it passes.
func payloadErrors(s *jsonschema.Schema, msg map[string]any) []map[string]any {
	payload := map[string]any{}
	for k, v := range msg {
		if k != "type" {
			payload[k] = v
		}
	}
	b, _ := json.Marshal(payload)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err == nil {
		err = s.Validate(inst)
	}
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return []map[string]any{{"path": "", "message": err.Error()}}
	}
	var out []map[string]any
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			p := ""
			if len(e.InstanceLocation) > 0 {
				p = "/" + strings.Join(e.InstanceLocation, "/")
			}
			out = append(out, map[string]any{"path": p, "message": e.ErrorKind.LocalizedString(printer)})
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return out
}
