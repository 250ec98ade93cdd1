// Package schema enforces an app's action policy on the server, before any
// frame reaches the tab: human-only actions, unknown variants and payloads
// that do not match their JSON Schema are rejected here.
package schema

import "encoding/json"

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
	Message string `json:"message"`
}

// Rejection is the /message (and would-dispatch) body for a refused msg:
// {status:'rejected', reason, detail, errors?}.
type Rejection struct {
	Status string       `json:"status"` // always "rejected"
	Reason string       `json:"reason"` // human-only | invalid | schema-error
	Detail string       `json:"detail"`
	Errors []FieldError `json:"errors,omitempty"`
}

// Policy is a compiled hello.policy. The zero/nil Policy allows everything (the
// tab enforces, as in the reference).
type Policy struct {
	variants map[string]*variant
}

type variant struct {
	Annotations
}

// Parse compiles hello.policy. Errors name the variant and what is wrong.
func Parse(raw json.RawMessage) (*Policy, error) { panic("schema: Parse not implemented") }

// Check returns nil when msg may be sent to the tab, or the rejection.
func (p *Policy) Check(msg json.RawMessage) *Rejection { panic("not implemented") }

// Variant returns the annotations of a variant.
func (p *Policy) Variant(name string) (Annotations, bool) { panic("not implemented") }
