package mcp

import "bytes"

// observation is a LAP /observe body, split into its sections (the values
// are sub-slices of the body; nothing is decoded).
type observation struct {
	ms                        []member
	state, actions, context   []byte
	health, docs, stateSchema []byte
	name, version, schemaHash string
	messages                  []byte
	sigs                      map[string]string
	lean                      []leanAction
	leanOK                    bool
}

// observed are the members renderObservation handles itself.
var observed = map[string]bool{"state": true, "actions": true, "description": true, "context": true, "health": true}

// parseObservation splits an /observe body and renders its actions, reusing
// what b (a snapshot of the binding) already rendered when the app's
// messages and action list are the bytes it saw last.
func parseObservation(raw []byte, b Binding) (observation, bool) {
	ms, ok := members(raw)
	if !ok {
		return observation{}, false
	}
	ob := observation{ms: ms, state: get(ms, "state"), actions: get(ms, "actions"), context: get(ms, "context"), health: get(ms, "health")}
	cached := false
	if dm, ok := members(get(ms, "description")); ok {
		ob.name, ob.version, ob.schemaHash = jstr(get(dm, "name")), jstr(get(dm, "version")), jstr(get(dm, "schemaHash"))
		ob.docs, ob.stateSchema = get(dm, "docs"), get(dm, "stateSchema")
		ob.messages = get(dm, "messages")
		if b.sigsRaw != nil && bytes.Equal(ob.messages, b.sigsRaw) {
			ob.sigs, cached = b.sigs, true
		} else {
			ob.sigs = payloadSigs(ob.messages)
		}
	}
	if ob.actions != nil {
		if cached && b.shownSet && bytes.Equal(ob.actions, b.shownRaw) {
			ob.lean, ob.leanOK = b.shown, true
		} else {
			ob.lean, ob.leanOK = leanActionList(ob.actions, ob.sigs)
		}
	}
	return ob, true
}

// writeApp writes the app's name and version (when the app gave them).
func (ob observation) writeApp(o *objw) {
	if ob.name != "" {
		o.str("appName", ob.name)
	}
	if ob.version != "" {
		o.str("appVersion", ob.version)
	}
}

// renderObservation writes ob's sections leanly into o (lean.go). first is
// connect_session's first look: the state is kept under stateBudget. It
// reports whether parts of the state were left out.
func (e *Executor) renderObservation(o *objw, ob observation, first bool) (omitted bool) {
	if ob.state != nil {
		if first {
			kept, om := budgetState(ob.state, stateBudget)
			if kept != nil {
				o.raw("state", kept)
			}
			if om != nil {
				o.raw("stateOmitted", om)
				omitted = true
			}
		} else {
			o.raw("state", ob.state)
		}
	}
	switch {
	case ob.leanOK:
		o.key("actions")
		o.b = encodeActions(o.b, ob.lean)
	case ob.actions != nil:
		o.raw("actions", ob.actions)
	}
	o.compact("docs", ob.docs)
	if !isEmpty(ob.stateSchema) {
		o.raw("stateSchema", ob.stateSchema)
	}
	o.compact("context", ob.context)
	if ob.health != nil && healthWrong(ob.health) {
		o.raw("health", ob.health)
	}
	for _, m := range ob.ms {
		if !observed[m.key] && !isEmpty(m.val) {
			o.raw(m.key, m.val)
		}
	}
	return omitted
}

// remember records what an observation showed the model.
func (e *Executor) remember(handle string, ob observation) {
	e.bindings.Update(handle, func(b *Binding) {
		switch {
		case b.sigsRaw != nil && bytes.Equal(b.sigsRaw, ob.messages): // kept already
		case len(ob.messages) > maxSigsBytes || sigsHeld(ob.sigs) > maxRenderBytes:
			b.sigs, b.sigsRaw = nil, nil
		default:
			b.sigs, b.sigsRaw = ob.sigs, bytes.Clone(ob.messages)
		}
		b.setShown(ob.actions, ob.lean, ob.leanOK)
		b.setView(ob.state)
	})
}

// setShown records the action list the model was shown (raw as LAP sent it,
// as rendered); a list that could not be rendered or is too large to keep
// is forgotten, so the next one is sent whole.
func (b *Binding) setShown(raw []byte, as []leanAction, ok bool) {
	if ok && b.shownSet && bytes.Equal(b.shownRaw, raw) {
		return
	}
	b.shown, b.shownRaw, b.shownSet = nil, nil, false
	if ok && len(raw) <= maxShownBytes && leanHeld(as) <= maxRenderBytes {
		b.shown, b.shownRaw, b.shownSet = as, bytes.Clone(raw), true
	}
}

// rememberActions records a whole action list the model was shown.
func (e *Executor) rememberActions(handle string, raw []byte, as []leanAction) {
	e.bindings.Update(handle, func(b *Binding) { b.setShown(raw, as, true) })
}

// actionsUpdate compares a fresh action list (raw, from a dispatch result)
// with what the model was shown through the binding b (a snapshot) and
// records it. It returns what to put in the result: the whole list when the
// model was never shown one (key "actions"), what changed ("actionsChanged"),
// or nothing (key "").
func (e *Executor) actionsUpdate(b Binding, raw []byte) (key string, val []byte) {
	var as []leanAction
	if !(b.shownSet && bytes.Equal(raw, b.shownRaw)) {
		var ok bool
		if as, ok = leanActionList(raw, b.sigs); !ok {
			e.bindings.Update(b.Handle, func(b *Binding) { b.setShown(nil, nil, false) })
			return "actions", raw
		}
	}
	e.bindings.Update(b.Handle, func(cur *Binding) {
		switch {
		case cur.shownSet && bytes.Equal(raw, cur.shownRaw):
			return // unchanged since it was shown
		case !cur.shownSet:
			if as == nil {
				as, _ = leanActionList(raw, cur.sigs)
			}
			key, val = "actions", encodeActions(nil, as)
		default:
			if as == nil {
				as, _ = leanActionList(raw, cur.sigs)
			}
			if d := actionsDelta(cur.shown, as); d != nil {
				key, val = "actionsChanged", d
			}
		}
		cur.setShown(raw, as, true)
	})
	return key, val
}
