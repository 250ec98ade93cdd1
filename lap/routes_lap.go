package lap

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/pairing"
)

var lapRoutes map[string]lapHandler

func init() {
	lapRoutes = map[string]lapHandler{
		"/describe":         routeDescribe,
		"/observe":          routeObserve,
		"/state":            routeState,
		"/query-state":      routeQueryState,
		"/actions":          forward("list_actions"),
		"/message":          routeMessage,
		"/confirm-result":   routeConfirmResult,
		"/wait":             routeWait,
		"/narrate":          routeNarrate,
		"/query-dom":        routeQueryDOM,
		"/describe-visible": forward("describe_visible_content"),
		"/context":          forward("describe_context"),
		"/recent-actions":   routeRecentActions,
		"/would-dispatch":   routeWouldDispatch,
	}
}

var emptyArgs = json.RawMessage(`{}`)

// forward is a route that is one RPC with no arguments; the result passes through.
func forward(tool string) lapHandler {
	return func(c *call) (any, *apiError) {
		res, ae := c.rpc(tool, emptyArgs, 0)
		if ae != nil {
			return nil, ae
		}
		c.audit = map[string]any{"tool": tool}
		return res, nil
	}
}

// optString reads an optional string field: absent/null → "", true.
func optString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// optNumber reads an optional number; absent/null/non-number → def.
func optNumber(raw json.RawMessage, def float64) float64 {
	var f float64
	if len(raw) == 0 || json.Unmarshal(raw, &f) != nil {
		return def
	}
	return f
}

// timeoutMs turns a caller's timeoutMs into a duration in [0, MaxTimeout].
func timeoutMs(raw json.RawMessage, def time.Duration) time.Duration {
	ms := optNumber(raw, float64(def/time.Millisecond))
	if ms != ms || ms < 0 { // NaN or negative
		return def
	}
	d := time.Duration(ms * float64(time.Millisecond))
	if ms > float64(MaxTimeout/time.Millisecond) {
		d = MaxTimeout
	}
	return d
}

func routeDescribe(c *call) (any, *apiError) {
	h, ok := c.s.cfg.Registry.Hello(c.tid)
	if !ok {
		return nil, c.noHello()
	}
	c.audit = map[string]any{"tool": "describe_app"}
	return json.RawMessage(c.s.descs.get(c.tid, h)), nil
}

// observeResp splices the tab's observe result with the description and health.
type observeResp struct {
	result json.RawMessage
	reply  pairing.Reply // holds result's read buffer until the response is written
	desc   []byte
	health pairing.Health
}

func (o observeResp) writeTo(w http.ResponseWriter) {
	buf := getBuf()
	defer putBuf(buf)
	defer o.reply.Release()
	res := trimSpace(o.result)
	if len(res) >= 2 && res[0] == '{' && res[len(res)-1] == '}' {
		buf.Write(res[:len(res)-1])
		if len(trimSpace(res[1:len(res)-1])) > 0 {
			buf.WriteByte(',')
		}
	} else {
		// not an object: keep it visible under "result"
		buf.WriteString(`{"result":`)
		buf.Write(res)
		buf.WriteByte(',')
	}
	buf.WriteString(`"description":`)
	buf.Write(o.desc)
	buf.WriteString(`,"health":`)
	buf.Write(o.health.AppendJSON(buf.AvailableBuffer()))
	buf.WriteByte('}')
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
}

// release returns the reply's buffer when the response is not written.
func (o observeResp) release() { o.reply.Release() }

func routeObserve(c *call) (any, *apiError) {
	// No hello, no observe (as the reference): the tab is not asked for a
	// state nobody would receive.
	if _, ok := c.s.cfg.Registry.Hello(c.tid); !ok {
		return nil, c.noHello()
	}
	// The result (the app's whole state) is read in place in the buffer it
	// arrived in, and spliced into the response: never decoded, not copied
	// out first. The hello is read again after the call: in a cluster its
	// reply tells this node the tab's hello generation, so the description
	// below is the one that goes with the state.
	start := c.rpcStart()
	reply, err := c.s.cfg.Registry.CallReply(c.ctx, c.tid, "observe", emptyArgs, 0)
	c.rpcDone("observe", start, err)
	if err != nil {
		return nil, c.rpcErr(err)
	}
	h, ok := c.s.cfg.Registry.Hello(c.tid)
	if !ok {
		reply.Release()
		return nil, c.noHello()
	}
	c.audit = map[string]any{"tool": "observe"}
	return observeResp{result: reply.Data, reply: reply, desc: c.s.descs.get(c.tid, h), health: c.s.cfg.Registry.Health(c.tid)}, nil
}

type pathBody struct {
	Path json.RawMessage `json:"path"`
}

func routeState(c *call) (any, *apiError) {
	var b pathBody
	c.decode(&b)
	path, ok := optString(b.Path)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "path must be a string")
	}
	args, _ := json.Marshal(map[string]string{"path": path})
	res, ae := c.rpc("get_state", json.RawMessage(args), 0)
	if ae != nil {
		return nil, ae
	}
	c.audit = map[string]any{"tool": "get_state", "path": path}
	return res, nil
}

func routeQueryState(c *call) (any, *apiError) {
	var b pathBody
	c.decode(&b)
	path, ok := optString(b.Path)
	if !ok || len(b.Path) == 0 || string(b.Path) == "null" {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "path required (a JSON Pointer string)")
	}
	args, _ := json.Marshal(map[string]string{"path": path})
	res, ae := c.rpc("query_state", json.RawMessage(args), 0)
	if ae != nil {
		return nil, ae
	}
	c.audit = map[string]any{"tool": "query_state", "path": path}
	return res, nil
}

func routeQueryDOM(c *call) (any, *apiError) {
	var b struct {
		Name     json.RawMessage `json:"name"`
		Multiple json.RawMessage `json:"multiple"`
	}
	c.decode(&b)
	name, ok := optString(b.Name)
	if !ok || name == "" {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "name required")
	}
	multiple := truthy(b.Multiple)
	args, _ := json.Marshal(map[string]any{"name": name, "multiple": multiple})
	res, ae := c.rpc("query_dom", json.RawMessage(args), 0)
	if ae != nil {
		return nil, ae
	}
	c.audit = map[string]any{"tool": "query_dom", "name": name}
	return res, nil
}

// truthy coerces a JSON value to bool the way JavaScript's Boolean() does.
func truthy(raw json.RawMessage) bool {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case float64:
		return x != 0 && x == x
	case string:
		return x != ""
	}
	return true
}

func routeWait(c *call) (any, *apiError) {
	var b struct {
		Path      json.RawMessage `json:"path"`
		TimeoutMs json.RawMessage `json:"timeoutMs"`
	}
	c.decode(&b)
	path, ok := optString(b.Path)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "path must be a string")
	}
	ctx, cancel := c.s.pollContext(c.ctx, timeoutMs(b.TimeoutMs, 10*time.Second))
	defer cancel()
	state, err := c.s.cfg.Registry.Watch(ctx, c.tid, path)
	if err != nil && c.s.drainCtx.Err() != nil && c.ctx.Err() == nil {
		return nil, errShuttingDown // lapd is restarting: wait again there
	}
	c.audit = map[string]any{"path": c.s.cfg.BasePath + "/wait", "outcome": "changed"}
	switch {
	case err == nil:
		return concat(`{"status":"changed","stateAfter":`, orNull(state), `}`), nil
	case errors.Is(err, pairing.ErrTimeout) || (errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil):
		c.audit["outcome"] = "timeout"
		return json.RawMessage(`{"status":"timeout","stateAfter":null}`), nil
	}
	return nil, c.rpcErr(err)
}

func routeNarrate(c *call) (any, *apiError) {
	var b struct {
		Text   json.RawMessage `json:"text"`
		Intent json.RawMessage `json:"intent"`
	}
	c.decode(&b)
	text, ok := optString(b.Text)
	if !ok || text == "" {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "text required")
	}
	intent, ok := optString(b.Intent)
	if !ok || intent == "" {
		intent = "Agent narrated"
	}
	now := c.s.cfg.Clock().UnixMilli()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	id := "narrate-" + strconv.FormatInt(now, 10) + "-" + hex.EncodeToString(rnd[:])
	entry := map[string]any{"id": id, "at": now, "kind": "narrate", "intent": intent, "detail": text}
	// The tab echoes the entry: the route's lap-call covers it. One request
	// to the tab's node in a cluster, carrying the gate's admit.
	if err := c.s.cfg.Registry.PushLog(c.ctx, c.tid, id, map[string]any{"t": "log-push", "entry": entry}); err != nil {
		return nil, c.rpcErr(err)
	}
	c.audit = map[string]any{"tool": "narrate"}
	return json.RawMessage(`{"ok":true}`), nil
}

// MaxRecentActions caps /recent-actions n (the tab ring holds 100).
const MaxRecentActions = 100

func routeRecentActions(c *call) (any, *apiError) {
	var b struct {
		N    json.RawMessage `json:"n"`
		Kind json.RawMessage `json:"kind"`
	}
	c.decode(&b)
	n := int(optNumber(b.N, 10))
	if n <= 0 {
		n = 10
	}
	if n > MaxRecentActions {
		n = MaxRecentActions
	}
	kind, _ := optString(b.Kind)
	entries := c.s.cfg.Registry.RecentLog(c.tid, n, kind)
	if entries == nil {
		entries = []json.RawMessage{}
	}
	c.audit = map[string]any{"tool": "describe_recent_actions", "count": len(entries), "kindFilter": kind}
	return map[string]any{"entries": entries}, nil
}

// concat builds a JSON response from pieces without decoding.
func concat(parts ...any) json.RawMessage {
	var buf bytes.Buffer
	for _, p := range parts {
		switch x := p.(type) {
		case string:
			buf.WriteString(x)
		case json.RawMessage:
			buf.Write(x)
		case []byte:
			buf.Write(x)
		}
	}
	return buf.Bytes()
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(trimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// descCache keeps the encoded /describe object per tid, rebuilt when the
// tab's hello changes. Tabs of one app send the same hello, so their
// encodings are shared by content (its SHA-256, taken when one is built):
// a tid then holds its entry (~290 B: the hello's headers, the shared
// slice), not a copy of the description (it did: 10,000 observing tabs of
// one app kept 10,000 copies, uncounted). A tid with a hello of its own
// holds its description, about its hello's bytes again; tids have an entry
// only while they have a hello (counted in pairing's BufferBytes).
type descCache struct {
	mu     sync.Mutex
	m      map[string]descEntry
	shared map[[32]byte]*descShared
}

type descEntry struct {
	hello pairing.Hello
	enc   []byte
	key   [32]byte // in shared
}

type descShared struct {
	enc  []byte
	refs int // tids whose entry holds it
}

func sameHello(a, b pairing.Hello) bool {
	return a.AppName == b.AppName && a.AppVersion == b.AppVersion && a.SchemaHash == b.SchemaHash &&
		bytes.Equal(a.MsgSchema, b.MsgSchema) && bytes.Equal(a.StateSchema, b.StateSchema) &&
		bytes.Equal(a.Docs, b.Docs)
}

func (d *descCache) get(tid string, h pairing.Hello) []byte {
	d.mu.Lock()
	e, ok := d.m[tid]
	d.mu.Unlock()
	if ok && sameHello(e.hello, h) {
		return e.enc
	}
	enc, _ := json.Marshal(map[string]any{
		"name": h.AppName, "version": h.AppVersion,
		"stateSchema": orNull(h.StateSchema), "messages": orNull(h.MsgSchema), "docs": orNull(h.Docs),
		"conventions": map[string]any{
			"dispatchModel": "TEA", "confirmationModel": "runtime-mediated",
			"readSurfaces": []string{"state", "query_dom", "describe_visible_content", "describe_context"},
		},
		"schemaHash": h.SchemaHash,
	})
	key := sha256.Sum256(enc)
	d.mu.Lock()
	if d.m == nil {
		d.m, d.shared = map[string]descEntry{}, map[[32]byte]*descShared{}
	}
	sh := d.shared[key]
	if sh == nil {
		sh = &descShared{enc: enc}
		d.shared[key] = sh
	}
	sh.refs++
	if old, ok := d.m[tid]; ok {
		d.releaseLocked(old.key)
	}
	d.m[tid] = descEntry{hello: h, enc: sh.enc, key: key}
	d.mu.Unlock()
	return sh.enc
}

// releaseLocked drops one tid's hold on the shared encoding key.
func (d *descCache) releaseLocked(key [32]byte) {
	if sh := d.shared[key]; sh != nil {
		if sh.refs--; sh.refs <= 0 {
			delete(d.shared, key)
		}
	}
}

func (d *descCache) drop(tid string) {
	d.mu.Lock()
	if e, ok := d.m[tid]; ok {
		d.releaseLocked(e.key)
	}
	delete(d.m, tid)
	d.mu.Unlock()
}
