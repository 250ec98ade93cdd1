// Package schema enforces an app's action policy on the server, before any
// frame reaches the tab: human-only actions, unknown variants and payloads
// that do not match their JSON Schema are rejected here.
//
// # Using a Policy
//
// A tab may send hello.policy (docs/PROTOCOL.md): one entry per action
// (variant) with its annotations and a JSON Schema for its payload, the msg
// object without its discriminant field ("type" unless the policy names
// another). Compile it once per hello:
//
//	pol, err := schema.Parse(hello.Policy) // nil, nil when the tab sent none
//
// and check every msg before it is forwarded:
//
//	if rej := pol.Check(msg); rej != nil {
//		return rej // HTTP 200 {status:"rejected", reason, detail, errors?}
//	}
//
// Check gives reason "invalid" for a msg that is not an object with a string
// discriminant or names an unknown variant (the detail lists known ones),
// "human-only" for an action only the human may take, and "schema-error" with
// JSON Pointer paths for a payload that fails its schema, is too costly to
// check, or holds a number beyond MaxNumberLen or MaxNumberExponent (a policy
// with one is refused at Parse). A nil *Policy allows every msg: the tab then
// enforces, as in the reference.
//
// PayloadHint returns a skeleton payload built from a variant's required
// properties, with type-appropriate placeholders and never null (agents copy
// placeholders verbatim).
//
// # The reference's compiler format
//
// FromCompiler turns the reference's hello.msgSchema (field maps such as
// {"q":{"type":"string","optional":true}}) into the same JSON Schema form.
// lapd does not enforce such policies by default (the reference tab enforces
// them leniently itself); FromCompiler is for embedding apps that opt in.
//
// # Validator
//
// Schemas are compiled with github.com/santhosh-tekuri/jsonschema/v6: it is
// maintained, passes the official JSON-Schema-Test-Suite for drafts 4 to
// 2020-12 (2020-12 is the default dialect here), gives structured output
// with instance locations, and lets us replace its loader. The loader here
// refuses everything: a $ref must point inside the policy (for example to
// "#/$defs/…"); lapd never fetches schemas from the network or the disk.
// Regular expressions use Go's regexp (linear time; ECMAScript-only syntax
// such as lookahead is refused at Parse). "format" is an annotation, as the
// 2020-12 default dialect says, not an assertion.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Limits of a policy.
const (
	MaxVariants      = 1000      // variants in one policy
	MaxSchemaBytes   = 256 << 10 // JSON of one variant's schema
	MaxPolicyBytes   = 4 << 20   // JSON of the whole policy (the WebSocket frame limit)
	MaxVariantName   = 200       // bytes of a variant name
	MaxPolicyNodes   = 5000      // JSON objects and arrays in all of a policy's schemas (bounds compile time and memory)
	MaxVariantNodes  = 500       // … in one variant's schema (the compiler is superlinear in one schema's size)
	MaxSchemaDepth   = 32        // nesting of objects and arrays in one schema (… and much more so in its depth)
	maxFieldErrors   = 20        // FieldErrors in a Rejection
	maxDetailErrors  = 5         // errors spelled out in a Rejection's Detail
	maxListedNames   = 20        // known variants listed for an unknown one
	maxMessageLen    = 200       // bytes of one FieldError message
	maxEchoedNameLen = 100       // bytes of an unknown variant name echoed back
)

// Rejection reasons.
const (
	ReasonInvalid     = "invalid"
	ReasonHumanOnly   = "human-only"
	ReasonSchemaError = "schema-error"
)

// DefaultDiscriminant is the msg field that names the variant.
const DefaultDiscriminant = "type"

// Annotations describe one action (variant) for the LLM and for policy.
type Annotations struct {
	Intent           string            `json:"intent,omitempty"`
	RequiresConfirm  bool              `json:"requiresConfirm,omitempty"`
	HumanOnly        bool              `json:"humanOnly,omitempty"`
	AgentOnly        bool              `json:"agentOnly,omitempty"`
	AlwaysAffordable bool              `json:"alwaysAffordable,omitempty"`
	Examples         []json.RawMessage `json:"examples,omitempty"`
	Warning          string            `json:"warning,omitempty"`
	Emits            []string          `json:"emits,omitempty"`
}

// FieldError is one failing path of a payload.
type FieldError struct {
	Path    string `json:"path"` // JSON Pointer into the msg, e.g. "/title"
	Code    string `json:"code"` // the reference's validation code (see the Code… constants)
	Message string `json:"message"`
}

// Validation codes of a FieldError: the reference runtime's names, so that a
// client written for it reads lapd's errors the same way. JSON Schema
// keywords that the reference has no name for (minLength, pattern, minimum,
// …) are CodeValidatesFailed, the reference's "a check on the value failed".
const (
	CodeMissing         = "missing"          // required
	CodeUnexpectedField = "unexpected-field" // additionalProperties
	CodeWrongType       = "wrong-type"       // type (not an array or an object: below)
	CodeNotArray        = "not-array"        // type, where an array was wanted
	CodeNotObject       = "not-object"       // type, where an object was wanted
	CodeNotInEnum       = "not-in-enum"      // enum, const
	CodeValidatesFailed = "validates-failed" // any other keyword
)

// Rejection is the /message (and would-dispatch) body for a refused msg:
// {status:'rejected', reason, detail, errors?}.
type Rejection struct {
	Status string       `json:"status"` // always "rejected"
	Reason string       `json:"reason"` // human-only | invalid | schema-error
	Detail string       `json:"detail"`
	Errors []FieldError `json:"errors,omitempty"`
}

// Policy is a compiled hello.policy. The zero/nil Policy allows everything (the
// tab enforces, as in the reference). A Policy is immutable and safe for
// concurrent use.
type Policy struct {
	variants     map[string]*variant
	names        []string // sorted
	discriminant string
	footprint    int
}

type variant struct {
	Annotations
	schema *jsonschema.Schema // nil: any payload
	doc    any                // the schema document, for the hint

	hintOnce sync.Once
	hint     json.RawMessage
}

type rawPolicy struct {
	Discriminant *string                    `json:"discriminant"`
	Variants     map[string]json.RawMessage `json:"variants"`
}

type rawVariant struct {
	Annotations
	Schema json.RawMessage `json:"schema"`
}

// refuseLoader is the compiler's only loader: every $ref outside the policy
// is refused.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("remote $ref %q refused: lapd loads no schema from the network or disk; put it under $defs and use a local \"#/$defs/…\" $ref", url)
}

// Parse compiles hello.policy. Errors name the variant and what is wrong.
// An absent policy (empty input or JSON null) gives a nil Policy, which
// allows every msg; a policy with an empty variants object refuses every msg.
func Parse(raw json.RawMessage) (*Policy, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) > MaxPolicyBytes {
		return nil, fmt.Errorf("schema: policy is %d bytes, over the %d byte limit", len(raw), MaxPolicyBytes)
	}
	var rp rawPolicy
	if err := json.Unmarshal(raw, &rp); err != nil {
		return nil, fmt.Errorf("schema: policy must be a JSON object {\"variants\":{…}}: %w", err)
	}
	if rp.Variants == nil {
		return nil, errors.New(`schema: policy has no "variants" object`)
	}
	if len(rp.Variants) > MaxVariants {
		return nil, fmt.Errorf("schema: policy has %d variants, over the limit of %d", len(rp.Variants), MaxVariants)
	}
	p := &Policy{variants: make(map[string]*variant, len(rp.Variants)), discriminant: DefaultDiscriminant}
	if rp.Discriminant != nil {
		if *rp.Discriminant == "" || len(*rp.Discriminant) > MaxVariantName {
			return nil, fmt.Errorf("schema: policy discriminant must be a field name of 1..%d bytes", MaxVariantName)
		}
		p.discriminant = *rp.Discriminant
	}
	for name := range rp.Variants {
		p.names = append(p.names, name)
	}
	slices.Sort(p.names)

	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	c.UseRegexpEngine(compileRegexp)
	// Decode and measure every variant before compiling any: a policy over
	// its limits is refused before the expensive part.
	var sc scanned
	for _, name := range p.names {
		if name == "" || len(name) > MaxVariantName {
			return nil, fmt.Errorf("schema: variant name %.40q must be 1..%d bytes", name, MaxVariantName)
		}
		v, err := decodeVariant(rp.Variants[name], &sc)
		if err != nil {
			return nil, fmt.Errorf("schema: variant %q: %w", name, err)
		}
		p.variants[name] = v
	}
	for i, name := range p.names {
		v := p.variants[name]
		if v.doc == nil {
			continue
		}
		url := fmt.Sprintf("lapd-policy:///variant/%d.json", i)
		err := c.AddResource(url, v.doc)
		if err == nil {
			v.schema, err = c.Compile(url)
		}
		if err != nil {
			return nil, fmt.Errorf("schema: variant %q: schema: %w", name, err)
		}
	}
	// What the compiled form holds, roughly: the documents, about a
	// kilobyte per compiled subschema, and up to 400 bytes per big.Rat of a
	// numeric keyword (the most a number within numberOK's bounds takes;
	// measured with jsonschema v6).
	p.footprint = 2*len(raw) + sc.nodes*1024 + sc.rats*512
	return p, nil
}

// Footprint is about how many bytes the compiled policy keeps in memory (for
// caches that budget bytes).
func (p *Policy) Footprint() int {
	if p == nil {
		return 0
	}
	return p.footprint
}

func decodeVariant(raw json.RawMessage, sc *scanned) (*variant, error) {
	var rv rawVariant
	if err := json.Unmarshal(raw, &rv); err != nil {
		return nil, fmt.Errorf("must be an object of annotations and a schema: %w", err)
	}
	v := &variant{Annotations: rv.Annotations}
	s := bytes.TrimSpace(rv.Schema)
	if len(s) == 0 || string(s) == "null" {
		return v, nil
	}
	if len(s) > MaxSchemaBytes {
		return nil, fmt.Errorf("schema is %d bytes, over the %d byte limit", len(s), MaxSchemaBytes)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(s))
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	switch doc.(type) {
	case map[string]any, bool:
	default:
		return nil, errors.New("schema must be a JSON Schema object or boolean")
	}
	if err := scanSchema(doc, sc); err != nil {
		return nil, err
	}
	v.doc = doc
	return v, nil
}

// scanned is what scanSchema counted in a policy's schemas so far.
type scanned struct {
	nodes int // objects and arrays
	rats  int // numbers the compiler keeps as a big.Rat (minimum, multipleOf, …)
}

// scanSchema counts the objects and arrays of a schema document into sc.nodes
// (refusing past MaxVariantNodes in it, MaxPolicyNodes in all, or nesting
// past MaxSchemaDepth: the compiler's time grows faster than the size of
// one schema, and much faster than its depth), and refuses references the cost
// bound cannot follow: $dynamicRef, $recursiveRef, and a $ref that does not
// start with "#" (the built-in meta-schemas are reachable that way and use
// $dynamicRef). Keywords whose values are data (const, enum, default,
// examples) are counted but not searched for references. Every number, data
// or keyword, must be within the bounds of numberOK: the compiler reads
// them all with big.Rat, and keeps those of minimum, multipleOf and the like.
func scanSchema(doc any, sc *scanned) error {
	mine := 0
	count := func(depth int) error {
		sc.nodes++
		mine++
		switch {
		case depth > MaxSchemaDepth:
			return fmt.Errorf("the schema nests objects and arrays deeper than %d levels; flatten it (use $defs)", MaxSchemaDepth)
		case mine > MaxVariantNodes:
			return fmt.Errorf("the schema has over %d objects and arrays; simplify it", MaxVariantNodes)
		case sc.nodes > MaxPolicyNodes:
			return fmt.Errorf("the policy's schemas have over %d objects and arrays in all; simplify them", MaxPolicyNodes)
		}
		return nil
	}
	var path []string
	var walk func(v any, data bool, depth int) error
	walk = func(v any, data bool, depth int) error {
		switch x := v.(type) {
		case json.Number:
			if !numberOK(string(x)) {
				return fmt.Errorf("%s: %s; write it within those bounds", pointerOr(path, "(schema)"), numberMessage(string(x)))
			}
		case map[string]any:
			if err := count(depth); err != nil {
				return err
			}
			for k, sub := range x {
				if !data {
					switch k {
					case "$dynamicRef", "$recursiveRef":
						return fmt.Errorf("%s is not supported; use a local \"$ref\": \"#/$defs/…\"", k)
					case "$ref":
						if ref, _ := sub.(string); !strings.HasPrefix(ref, "#") {
							return fmt.Errorf("remote $ref %.60q refused: lapd loads no schema from the network, the disk or the meta-schemas; put it under $defs and use a local \"#/$defs/…\" $ref", ref)
						}
					}
				}
				if _, ok := sub.(json.Number); ok && !data && ratKeywords[k] {
					sc.rats++
				}
				isData := data || k == "const" || k == "enum" || k == "default" || k == "examples"
				path = append(path, k)
				if err := walk(sub, isData, depth+1); err != nil {
					return err
				}
				path = path[:len(path)-1]
			}
		case []any:
			if err := count(depth); err != nil {
				return err
			}
			for i, sub := range x {
				path = append(path, strconv.Itoa(i))
				if err := walk(sub, data, depth+1); err != nil {
					return err
				}
				path = path[:len(path)-1]
			}
		}
		return nil
	}
	return walk(doc, false, 1)
}

// ratKeywords are the keywords whose number the compiled schema keeps as a
// *big.Rat.
var ratKeywords = map[string]bool{"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "multipleOf": true}

// Discriminant returns the msg field that names the variant ("type" unless
// the policy said otherwise).
func (p *Policy) Discriminant() string {
	if p == nil {
		return DefaultDiscriminant
	}
	return p.discriminant
}

// Check returns nil when msg may be sent to the tab, or the rejection.
func (p *Policy) Check(msg json.RawMessage) *Rejection {
	if p == nil {
		return nil
	}
	name, payload, err := SplitMsg(msg, p.discriminant)
	if err != nil {
		return reject(ReasonInvalid, strings.TrimPrefix(err.Error(), ErrBadMsg.Error()+": "))
	}
	return p.CheckSplit(name, payload)
}

// CheckSplit is Check for a msg already split by SplitMsg with p's
// Discriminant: variant and payload are what SplitMsg returned. A caller
// that splits the msg anyway (for audit, say) saves Check's second pass.
func (p *Policy) CheckSplit(name string, payload json.RawMessage) *Rejection {
	if p == nil {
		return nil
	}
	v, ok := p.variants[name]
	if !ok {
		return reject(ReasonInvalid, p.unknownDetail(name))
	}
	if v.HumanOnly {
		return reject(ReasonHumanOnly, fmt.Sprintf("%s can only be done by the human in the app; ask them to do it", name))
	}
	if v.schema == nil {
		return nil
	}
	obj, bad, err := decodePayload(payload)
	if err != nil {
		return reject(ReasonInvalid, "msg is not valid JSON")
	}
	if bad {
		return numberRejection(obj)
	}
	if why := checkCost(v.schema, obj); why != "" {
		return reject(ReasonSchemaError, why)
	}
	err = v.schema.Validate(obj)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return reject(ReasonSchemaError, "payload could not be validated: "+truncate(err.Error(), maxMessageLen))
	}
	return rejectFields(fieldErrors(ve))
}

// rejectFields is the schema-error Rejection listing fes (at least one).
func rejectFields(fes []FieldError) *Rejection {
	parts := make([]string, 0, maxDetailErrors)
	for _, fe := range fes[:min(len(fes), maxDetailErrors)] {
		path := fe.Path
		if path == "" {
			path = "(payload)"
		}
		parts = append(parts, path+": "+fe.Message)
	}
	r := reject(ReasonSchemaError, strings.Join(parts, "; "))
	r.Errors = fes
	return r
}

func reject(reason, detail string) *Rejection {
	return &Rejection{Status: "rejected", Reason: reason, Detail: detail}
}

func (p *Policy) unknownDetail(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "unknown variant: %s", truncate(name, maxEchoedNameLen))
	if len(p.names) == 0 {
		b.WriteString(" (this app allows no actions)")
		return b.String()
	}
	// The model's actions: a human-only one is not the model's to send
	// (it is not in the model's action list either).
	var known []string
	n := 0
	for _, name := range p.names {
		if p.variants[name].HumanOnly {
			continue
		}
		if len(known) < maxListedNames {
			known = append(known, name)
		}
		n++
	}
	if n == 0 {
		b.WriteString(" (the app allows the AI no actions)")
		return b.String()
	}
	b.WriteString(" (known: ")
	b.WriteString(strings.Join(known, ", "))
	if n > len(known) {
		fmt.Fprintf(&b, ", and %d more", n-len(known))
	}
	b.WriteString(")")
	return b.String()
}

// fieldErrors flattens the validator's error tree to its leaves: the errors
// that say what is wrong, not the "allOf failed" or "$ref" around them. A
// missing required property or a disallowed extra one points at that
// property.
func fieldErrors(ve *jsonschema.ValidationError) []FieldError {
	var out []FieldError
	add := func(path, code, msg string) bool {
		if len(out) >= maxFieldErrors {
			return false
		}
		out = append(out, FieldError{Path: path, Code: code, Message: truncate(msg, maxMessageLen)})
		return true
	}
	var walk func(e *jsonschema.ValidationError) bool
	walk = func(e *jsonschema.ValidationError) bool {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				if !walk(c) {
					return false
				}
			}
			return true
		}
		path := pointer(e.InstanceLocation)
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			for _, name := range k.Missing {
				if !add(path+"/"+escape(name), CodeMissing, "required property is missing") {
					return false
				}
			}
			return true
		case *kind.AdditionalProperties:
			for _, name := range k.Properties {
				if !add(path+"/"+escape(name), CodeUnexpectedField, "property is not allowed") {
					return false
				}
			}
			return true
		}
		return add(path, codeOf(e.ErrorKind), e.ErrorKind.LocalizedString(printer))
	}
	walk(ve)
	if len(out) == 0 {
		add("", CodeValidatesFailed, ve.Error())
	}
	// The validator's causes come in no fixed order (they are collected
	// from maps); sort by path so the same msg always reads the same.
	slices.SortStableFunc(out, func(a, b FieldError) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// codeOf names a leaf validation error the reference's way.
func codeOf(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		switch {
		case len(k.Want) == 1 && k.Want[0] == "array":
			return CodeNotArray
		case len(k.Want) == 1 && k.Want[0] == "object":
			return CodeNotObject
		}
		return CodeWrongType
	case *kind.Enum, *kind.Const:
		return CodeNotInEnum
	}
	return CodeValidatesFailed
}

var printer = message.NewPrinter(language.English)

// pointer joins reference tokens into a JSON Pointer (RFC 6901).
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(escape(t))
	}
	return b.String()
}

// pointerOr is pointer(tokens), or root when there are none.
func pointerOr(tokens []string, root string) string {
	if len(tokens) == 0 {
		return root
	}
	return pointer(tokens)
}

// escape makes name one JSON Pointer reference token (RFC 6901).
func escape(name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(name, "~", "~0"), "/", "~1")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// Variant returns the annotations of a variant.
func (p *Policy) Variant(name string) (Annotations, bool) {
	if p == nil {
		return Annotations{}, false
	}
	v, ok := p.variants[name]
	if !ok {
		return Annotations{}, false
	}
	return v.Annotations, true
}

// Variants returns the variant names, sorted.
func (p *Policy) Variants() []string {
	if p == nil {
		return nil
	}
	return slices.Clone(p.names)
}

// PayloadHint returns a skeleton payload (the msg without its discriminant)
// for a variant: its schema's required properties with placeholders taken
// from const, default, examples or enum, else type-appropriate values ("",
// 0, false, {}, []); never null, and a property whose type cannot be told is
// left out. nil for an unknown variant; {} for a variant without a schema.
func (p *Policy) PayloadHint(name string) json.RawMessage {
	if p == nil {
		return nil
	}
	v, ok := p.variants[name]
	if !ok {
		return nil
	}
	v.hintOnce.Do(func() { v.hint = payloadHint(v.doc) })
	return slices.Clone(v.hint)
}

// ReferencePath writes a FieldError's JSON Pointer the way the reference
// runtime writes its validation paths: object keys joined with dots, array
// indices in brackets ("/cells/0/value" → "cells[0].value"); "" stays "".
// msg (the whole msg the pointer points into) decides which segments index
// an array. A key holding a dot or a bracket is written ["key"].
func ReferencePath(pointer string, msg json.RawMessage) string {
	if pointer == "" || pointer[0] != '/' {
		return pointer
	}
	var cur any
	_ = json.Unmarshal(msg, &cur)
	var b strings.Builder
	for _, raw := range strings.Split(pointer[1:], "/") {
		seg := strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case []any:
			b.WriteString("[" + seg + "]")
			if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(v) {
				cur = v[i]
			} else {
				cur = nil
			}
			continue
		case map[string]any:
			cur = v[seg]
		default:
			cur = nil
		}
		if strings.ContainsAny(seg, ".[]\"") || seg == "" {
			b.WriteString("[" + strconv.Quote(seg) + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}
