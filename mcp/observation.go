package mcp

// observation is a LAP /observe body, split into its sections (the values
// are sub-slices of the body; nothing is decoded).
type observation struct {
	ms                        []member
	state, actions, context   []byte
	health, docs, stateSchema []byte
	name, version, schemaHash string
	sigs                      map[string]string
	lean                      []leanAction
	leanOK                    bool
}

// observed are the members renderObservation handles itself.
var observed = map[string]bool{"state": true, "actions": true, "description": true, "context": true, "health": true}

func parseObservation(raw []byte) (observation, bool) {
	ms, ok := members(raw)
	if !ok {
		return observation{}, false
	}
	ob := observation{ms: ms, state: get(ms, "state"), actions: get(ms, "actions"), context: get(ms, "context"), health: get(ms, "health")}
	if dm, ok := members(get(ms, "description")); ok {
		ob.name, ob.version, ob.schemaHash = jstr(get(dm, "name")), jstr(get(dm, "version")), jstr(get(dm, "schemaHash"))
		ob.docs, ob.stateSchema = get(dm, "docs"), get(dm, "stateSchema")
		ob.sigs = payloadSigs(get(dm, "messages"))
	}
	if ob.actions != nil {
		ob.lean, ob.leanOK = leanActionList(ob.actions, ob.sigs)
	}
	return ob, true
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
		o.raw("actions", encodeActions(nil, ob.lean))
	case ob.actions != nil:
		o.raw("actions", ob.actions)
	}
	if d := compactObject(ob.docs); d != nil {
		o.raw("docs", d)
	}
	if !isEmpty(ob.stateSchema) {
		o.raw("stateSchema", ob.stateSchema)
	}
	if c := compactObject(ob.context); c != nil {
		o.raw("context", c)
	}
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
		b.sigs = ob.sigs
		b.shown, b.shownSet = nil, false
		if ob.leanOK && sizeOf(ob.lean) <= maxShownBytes {
			b.shown, b.shownSet = ob.lean, true
		}
	})
}

// rememberActions records a whole action list the model was shown.
func (e *Executor) rememberActions(handle string, as []leanAction) {
	e.bindings.Update(handle, func(b *Binding) {
		b.shown, b.shownSet = nil, false
		if sizeOf(as) <= maxShownBytes {
			b.shown, b.shownSet = as, true
		}
	})
}

// actionsUpdate compares a fresh action list with what the model was shown
// and records it. full is true when the model was never shown a list (send
// the whole list then); otherwise delta is what changed (nil: nothing).
func (e *Executor) actionsUpdate(handle string, as []leanAction) (delta []byte, full bool) {
	full = true
	e.bindings.Update(handle, func(b *Binding) {
		if b.shownSet {
			full = false
			delta = actionsDelta(b.shown, as)
		}
		b.shown, b.shownSet = nil, false
		if sizeOf(as) <= maxShownBytes {
			b.shown, b.shownSet = as, true
		}
	})
	return delta, full
}

// sigsFor returns the payload signatures last seen for b's app.
func (e *Executor) sigsFor(b Binding) map[string]string { return b.sigs }
