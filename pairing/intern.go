package pairing

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"runtime"
	"sync"
	"weak"
)

// helloTable shares one *Hello between the tabs that sent identical hellos.
// Every tab of an app sends the same schemas, policy and docs (kilobytes),
// so 10,000 tabs of one app keep them once instead of 10,000 times. Entries
// are weak: a Hello no session holds any more is collected, and its entry
// removed by a cleanup.
type helloTable struct {
	mu   sync.Mutex
	seed maphash.Seed
	m    map[uint64]weak.Pointer[Hello]
}

// intern returns the shared Hello equal to h, or a copy of h that becomes
// the shared one. h's fields may alias a buffer that is reused afterwards.
// The result must not be changed.
func (t *helloTable) intern(h *Hello) *Hello {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.seed = maphash.MakeSeed()
		t.m = map[uint64]weak.Pointer[Hello]{}
	}
	k := t.key(h)
	if p := t.m[k].Value(); p != nil {
		if sameHelloBytes(p, h) {
			return p
		}
		return h.clone() // a hash collision: keep this one unshared
	}
	h = h.clone()
	t.m[k] = weak.Make(h)
	runtime.AddCleanup(h, t.forget, k)
	return h
}

// clone copies h's bytes out of the buffer they may alias.
func (h *Hello) clone() *Hello {
	c := *h
	c.MsgSchema, c.StateSchema, c.AffordancesSample = clone(h.MsgSchema), clone(h.StateSchema), clone(h.AffordancesSample)
	c.Docs, c.Policy = clone(h.Docs), clone(h.Policy)
	return &c
}

// forget removes k once its Hello is collected (unless k was reused).
func (t *helloTable) forget(k uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.m[k]; ok && p.Value() == nil {
		delete(t.m, k)
	}
}

func (t *helloTable) key(h *Hello) uint64 {
	var mh maphash.Hash
	mh.SetSeed(t.seed)
	for _, s := range []string{h.AppName, h.AppVersion, h.SchemaHash} {
		mh.WriteString(s)
		mh.WriteByte(0)
	}
	for _, b := range []json.RawMessage{h.MsgSchema, h.StateSchema, h.AffordancesSample, h.Docs, h.Policy} {
		mh.Write(b)
		mh.WriteByte(0)
	}
	mh.WriteByte(byte(h.LapVersion))
	return mh.Sum64()
}

func sameHelloBytes(a, b *Hello) bool {
	return a.AppName == b.AppName && a.AppVersion == b.AppVersion && a.SchemaHash == b.SchemaHash &&
		a.LapVersion == b.LapVersion && bytes.Equal(a.MsgSchema, b.MsgSchema) && bytes.Equal(a.StateSchema, b.StateSchema) &&
		bytes.Equal(a.AffordancesSample, b.AffordancesSample) && bytes.Equal(a.Docs, b.Docs) && bytes.Equal(a.Policy, b.Policy)
}
