package mcp

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Lean results.
//
// Every byte a tool returns is read by the model on every later turn, so the
// executor renders LAP bodies for a reader, not a parser:
//
//   - Action entries drop null, empty and default fields (source, selectorHint:
//     null, examples: [], requiresConfirm: false, dispatchMode: "shared", …);
//     an unavailable action carries one field, unavailable: "<reason>". The
//     payload is one TypeScript-like signature built from the app's message
//     schemas (description.messages), e.g.
//     payload: "{title: string /* Short task title */, column?: 'todo'|'doing'}",
//     which replaces payloadHint and fieldHints (they say the same, less
//     precisely).
//   - The description keeps what a model acts on (docs, stateSchema when the
//     app declares one); conventions and the message schemas (folded into
//     the actions) are left out. health appears only when something is wrong.
//   - Per binding the executor remembers the action list the model was last
//     shown; a dispatch result carries actionsChanged (new entries in full,
//     changed ones as JSON merge patches, removed ones as {variant, removed:
//     true}) only when the list changed.
//   - A whole state that is not asked for (connect_session's first look, a
//     confirmed action's stateAfter) is kept under stateBudget bytes by
//     leaving out its largest top-level members; stateOmitted names them.
//
// verbose:true returns the LAP body as it came (plus the executor's fields);
// observe always returns the whole picture, leanly rendered.

// stateBudget bounds a state the model did not ask for (connect_session's
// first look, a confirmed action's stateAfter), in bytes of compact JSON.
const stateBudget = 1024

// maxShownBytes bounds the action list remembered per binding; a larger list
// is not remembered (so it is sent in full every time).
const maxShownBytes = 64 << 10

// maxSigsBytes bounds the description.messages whose payload signatures a
// binding remembers; larger ones (a hello may hold up to 1 MiB) are read
// again for each observation instead of kept.
const maxSigsBytes = 64 << 10

// maxRenderBytes bounds each rendering a binding keeps (the action list's,
// the signatures'), as the heap holds it: thousands of tiny actions render
// to about 22× their JSON, so 64 KiB of JSON kept 1.6 MiB per binding, and
// 256 bindings ~460 MiB, outside --max-kept-mib. A larger rendering is not
// kept: the list is sent whole and the signatures read again, as for a
// list over maxShownBytes. An action renders to ~450 bytes or more, so
// only apps with about 250 actions or more meet it (the Taskboard has 9).
const maxRenderBytes = 128 << 10

// leanHeld is about what as holds in the heap: each entry's struct, its
// encoding and its members (TestBindingWorstCase checks it).
func leanHeld(as []leanAction) int {
	n := cap(as) * 64
	for _, a := range as {
		n += len(a.variant) + cap(a.enc) + cap(a.fields)*48
	}
	return n
}

// sigsHeld is about what a signatures map holds in the heap.
func sigsHeld(m map[string]string) int {
	n := 64
	for k, v := range m {
		n += len(k) + len(v) + 64
	}
	return n
}

// leanAction is one action entry as the model is shown it.
type leanAction struct {
	variant string
	enc     []byte   // the encoded entry
	fields  []member // enc's members (sub-slices of enc)
}

// payloadSigs reads description.messages ({discriminant, variants: {name:
// shape}}) into variant → payload signature. Variants with an empty or
// unreadable shape get none.
func payloadSigs(messages []byte) map[string]string {
	mm, ok := members(messages)
	if !ok {
		return nil
	}
	vs, ok := members(get(mm, "variants"))
	if !ok {
		return nil
	}
	out := make(map[string]string, len(vs))
	for _, v := range vs {
		if isEmpty(v.val) {
			continue
		}
		if sig, ok := renderShape(v.val, 0); ok {
			out[v.key] = sig
		}
	}
	return out
}

const maxSigDepth = 6

// renderShape renders a compiler-format shape {field: spec} as
// "{a: string, b?: 'x'|'y' /* hint */}".
func renderShape(b []byte, depth int) (string, bool) {
	ms, ok := members(b)
	if !ok || depth > maxSigDepth {
		return "", false
	}
	var sb strings.Builder
	sb.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			sb.WriteString(", ")
		}
		typ, opt, hint := fieldSpec(m.val)
		sb.WriteString(propName(m.key))
		if opt {
			sb.WriteByte('?')
		}
		sb.WriteString(": ")
		sb.WriteString(renderType(typ, depth+1))
		if hint != "" {
			sb.WriteString(" /* ")
			sb.WriteString(strings.ReplaceAll(hint, "*/", "* /"))
			sb.WriteString(" */")
		}
	}
	sb.WriteByte('}')
	return sb.String(), true
}

// fieldSpec splits a field of a compiler-format shape: either a bare type
// (required, no hint) or {type, optional?, hint?}.
func fieldSpec(v []byte) (typ []byte, optional bool, hint string) {
	ms, ok := members(v)
	if !ok {
		return v, false, ""
	}
	t := get(ms, "type")
	if t == nil {
		return v, false, ""
	}
	return t, isTrue(get(ms, "optional")), jstr(get(ms, "hint"))
}

// renderType renders a compiler-format type: "string" | "number" | "boolean"
// | "unknown" | {enum} | {kind:"array", element} | {kind:"object", shape}.
func renderType(t []byte, depth int) string {
	t = bytes.TrimSpace(t)
	if len(t) > 0 && t[0] == '"' {
		if s := jstr(t); s != "" {
			return s
		}
		return "unknown"
	}
	ms, ok := members(t)
	if !ok || depth > maxSigDepth {
		return "unknown"
	}
	if enum := get(ms, "enum"); enum != nil {
		es, ok := elements(enum)
		if !ok || len(es) == 0 {
			return "unknown"
		}
		parts := make([]string, len(es))
		for i, e := range es {
			parts[i] = literal(e)
		}
		return strings.Join(parts, "|")
	}
	switch jstr(get(ms, "kind")) {
	case "array":
		el := renderType(get(ms, "element"), depth+1)
		if strings.Contains(el, "|") {
			el = "(" + el + ")"
		}
		return el + "[]"
	case "object":
		if s, ok := renderShape(get(ms, "shape"), depth+1); ok {
			return s
		}
		return "object"
	}
	return "unknown"
}

// literal renders an enum value: strings in single quotes, the rest as JSON.
func literal(e []byte) string {
	e = bytes.TrimSpace(e)
	if len(e) > 0 && e[0] == '"' {
		if s, ok := unquote(e); ok && !strings.ContainsAny(s, "'\\\n") {
			return "'" + s + "'"
		}
	}
	return string(e)
}

func propName(k string) string {
	for i, r := range k {
		if !(r == '_' || r == '$' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

// leanActionList renders LAP's action list (a JSON array of entries).
func leanActionList(actions []byte, sigs map[string]string) ([]leanAction, bool) {
	es, ok := elements(actions)
	if !ok {
		return nil, false
	}
	out := make([]leanAction, 0, len(es))
	for _, e := range es {
		a, ok := leanEntry(e, sigs)
		if !ok {
			return nil, false
		}
		out = append(out, a)
	}
	return out, true
}

// leanEntry renders one action entry (see the file comment).
func leanEntry(raw []byte, sigs map[string]string) (leanAction, bool) {
	ms, ok := members(raw)
	if !ok {
		return leanAction{}, false
	}
	variant := jstr(get(ms, "variant"))
	if variant == "" {
		return leanAction{}, false
	}
	sig, hasSig := sigs[variant]
	o := newObj(make([]byte, 0, len(raw)))
	o.str("variant", variant)
	if v := get(ms, "intent"); !isEmpty(v) {
		o.raw("intent", v)
	}
	if hasSig {
		o.str("payload", sig)
	}
	available, reason := true, ""
	for _, m := range ms {
		v := m.val
		switch m.key {
		case "variant", "intent":
		case "source": // how the runtime found the action; nothing to act on
		case "requiresConfirm":
			if isTrue(v) {
				o.raw(m.key, v)
			}
		case "dispatchMode":
			if s := jstr(v); s != "" && s != "shared" {
				o.raw(m.key, v)
			}
		case "payloadHint":
			if !hasSig && !isEmpty(v) && !bareType(v, variant) {
				o.raw(m.key, v)
			}
		case "fieldHints":
			if !hasSig && !isEmpty(v) {
				o.raw(m.key, v)
			}
		case "available":
			available = string(bytes.TrimSpace(v)) != "false"
		case "unavailableReason":
			reason = jstr(v)
		default:
			if !isEmpty(v) {
				o.raw(m.key, v)
			}
		}
	}
	if !available {
		if reason == "" {
			reason = "not available right now"
		}
		o.str("unavailable", reason)
	}
	enc := o.close()
	fields, _ := members(enc)
	return leanAction{variant: variant, enc: enc, fields: fields}, true
}

// bareType reports whether a payloadHint is just {"type": variant}.
func bareType(v []byte, variant string) bool {
	ms, ok := members(v)
	return ok && len(ms) == 1 && ms[0].key == "type" && jstr(ms[0].val) == variant
}

// encodeActions renders entries as a JSON array.
func encodeActions(b []byte, as []leanAction) []byte {
	b = append(b, '[')
	for i, a := range as {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, a.enc...)
	}
	return append(b, ']')
}

// actionsDelta renders what changed from old (what the model was shown) to
// cur, or nil when nothing did: new entries in full, changed entries as a
// JSON merge patch of the shown one (variant + the fields that differ; a
// field that went away is null), removed entries as {variant, removed: true}.
func actionsDelta(old, cur []leanAction) []byte {
	shown := make(map[string]leanAction, len(old))
	for _, a := range old {
		shown[a.variant] = a
	}
	var b []byte
	n := 0
	add := func(entry []byte) {
		if n == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		n++
		b = append(b, entry...)
	}
	seen := make(map[string]bool, len(cur))
	for _, a := range cur {
		seen[a.variant] = true
		o, ok := shown[a.variant]
		switch {
		case !ok:
			add(a.enc)
		case !bytes.Equal(o.enc, a.enc):
			p := newObj(nil)
			p.str("variant", a.variant)
			for _, f := range a.fields {
				if f.key != "variant" && !bytes.Equal(get(o.fields, f.key), f.val) {
					p.raw(f.key, f.val)
				}
			}
			for _, f := range o.fields {
				if get(a.fields, f.key) == nil {
					p.raw(f.key, []byte("null"))
				}
			}
			add(p.close())
		}
	}
	for _, a := range old {
		if !seen[a.variant] {
			p := newObj(nil)
			p.str("variant", a.variant)
			p.bool("removed", true)
			add(p.close())
		}
	}
	if n == 0 {
		return nil
	}
	return append(b, ']')
}

func sizeOf(as []leanAction) int {
	n := 0
	for _, a := range as {
		n += len(a.enc)
	}
	return n
}

// compactObject drops the null and empty members of an object (top level
// only); other values come back unchanged. nil when nothing is left.
func compactObject(v []byte) []byte {
	ms, ok := members(v)
	if !ok {
		if isEmpty(v) {
			return nil
		}
		return v
	}
	o := newObj(make([]byte, 0, len(v)))
	for _, m := range ms {
		if !isEmpty(m.val) {
			o.raw(m.key, m.val)
		}
	}
	if o.n == 0 {
		return nil
	}
	return o.close()
}

// compact writes k with v as compactObject(v) renders it, in place (no
// copy of v first), or nothing when compactObject(v) is nil.
func (o *objw) compact(k string, v []byte) {
	ms, ok := members(v)
	if !ok {
		if !isEmpty(v) {
			o.raw(k, v)
		}
		return
	}
	mark, n := len(o.b), o.n
	o.key(k)
	in := newObj(o.b)
	for _, m := range ms {
		if !isEmpty(m.val) {
			in.raw(m.key, m.val)
		}
	}
	if in.n == 0 {
		o.b, o.n = o.b[:mark], n
		return
	}
	o.b = in.close()
}

// healthWrong reports whether a LAP health object says something is wrong:
// the tab is not connected, or it is hidden (its timers may be throttled).
func healthWrong(h []byte) bool {
	ms, ok := members(h)
	if !ok {
		return false
	}
	return !isTrue(get(ms, "connected")) || string(bytes.TrimSpace(get(ms, "visible"))) == "false"
}

// budgetState keeps state under max bytes by leaving out its largest
// top-level members. It returns the state to show (nil when none of it fits)
// and a JSON object {"/pointer": "what was left out"} (nil when nothing was).
func budgetState(state []byte, max int) (kept, omitted []byte) {
	state = bytes.TrimSpace(state)
	if len(state) <= max {
		return state, nil
	}
	ms, ok := members(state)
	if !ok {
		o := newObj(nil)
		o.str("", describeValue(state))
		return nil, o.close()
	}
	idx := make([]int, len(ms))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return len(ms[b].val) - len(ms[a].val) })
	drop := make([]bool, len(ms))
	size := len(state)
	for _, i := range idx {
		if size <= max {
			break
		}
		drop[i] = true
		size -= len(ms[i].key) + len(ms[i].val) + 4
	}
	k := newObj(make([]byte, 0, size+16))
	om := newObj(nil)
	for i, m := range ms {
		if drop[i] {
			om.str("/"+pointerEscape(m.key), describeValue(m.val))
		} else {
			k.raw(m.key, m.val)
		}
	}
	return k.close(), om.close()
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// describeValue says what a left-out value is: "50 items, 3.3 KB".
func describeValue(v []byte) string {
	size := humanBytes(len(v))
	if es, ok := elements(v); ok {
		return fmt.Sprintf("%d items, %s", len(es), size)
	}
	if ms, ok := members(v); ok {
		return fmt.Sprintf("%d keys, %s", len(ms), size)
	}
	return size
}

func humanBytes(n int) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f KB", float64(n)/1024)
}

// patchOp is one JSON Patch operation, with the fields squashing needs.
type patchOp struct {
	raw      []byte
	op, path string
	from     bool // move/copy: touches another path too
}

// squashPatch drops a replace at path P when a later replace at P follows
// and no operation between touches P, its parents or its children; the
// result applies the same changes. A batch's combined diff repeats counters
// (nextId) once per message otherwise.
func squashPatch(ops []patchOp) []patchOp {
	out := ops[:0:0]
	for i, o := range ops {
		if o.op == "replace" && supersededAt(ops, i) {
			continue
		}
		out = append(out, o)
	}
	return out
}

func supersededAt(ops []patchOp, i int) bool {
	p := ops[i].path
	for _, o := range ops[i+1:] {
		if o.from {
			return false
		}
		if o.path == p {
			return o.op == "replace"
		}
		if strings.HasPrefix(o.path, p+"/") || strings.HasPrefix(p, o.path+"/") || o.path == "" {
			return false
		}
	}
	return false
}

// patchOps splits a JSON Patch array; ok is false when it is not one.
func patchOps(diff []byte) ([]patchOp, bool) {
	es, ok := elements(diff)
	if !ok {
		return nil, false
	}
	out := make([]patchOp, 0, len(es))
	for _, e := range es {
		ms, ok := members(e)
		if !ok {
			return nil, false
		}
		out = append(out, patchOp{raw: e, op: jstr(get(ms, "op")), path: jstr(get(ms, "path")), from: get(ms, "from") != nil})
	}
	return out, true
}

func encodePatch(b []byte, ops []patchOp) []byte {
	b = append(b, '[')
	for i, o := range ops {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, o.raw...)
	}
	return append(b, ']')
}

// atPointer returns the value at the JSON Pointer ptr (RFC 6901) in doc;
// ok is false when some step does not exist. "" is the whole document.
func atPointer(doc []byte, ptr string) (v []byte, ok bool) {
	v = doc
	if ptr == "" {
		return v, true
	}
	if ptr[0] != '/' {
		return nil, false
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if ms, isObj := members(v); isObj {
			if v = get(ms, tok); v == nil {
				return nil, false
			}
			continue
		}
		es, isArr := elements(v)
		if !isArr {
			return nil, false
		}
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n >= len(es) || (len(tok) > 1 && tok[0] == '0') || tok[0] == '+' {
			return nil, false
		}
		v = es[n]
	}
	return v, true
}

// leanWait renders /wait's answer for a model that watched path: the part
// at path instead of the whole state (the model asked about that part;
// observe gives the rest). nil when the answer is not a change or path is
// empty: the caller passes it on as it came.
func leanWait(raw []byte, path string) []byte {
	if path == "" {
		return nil
	}
	ms, ok := members(raw)
	if !ok || jstr(get(ms, "status")) != "changed" {
		return nil
	}
	state := get(ms, "stateAfter")
	if state == nil {
		return nil
	}
	o := newObj(make([]byte, 0, 64))
	o.str("status", "changed")
	if v, found := atPointer(state, path); found {
		o.raw("value", v)
	} else {
		o.bool("found", false)
		o.str("next", "Nothing is at path now (it was removed); observe shows the whole state.")
	}
	return o.close()
}
