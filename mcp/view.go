package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// # What the model has seen of the state (wait_for_change's stateDiff)
//
// wait_for_change without a path answered with the whole state: on a
// 52-task board 3.5 KB for one ticked box, and the model had to find the
// change itself. A binding now keeps the last whole state a result gave the
// model (connect_session's and observe's state, a dispatch's stateAfter, a
// wait's) and the JSON Patches results showed it since (send_message's
// stateDiff), as bytes: nothing is decoded on the dispatch path. A wait that
// sees a change decodes them once and answers with the patch from that view
// to the state now, in send_message's form: what changed since the model
// last looked, including changes it did not see (the user's, made before
// the wait began). The whole state goes instead when it is small (at most
// stateBudget, 1 KiB: as LAP and the reference answer), when it is not
// longer than the patch, or when the view is not known: on another cluster node, after a
// result that showed only part of the state (get_state, a path), or beyond
// maxViewBytes / maxViewOpsBytes. Parts of a first look left out for size
// (stateOmitted) are in the view: a change there comes as a patch too.
const (
	maxViewBytes    = 64 << 10 // a larger state is not kept: a wait answers with it whole
	maxViewOpsBytes = 16 << 10 // patches kept since the view; beyond, the view is forgotten
)

// setView records state as what the model has seen (nil or too large:
// nothing known).
func (b *Binding) setView(state []byte) {
	b.viewOps = nil
	switch {
	case state == nil || len(state) > maxViewBytes:
		b.view = nil
	case !bytes.Equal(b.view, state): // (an observe that shows the same state keeps its copy)
		b.view = bytes.Clone(state)
	}
}

// addViewPatch records a patch the model was shown after the view.
func (b *Binding) addViewPatch(patch []byte) {
	if b.view == nil || len(patch) <= 2 { // "[]"
		return
	}
	n := len(patch)
	for _, p := range b.viewOps {
		n += len(p)
	}
	if n > maxViewOpsBytes {
		b.view, b.viewOps = nil, nil
		return
	}
	b.viewOps = append(slices.Clip(b.viewOps), bytes.Clone(patch)) // (snapshots share the old slice)
}

// viewDiff returns the JSON Patch from the model's view (view with ops
// applied) to after; ok is false when the view cannot be rebuilt.
func viewDiff(view []byte, ops [][]byte, after []byte) (patch []byte, ok bool) {
	doc, err := decodeJSON(view)
	if err != nil {
		return nil, false
	}
	for _, p := range ops {
		var ps []struct {
			Op    string          `json:"op"`
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		if json.Unmarshal(p, &ps) != nil {
			return nil, false
		}
		for _, o := range ps {
			var v any
			if o.Op != "remove" {
				if v, err = decodeJSON(o.Value); err != nil {
					return nil, false
				}
			}
			toks, ok := pointerTokens(o.Path)
			if !ok {
				return nil, false
			}
			if doc, err = applyOp(doc, toks, o.Op, v); err != nil {
				return nil, false
			}
		}
	}
	cur, err := decodeJSON(after)
	if err != nil {
		return nil, false
	}
	d := &differ{b: []byte{'['}}
	d.diff(doc, cur, "")
	return append(d.b, ']'), d.err == nil
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// pointerTokens splits a JSON Pointer (RFC 6901); "" is the root (no
// tokens).
func pointerTokens(p string) ([]string, bool) {
	if p == "" {
		return nil, true
	}
	if p[0] != '/' {
		return nil, false
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, true
}

var errPatch = errors.New("mcp: the patch does not apply to the view")

// applyOp applies one add, remove or replace at toks under node and returns
// the new node.
func applyOp(node any, toks []string, op string, v any) (any, error) {
	if len(toks) == 0 {
		if op == "remove" {
			return nil, errPatch
		}
		return v, nil
	}
	switch n := node.(type) {
	case map[string]any:
		k := toks[0]
		if len(toks) > 1 {
			child, ok := n[k]
			if !ok {
				return nil, errPatch
			}
			c, err := applyOp(child, toks[1:], op, v)
			if err != nil {
				return nil, err
			}
			n[k] = c
			return n, nil
		}
		switch op {
		case "add", "replace":
			n[k] = v
		case "remove":
			if _, ok := n[k]; !ok {
				return nil, errPatch
			}
			delete(n, k)
		default:
			return nil, errPatch
		}
		return n, nil
	case []any:
		if len(toks) == 1 && op == "add" && toks[0] == "-" {
			return append(n, v), nil
		}
		i, err := strconv.Atoi(toks[0])
		if err != nil || i < 0 || i > len(n) || (i == len(n) && (len(toks) > 1 || op != "add")) {
			return nil, errPatch
		}
		if len(toks) > 1 {
			c, err := applyOp(n[i], toks[1:], op, v)
			if err != nil {
				return nil, err
			}
			n[i] = c
			return n, nil
		}
		switch op {
		case "add":
			return slices.Insert(n, i, v), nil
		case "replace":
			n[i] = v
			return n, nil
		case "remove":
			return slices.Delete(n, i, i+1), nil
		}
	}
	return nil, errPatch
}

// differ writes the patch from one decoded value to another, in the order
// lapd.js's computeStateDiff (the tab's stateDiff) uses: an object removes
// keys first, then adds and recurses in key order; an array recurses the
// shared prefix, removes extra indices from the end, then adds new ones; a
// change of kind is one replace.
type differ struct {
	b   []byte
	n   int
	err error
}

func (d *differ) diff(before, after any, path string) {
	switch a := after.(type) {
	case map[string]any:
		bm, ok := before.(map[string]any)
		if !ok {
			d.op("replace", path, after)
			return
		}
		for _, k := range sortedKeys(bm) {
			if _, ok := a[k]; !ok {
				d.op("remove", path+"/"+pointerEscape(k), nil)
			}
		}
		for _, k := range sortedKeys(a) {
			if bv, ok := bm[k]; ok {
				d.diff(bv, a[k], path+"/"+pointerEscape(k))
			} else {
				d.op("add", path+"/"+pointerEscape(k), a[k])
			}
		}
	case []any:
		bs, ok := before.([]any)
		if !ok {
			d.op("replace", path, after)
			return
		}
		shared := min(len(bs), len(a))
		for i := 0; i < shared; i++ {
			d.diff(bs[i], a[i], path+"/"+strconv.Itoa(i))
		}
		for i := len(bs) - 1; i >= len(a); i-- {
			d.op("remove", path+"/"+strconv.Itoa(i), nil)
		}
		for i := len(bs); i < len(a); i++ {
			d.op("add", path+"/"+strconv.Itoa(i), a[i])
		}
	default:
		if !samePrimitive(before, after) {
			d.op("replace", path, after)
		}
	}
}

func samePrimitive(x, y any) bool {
	switch xv := x.(type) {
	case json.Number:
		yv, ok := y.(json.Number)
		if !ok {
			return false
		}
		if xv == yv {
			return true
		}
		xf, e1 := xv.Float64()
		yf, e2 := yv.Float64()
		return e1 == nil && e2 == nil && xf == yf
	case string, bool, nil:
		return x == y
	}
	return false // an object or array against a primitive
}

func (d *differ) op(op, path string, v any) {
	if d.n > 0 {
		d.b = append(d.b, ',')
	}
	d.n++
	d.b = append(d.b, `{"op":`...)
	d.b = appendString(d.b, op)
	d.b = append(d.b, `,"path":`...)
	d.b = appendString(d.b, path)
	if op != "remove" {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			d.err = err
		}
		d.b = append(d.b, `,"value":`...)
		d.b = append(d.b, bytes.TrimRight(buf.Bytes(), "\n")...)
	}
	d.b = append(d.b, '}')
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// waitDiff renders a /wait answer without a path as the patch from the
// model's view of b's state to stateAfter, when that is known, the state is
// over stateBudget and the patch is shorter; nil otherwise (the caller sends the answer as it came).
// Either way stateAfter becomes the view.
func (e *Executor) waitDiff(b Binding, raw []byte) []byte {
	ms, ok := members(raw)
	if !ok || jstr(get(ms, "status")) != "changed" {
		return nil
	}
	after := get(ms, "stateAfter")
	if after == nil {
		return nil
	}
	var out []byte
	if patch := viewPatch(b, after); patch != nil {
		o := newObj(make([]byte, 0, len(patch)+40))
		o.str("status", "changed")
		o.raw("stateDiff", patch)
		out = o.close()
	}
	e.bindings.Update(b.Handle, func(b *Binding) { b.setView(after) })
	return out
}

// viewPatch is the patch from the model's view of b's state to after, when
// the view is known, the state is over stateBudget (a small state is sent
// whole, as LAP answers) and the patch is shorter; nil otherwise.
func viewPatch(b Binding, after []byte) []byte {
	if b.view == nil || len(after) <= stateBudget {
		return nil
	}
	patch, ok := viewDiff(b.view, b.viewOps, after)
	if !ok || len(patch) >= len(after) {
		return nil
	}
	return patch
}

// appendOps appends ops to the JSON Patch array patch.
func appendOps(patch []byte, ops []patchOp) []byte {
	if len(ops) == 0 {
		return patch
	}
	out := append([]byte(nil), patch[:len(patch)-1]...)
	for i, o := range ops {
		if i > 0 || len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, o.raw...)
	}
	return append(out, ']')
}
