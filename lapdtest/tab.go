package lapdtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// RPCError is what a handler returns to answer with an rpc-error frame.
type RPCError struct {
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

func (e *RPCError) Error() string { return e.Code + ": " + e.Detail }

// Handler answers one rpc tool. result is marshalled with encoding/json (a
// json.RawMessage passes through). It runs on its own goroutine.
type Handler func(args json.RawMessage) (result any, err *RPCError)

// Reducer applies msg (an object with a string "type") to state (a deep copy
// the reducer may change) and returns the new state.
type Reducer func(state any, msg map[string]any) (any, error)

// Action describes one action (variant) of the app a Tab plays.
type Action struct {
	Variant         string          `json:"variant"`
	Intent          string          `json:"intent,omitempty"`
	Schema          json.RawMessage `json:"schema,omitempty"` // JSON Schema of the payload (the msg without "type")
	RequiresConfirm bool            `json:"requiresConfirm,omitempty"`
	HumanOnly       bool            `json:"humanOnly,omitempty"`
	// Apply returns the state after msg (state is a deep copy it may
	// change); nil = App.Reduce (or the demo reducer).
	Apply Reducer `json:"-"`
}

// Frame is one frame received from the server.
type Frame struct {
	T   string          // the frame's "t"
	Raw json.RawMessage // the whole frame
}

// Decode unmarshals the frame into v.
func (f Frame) Decode(v any) error { return json.Unmarshal(f.Raw, v) }

// Field returns one top-level field of the frame (nil if absent).
func (f Frame) Field(name string) json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(f.Raw, &m)
	return m[name]
}

// Hello is the hello frame the tab sends.
type Hello struct {
	T                 string          `json:"t"`
	AppName           string          `json:"appName"`
	AppVersion        string          `json:"appVersion"`
	MsgSchema         json.RawMessage `json:"msgSchema,omitempty"`
	StateSchema       json.RawMessage `json:"stateSchema,omitempty"`
	AffordancesSample json.RawMessage `json:"affordancesSample,omitempty"`
	Docs              json.RawMessage `json:"docs,omitempty"`
	SchemaHash        string          `json:"schemaHash"`
	LapVersion        int             `json:"lapVersion,omitempty"`
	Policy            json.RawMessage `json:"policy,omitempty"`
	Visible           *bool           `json:"visible,omitempty"`
}

// DialError is a refused WebSocket dial.
type DialError struct {
	Status int    // HTTP status of the refusal; 0 if there was no response
	Body   []byte // first bytes of the response body
	Header http.Header
	Err    error
}

func (e *DialError) Error() string {
	return fmt.Sprintf("lapdtest: dial refused: status %d %s: %v", e.Status, bytes.TrimSpace(e.Body), e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Option configures Dial.
type Option func(*config)

type config struct {
	hello      Hello
	sendHello  bool
	waitAck    bool
	state      any
	reducer    Reducer
	actions    []Action
	handlers   map[string]Handler
	header     http.Header
	logAppend  bool
	tabSecret  string
	queryToken bool
	readLimit  int64
	schemas    map[string]*jsonschema.Schema
}

// WithHello edits the hello frame before it is sent.
func WithHello(fn func(*Hello)) Option { return func(c *config) { fn(&c.hello) } }

// WithAppName sets hello.appName.
func WithAppName(name string) Option { return func(c *config) { c.hello.AppName = name } }

// WithPolicy sets lapd's hello.policy.
func WithPolicy(raw json.RawMessage) Option { return func(c *config) { c.hello.Policy = raw } }

// WithLapVersion sets hello.lapVersion (0 = omitted).
func WithLapVersion(v int) Option { return func(c *config) { c.hello.LapVersion = v } }

// WithTabSecret presents the session's tab secret (Session.TabSecret), as
// lapd.js does: a session minted with one opens its socket only with it.
func WithTabSecret(secret string) Option { return func(c *config) { c.tabSecret = secret } }

// WithTokenInQuery sends the token as ?token= (the reference client's form)
// instead of the Sec-WebSocket-Protocol entry lapd.js uses.
func WithTokenInQuery() Option { return func(c *config) { c.queryToken = true } }

// WithoutHello skips the hello (and the wait for hello-ack).
func WithoutHello() Option { return func(c *config) { c.sendHello = false; c.waitAck = false } }

// WithoutAckWait sends hello but returns from Dial without waiting for hello-ack.
func WithoutAckWait() Option { return func(c *config) { c.waitAck = false } }

// WithState sets the initial state (any JSON-marshalable value).
func WithState(v any) Option { return func(c *config) { c.state = v } }

// WithReducer replaces the demo reducer.
func WithReducer(r Reducer) Option { return func(c *config) { c.reducer = r } }

// WithActions replaces the demo action list.
func WithActions(a ...Action) Option { return func(c *config) { c.actions = a } }

// WithHandler overrides (or adds) the handler of one tool.
func WithHandler(tool string, h Handler) Option {
	return func(c *config) { c.handlers[tool] = h }
}

// WithOrigin sets the Origin header of the handshake.
func WithOrigin(origin string) Option { return func(c *config) { c.header.Set("Origin", origin) } }

// WithHeader adds a handshake header.
func WithHeader(k, v string) Option { return func(c *config) { c.header.Add(k, v) } }

// WithoutLogAppend stops the log-append after each rpc.
func WithoutLogAppend() Option { return func(c *config) { c.logAppend = false } }

// WithReadLimit sets the largest frame the tab accepts (default 16 MiB).
func WithReadLimit(n int64) Option { return func(c *config) { c.readLimit = n } }

// DemoActions are the default actions.
func DemoActions() []Action {
	return []Action{
		{Variant: "inc", Intent: "Increment the counter"},
		{Variant: "addTodo", Intent: "Add a task"},
		{Variant: "clearAll", Intent: "Delete every task", RequiresConfirm: true},
		{Variant: "reset", Intent: "Reset (humans only)", HumanOnly: true},
	}
}

// DemoPolicy is a hello.policy matching DemoActions (addTodo needs a
// non-empty string title and nothing else).
func DemoPolicy() json.RawMessage {
	return json.RawMessage(`{"variants":{` +
		`"inc":{"intent":"Increment the counter"},` +
		`"addTodo":{"intent":"Add a task","schema":{"type":"object","properties":{"title":{"type":"string","minLength":1}},"required":["title"],"additionalProperties":false}},` +
		`"clearAll":{"intent":"Delete every task","requiresConfirm":true},` +
		`"reset":{"intent":"Reset (humans only)","humanOnly":true}}}`)
}

func demoReducer(state any, msg map[string]any) (any, error) {
	m, _ := state.(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	switch msg["type"] {
	case "inc":
		n, _ := m["count"].(float64)
		m["count"] = n + 1
	case "addTodo":
		title, _ := msg["title"].(string)
		todos, _ := m["todos"].([]any)
		m["todos"] = append(todos, map[string]any{"title": title})
	case "clearAll":
		m["todos"] = []any{}
	case "reset":
		m["count"] = float64(0)
		m["todos"] = []any{}
	default:
		return nil, fmt.Errorf("unknown variant %v", msg["type"])
	}
	return m, nil
}

// Tab is a connected fake tab. Safe for concurrent use.
type Tab struct {
	conn *websocket.Conn
	cfg  config

	mu       sync.Mutex
	state    any
	frames   []Frame
	cursor   int
	notify   chan struct{} // closed and replaced on every new frame
	watches  map[string]string
	pending  map[string]pendingConfirm
	proposed []string                  // confirmIds in the order the tab proposed them
	confCur  int                       // WaitConfirm's cursor into proposed
	idem     map[string]any            // send_message results by idempotencyKey
	answered map[string]map[string]any // confirmId → the confirm-resolved frame sent (last maxAnswered)
	ansOrder []string                  // answered's keys, oldest first
	rpcCount map[string]int
	readErr  error

	done    chan struct{}
	wg      sync.WaitGroup
	ackOnce sync.Once
	acked   chan struct{}
}

type pendingConfirm struct {
	variant string
	msg     map[string]any
}

// Dial connects to wsURL (ws:// or http://) as lapd.js does: the token in a
// Sec-WebSocket-Protocol entry "lapd.token.<token>" beside "lapd.v2" (plus
// "lapd.tab.<secret>" with WithTabSecret), never in the URL.
func Dial(ctx context.Context, wsURL, token string, opts ...Option) (*Tab, error) {
	c := config{
		hello: Hello{
			T: "hello", AppName: "lapdtest", AppVersion: "1.0.0",
			StateSchema: json.RawMessage(`{"type":"object"}`),
			Docs:        json.RawMessage(`{"purpose":"A fake app for tests"}`),
			SchemaHash:  "lapdtest-1", LapVersion: 2,
		},
		sendHello: true, waitAck: true,
		state:     map[string]any{"count": float64(0), "todos": []any{}},
		reducer:   demoReducer,
		actions:   DemoActions(),
		handlers:  map[string]Handler{},
		header:    http.Header{},
		logAppend: true,
		readLimit: 16 << 20,
	}
	for _, o := range opts {
		o(&c)
	}
	if c.hello.MsgSchema == nil {
		vars := map[string]any{}
		for _, a := range c.actions {
			vars[a.Variant] = map[string]any{}
		}
		c.hello.MsgSchema, _ = json.Marshal(map[string]any{"discriminant": "type", "variants": vars})
	}
	u, err := url.Parse(wsURL)
	if err != nil {
		return nil, fmt.Errorf("lapdtest: bad url: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	protocols := []string{"lapd.v2"}
	switch {
	case token != "" && c.queryToken:
		q := u.Query()
		q.Set("token", token)
		u.RawQuery = q.Encode()
	case token != "":
		protocols = append(protocols, "lapd.token."+token)
	}
	if c.tabSecret != "" {
		protocols = append(protocols, "lapd.tab."+c.tabSecret)
	}
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPHeader: c.header, Subprotocols: protocols})
	if err != nil {
		de := &DialError{Err: err}
		if resp != nil {
			de.Status = resp.StatusCode
			de.Header = resp.Header
			if resp.Body != nil {
				de.Body, _ = io.ReadAll(io.LimitReader(resp.Body, 1024))
				resp.Body.Close()
			}
		}
		return nil, de
	}
	if c.schemas, err = compileSchemas(c.actions); err != nil {
		conn.CloseNow()
		return nil, err
	}
	conn.SetReadLimit(c.readLimit)
	st, err := deepCopy(c.state)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("lapdtest: state not JSON: %w", err)
	}
	t := &Tab{
		conn: conn, cfg: c, state: st,
		notify:   make(chan struct{}),
		watches:  map[string]string{},
		pending:  map[string]pendingConfirm{},
		answered: map[string]map[string]any{},
		idem:     map[string]any{},
		rpcCount: map[string]int{},
		done:     make(chan struct{}),
		acked:    make(chan struct{}),
	}
	t.wg.Add(1)
	go t.readLoop()
	if c.sendHello {
		if err := t.Send(ctx, c.hello); err != nil {
			// lapd may have closed the socket before the hello went out (a
			// takeover elsewhere, a refusal): its close frame, which the
			// reader has or is about to have, says why.
			wait := time.NewTimer(time.Second)
			select {
			case <-t.done:
				if websocket.CloseStatus(t.Err()) != -1 {
					err = t.Err()
				}
			case <-wait.C:
			case <-ctx.Done():
			}
			wait.Stop()
			t.Abort()
			return nil, fmt.Errorf("lapdtest: send hello: %w", err)
		}
	}
	if c.waitAck {
		select {
		case <-t.acked:
		case <-t.done:
			err := t.Err()
			t.Abort()
			return nil, fmt.Errorf("lapdtest: closed before hello-ack: %w", err)
		case <-ctx.Done():
			t.Abort()
			return nil, fmt.Errorf("lapdtest: waiting for hello-ack: %w", ctx.Err())
		}
	}
	return t, nil
}

// Send writes one frame (any JSON-marshalable value).
func (t *Tab) Send(ctx context.Context, frame any) error {
	b, err := json.Marshal(frame)
	if err != nil {
		return err
	}
	return t.conn.Write(ctx, websocket.MessageText, b)
}

func (t *Tab) sendBG(frame any) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.Send(ctx, frame)
}

// Close closes the socket with status 1000 and waits for the tab's goroutines.
func (t *Tab) Close() error {
	err := t.conn.Close(websocket.StatusNormalClosure, "bye")
	t.wg.Wait()
	return err
}

// Abort drops the connection without a close handshake (a crashed tab) and
// waits for the tab's goroutines (including handlers still running).
func (t *Tab) Abort() {
	t.conn.CloseNow()
	t.wg.Wait()
}

// Kill drops the connection without a close handshake and returns at once,
// without waiting for handlers that are still running (call Abort later).
func (t *Tab) Kill() { t.conn.CloseNow() }

// Done is closed when the connection is gone (either side).
func (t *Tab) Done() <-chan struct{} { return t.done }

// Err is why the read loop ended (a websocket.CloseError when the server
// closed; use CloseStatus).
func (t *Tab) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readErr
}

// CloseStatus is the close code the server sent, or -1.
func (t *Tab) CloseStatus() websocket.StatusCode { return websocket.CloseStatus(t.Err()) }

func (t *Tab) readLoop() {
	defer t.wg.Done()
	defer close(t.done)
	for {
		_, b, err := t.conn.Read(context.Background())
		if err != nil {
			t.mu.Lock()
			t.readErr = err
			t.mu.Unlock()
			t.conn.CloseNow()
			return
		}
		var env struct {
			T    string          `json:"t"`
			ID   json.RawMessage `json:"id"`
			Tool string          `json:"tool"`
			Args json.RawMessage `json:"args"`
			Path string          `json:"path"`
		}
		if json.Unmarshal(b, &env) != nil {
			continue
		}
		// watches and synced approvals are stored before the frame is
		// recorded, so a test that saw the frame can act on it right away.
		switch env.T {
		case "watch", "unwatch":
			var id string
			_ = json.Unmarshal(env.ID, &id)
			t.mu.Lock()
			if env.T == "watch" {
				t.watches[id] = env.Path
			} else {
				delete(t.watches, id)
			}
			t.mu.Unlock()
		case "confirm-sync":
			t.syncConfirms(b)
		}
		t.record(Frame{T: env.T, Raw: b})
		switch env.T {
		case "hello-ack":
			t.ackOnce.Do(func() { close(t.acked) })
		case "rpc":
			var id string
			_ = json.Unmarshal(env.ID, &id)
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				t.answer(id, env.Tool, env.Args)
			}()
		case "log-push":
			var f struct {
				Entry json.RawMessage `json:"entry"`
			}
			if json.Unmarshal(b, &f) == nil && f.Entry != nil {
				go t.sendBG(map[string]any{"t": "log-append", "entry": f.Entry})
			}
		case "confirm-expire":
			var f struct {
				ConfirmID string `json:"confirmId"`
			}
			_ = json.Unmarshal(b, &f)
			t.mu.Lock()
			delete(t.pending, f.ConfirmID)
			t.mu.Unlock()
		}
	}
}

// syncConfirms adopts the approvals lapd says are pending for this session
// (after a reload or a reconnect), as lapd.js's syncConfirms does, so
// PendingConfirms, WaitConfirm and Approve see them.
func (t *Tab) syncConfirms(frame []byte) {
	var f struct {
		Pending []struct {
			ConfirmID string          `json:"confirmId"`
			Variant   string          `json:"variant"`
			Payload   json.RawMessage `json:"payload"`
		} `json:"pending"`
	}
	if json.Unmarshal(frame, &f) != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range f.Pending {
		if p.ConfirmID == "" {
			continue
		}
		if _, ok := t.pending[p.ConfirmID]; ok {
			continue
		}
		if a, ok := t.answered[p.ConfirmID]; ok {
			// Answered here, still pending there: the answer was lost on
			// the way, or crossed this frame. Answer again, do not show it.
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				t.sendBG(a)
			}()
			continue
		}
		msg := map[string]any{}
		_ = json.Unmarshal(p.Payload, &msg)
		if msg == nil {
			msg = map[string]any{}
		}
		msg["type"] = p.Variant
		t.pending[p.ConfirmID] = pendingConfirm{variant: p.Variant, msg: msg}
		t.proposed = append(t.proposed, p.ConfirmID)
	}
	t.wakeLocked()
}

func (t *Tab) record(f Frame) {
	t.mu.Lock()
	t.frames = append(t.frames, f)
	t.wakeLocked()
	t.mu.Unlock()
}

// wakeLocked wakes every waiter (Next, WaitFor, WaitConfirm); t.mu held.
func (t *Tab) wakeLocked() {
	close(t.notify)
	t.notify = make(chan struct{})
}

// WaitConfirm returns the next confirmId this tab proposed (an action that
// requires confirm was sent), waiting for one. Each proposal is returned
// once, in order. lapd records the proposal after the tab's reply: to
// approve at once, make sure lapd knows it first (Server.Approve does), or
// the confirm-resolved may arrive before the proposal and be ignored.
func (t *Tab) WaitConfirm(ctx context.Context) (string, error) {
	for {
		t.mu.Lock()
		if t.confCur < len(t.proposed) {
			id := t.proposed[t.confCur]
			t.confCur++
			t.mu.Unlock()
			return id, nil
		}
		ch := t.notify
		t.mu.Unlock()
		select {
		case <-ch:
		case <-t.done:
			return "", fmt.Errorf("%w: %v", ErrClosed, t.Err())
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Frames returns every frame received so far.
func (t *Tab) Frames() []Frame {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Frame(nil), t.frames...)
}

// Count returns how many frames of type typ were received so far.
func (t *Tab) Count(typ string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, f := range t.frames {
		if f.T == typ {
			n++
		}
	}
	return n
}

// RPCCount returns how many rpc frames for tool were answered (or are being).
func (t *Tab) RPCCount(tool string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rpcCount[tool]
}

// Next returns the next frame after the read cursor, waiting for one.
func (t *Tab) Next(ctx context.Context) (Frame, error) {
	return t.next(ctx, func(Frame) bool { return true })
}

// WaitFor advances the read cursor to the next frame of type typ (skipping
// others) and returns it, waiting if needed.
func (t *Tab) WaitFor(ctx context.Context, typ string) (Frame, error) {
	return t.next(ctx, func(f Frame) bool { return f.T == typ })
}

func (t *Tab) next(ctx context.Context, match func(Frame) bool) (Frame, error) {
	for {
		t.mu.Lock()
		for t.cursor < len(t.frames) {
			f := t.frames[t.cursor]
			t.cursor++
			if match(f) {
				t.mu.Unlock()
				return f, nil
			}
		}
		ch := t.notify
		t.mu.Unlock()
		select {
		case <-ch:
		case <-t.done:
			// one last look: frames recorded before the close
			t.mu.Lock()
			more := t.cursor < len(t.frames)
			t.mu.Unlock()
			if !more {
				return Frame{}, fmt.Errorf("%w: %v", ErrClosed, t.Err())
			}
		case <-ctx.Done():
			return Frame{}, ctx.Err()
		}
	}
}

// State returns a copy of the current state.
func (t *Tab) State() any {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, _ := deepCopy(t.state)
	return v
}

// SetState replaces the state (as if the human changed it) and answers each
// open watch whose path value changed with a state-update frame.
func (t *Tab) SetState(v any) error {
	nv, err := deepCopy(v)
	if err != nil {
		return err
	}
	t.mu.Lock()
	old := t.state
	t.state = nv
	var ups []map[string]any
	for id, p := range t.watches {
		a, _ := lenientPointer(old, p)
		b, _ := lenientPointer(nv, p)
		if !reflect.DeepEqual(a, b) {
			ups = append(ups, map[string]any{"t": "state-update", "id": id, "path": p, "stateAfter": nv})
		}
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, u := range ups {
		if err := t.Send(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// Watches returns the number of open watches.
func (t *Tab) Watches() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.watches)
}

// PendingConfirms lists the confirmIds awaiting Approve/Reject.
func (t *Tab) PendingConfirms() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	for id := range t.pending {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Approve applies the pending msg to the state and sends confirm-resolved
// {outcome:"confirmed", stateAfter}. It also works for a confirmId the tab did
// not propose itself (e.g. one learned from confirm-sync after a reload).
func (t *Tab) Approve(ctx context.Context, confirmID string) error {
	t.mu.Lock()
	p, ok := t.pending[confirmID]
	delete(t.pending, confirmID)
	if ok {
		if ns, err := t.apply(p.msg); err == nil {
			t.state = ns
		}
	}
	st, _ := deepCopy(t.state)
	f := map[string]any{"t": "confirm-resolved", "confirmId": confirmID, "outcome": "confirmed", "stateAfter": st}
	t.answeredLocked(confirmID, f)
	t.mu.Unlock()
	return t.Send(ctx, f)
}

// Reject sends confirm-resolved {outcome:"user-cancelled"}.
func (t *Tab) Reject(ctx context.Context, confirmID string) error {
	f := map[string]any{"t": "confirm-resolved", "confirmId": confirmID, "outcome": "user-cancelled"}
	t.mu.Lock()
	delete(t.pending, confirmID)
	t.answeredLocked(confirmID, f)
	t.mu.Unlock()
	return t.Send(ctx, f)
}

// maxAnswered is how many answers a tab remembers (lapd.js: 100).
const maxAnswered = 100

// answeredLocked remembers the answer f to confirmID, as lapd.js does, so
// a confirm-sync that still lists it is answered again instead of shown
// again. t.mu held.
func (t *Tab) answeredLocked(confirmID string, f map[string]any) {
	if _, ok := t.answered[confirmID]; !ok {
		t.ansOrder = append(t.ansOrder, confirmID)
	}
	t.answered[confirmID] = f
	for len(t.ansOrder) > maxAnswered {
		delete(t.answered, t.ansOrder[0])
		t.ansOrder = t.ansOrder[1:]
	}
}

// apply runs the reducer on a copy of the state; t.mu held.
func (t *Tab) apply(msg map[string]any) (any, error) {
	cp, err := deepCopy(t.state)
	if err != nil {
		return nil, err
	}
	return t.cfg.reducer(cp, msg)
}

func (t *Tab) answer(id, tool string, args json.RawMessage) {
	t.mu.Lock()
	t.rpcCount[tool]++
	t.mu.Unlock()
	h := t.cfg.handlers[tool]
	if h == nil {
		h = t.defaultHandler(tool)
	}
	var res any
	var rerr *RPCError
	if h == nil {
		rerr = &RPCError{Code: "invalid", Detail: "unknown tool: " + tool}
	} else {
		res, rerr = h(args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rerr != nil {
		_ = t.Send(ctx, map[string]any{"t": "rpc-error", "id": id, "code": rerr.Code, "detail": rerr.Detail})
	} else {
		raw, err := json.Marshal(res)
		if err != nil {
			_ = t.Send(ctx, map[string]any{"t": "rpc-error", "id": id, "code": "internal", "detail": err.Error()})
			return
		}
		// splice, so a large result is not re-encoded
		buf := make([]byte, 0, len(raw)+len(id)+40)
		buf = append(buf, `{"t":"rpc-reply","id":`...)
		buf = strconv.AppendQuote(buf, id)
		buf = append(buf, `,"result":`...)
		buf = append(buf, raw...)
		buf = append(buf, '}')
		if err := t.conn.Write(ctx, websocket.MessageText, buf); err != nil {
			return
		}
	}
	if t.cfg.logAppend {
		_ = t.Send(ctx, map[string]any{"t": "log-append", "entry": t.logEntry(id, tool, args, res, rerr)})
	}
}

// readIntents are lapd.js's activity-feed intents of the read tools.
var readIntents = map[string]string{
	"get_state": "Read app state", "query_state": "Query app state", "list_actions": "List actions",
	"describe_visible_content": "Describe visible content", "describe_context": "Describe context",
	"observe": "Observe the app",
}

// logEntry is the activity entry lapd.js sends in the log-append after an
// rpc reply.
func (t *Tab) logEntry(id, tool string, args json.RawMessage, res any, rerr *RPCError) map[string]any {
	intent := readIntents[tool]
	if intent == "" {
		intent = tool
	}
	entry := map[string]any{"id": id, "at": time.Now().UnixMilli(), "kind": "read", "intent": intent}
	var a struct {
		Path string         `json:"path"`
		Name string         `json:"name"`
		Msg  map[string]any `json:"msg"`
	}
	_ = json.Unmarshal(args, &a)
	variant, _ := a.Msg["type"].(string)
	m, _ := res.(map[string]any)
	switch tool {
	case "query_state":
		entry["intent"] = "Query state: " + a.Path
	case "query_dom":
		entry["intent"] = "Query DOM: " + a.Name
	case "would_dispatch":
		entry["intent"], entry["variant"] = "Predict: "+variant, variant
	case "send_message":
		entry["variant"], entry["detail"] = variant, msgDetail(a.Msg)
		entry["intent"] = variant
		if act, ok := t.action(variant); ok && act.Intent != "" {
			entry["intent"] = act.Intent
		}
		switch m["status"] {
		case "dispatched", "confirmed":
			entry["kind"], entry["stateDiff"] = "dispatched", m["stateDiff"]
		case "pending-confirmation":
			entry["kind"] = "proposed"
		case "rejected":
			entry["kind"] = "blocked"
			entry["detail"] = fmt.Sprintf("%v: %v", m["reason"], m["detail"])
		}
	}
	if rerr != nil {
		entry["kind"], entry["detail"] = "error", rerr.Detail
	}
	return entry
}

// msgDetail is lapd.js's msgDetail: the first three non-type fields as
// k=v, each value cut at 30 characters.
func msgDetail(msg map[string]any) string {
	keys := make([]string, 0, len(msg))
	for k := range msg {
		if k != "type" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys) // JS keeps insertion order; a decoded Go map has none
	if len(keys) > 3 {
		keys = keys[:3]
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		var v string
		switch x := msg[k].(type) {
		case nil:
			v = "null"
		case string:
			b, _ := json.Marshal(x)
			v = string(b)
		case []any:
			v = fmt.Sprintf("[%d]", len(x))
		case map[string]any:
			ks := make([]string, 0, len(x))
			for k := range x {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			if len(ks) > 3 {
				ks = ks[:3]
			}
			v = "{" + strings.Join(ks, ",") + "}"
		default:
			v = fmt.Sprint(x)
		}
		if r := []rune(v); len(r) > 30 {
			v = string(r[:30]) + "…"
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

func (t *Tab) action(variant string) (Action, bool) {
	for _, a := range t.cfg.actions {
		if a.Variant == variant {
			return a, true
		}
	}
	return Action{}, false
}

func (t *Tab) listActions() []map[string]any {
	out := []map[string]any{}
	for _, a := range t.cfg.actions {
		if a.HumanOnly {
			continue
		}
		out = append(out, map[string]any{
			"variant": a.Variant, "intent": a.Intent, "requiresConfirm": a.RequiresConfirm,
			"dispatchMode": "shared", "source": "schema", "selectorHint": nil,
			"payloadHint": payloadHint(a.Variant, a.Schema), "warning": nil, "examples": []any{}, "emits": []any{},
			"fieldHints": fieldHints(a.Schema),
		})
	}
	return out
}

func (t *Tab) defaultHandler(tool string) Handler {
	switch tool {
	case "get_state":
		return func(args json.RawMessage) (any, *RPCError) {
			var a struct {
				Path string `json:"path"`
			}
			_ = json.Unmarshal(args, &a)
			v, ok := lenientPointer(t.State(), a.Path)
			if !ok {
				return map[string]any{}, nil
			}
			return map[string]any{"state": v}, nil
		}
	case "query_state":
		return func(args json.RawMessage) (any, *RPCError) {
			var a struct {
				Path string `json:"path"`
			}
			_ = json.Unmarshal(args, &a)
			v, ok := strictPointer(t.State(), a.Path)
			if !ok {
				return map[string]any{"found": false, "detail": "no value at " + a.Path}, nil
			}
			return map[string]any{"found": true, "value": v}, nil
		}
	case "list_actions":
		return func(json.RawMessage) (any, *RPCError) { return map[string]any{"actions": t.listActions()}, nil }
	case "observe":
		return func(json.RawMessage) (any, *RPCError) {
			return map[string]any{"state": t.State(), "actions": t.listActions(), "context": map[string]any{"summary": "A fake tab"}}, nil
		}
	case "describe_context":
		return func(json.RawMessage) (any, *RPCError) {
			return map[string]any{"context": map[string]any{"summary": "A fake tab", "hints": []string{}}}, nil
		}
	case "query_dom":
		return func(args json.RawMessage) (any, *RPCError) {
			var a struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(args, &a)
			return map[string]any{"elements": []any{map[string]any{"text": a.Name, "attrs": map[string]string{"data-agent": a.Name}, "path": []int{0}}}}, nil
		}
	case "describe_visible_content":
		return func(json.RawMessage) (any, *RPCError) {
			return map[string]any{"url": "http://lapdtest.test/", "outline": []any{map[string]any{"kind": "heading", "level": 1, "text": "Fake"}}, "source": "fallback"}, nil
		}
	case "send_message":
		return t.sendMessage
	case "would_dispatch":
		return t.wouldDispatch
	}
	return nil
}

type msgArgs struct {
	Msg            map[string]any `json:"msg"`
	Reason         string         `json:"reason"`
	IncludeState   bool           `json:"includeState"`
	IdempotencyKey string         `json:"idempotencyKey"`
}

// gate is lapd.js's gateMessage: the tab's own check before dispatching,
// whatever the server checked already.
func (t *Tab) gate(msg map[string]any) (Action, map[string]any) {
	typ, ok := msg["type"].(string)
	if !ok || typ == "" {
		return Action{}, map[string]any{"status": "rejected", "reason": "invalid", "detail": "msg.type must be a non-empty string"}
	}
	a, ok := t.action(typ)
	if !ok {
		return a, map[string]any{"status": "rejected", "reason": "invalid", "detail": "unknown variant: " + typ}
	}
	if a.HumanOnly {
		return a, map[string]any{"status": "rejected", "reason": "human-only", "detail": fmt.Sprintf("%q can only be done by the user in the app; ask them to do it", typ)}
	}
	if s := t.cfg.schemas[typ]; s != nil {
		if errs := payloadErrors(s, msg); errs != nil {
			var parts []string
			for _, e := range errs {
				p, _ := e["path"].(string)
				if p == "" {
					p = "(payload)"
				}
				parts = append(parts, fmt.Sprintf("%s: %v", p, e["message"]))
			}
			return a, map[string]any{"status": "rejected", "reason": "invalid", "detail": strings.Join(parts, "; "), "errors": errs}
		}
	}
	return a, nil
}

func (t *Tab) sendMessage(args json.RawMessage) (any, *RPCError) {
	var a msgArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, &RPCError{Code: "schema-error", Detail: err.Error()}
	}
	if a.IdempotencyKey != "" { // like lapd.js: one dispatch per key
		t.mu.Lock()
		prev, seen := t.idem[a.IdempotencyKey]
		t.mu.Unlock()
		if seen {
			return prev, nil
		}
		res, rerr := t.sendMessageOnce(a)
		if rerr == nil {
			t.mu.Lock()
			t.idem[a.IdempotencyKey] = res
			t.mu.Unlock()
		}
		return res, rerr
	}
	return t.sendMessageOnce(a)
}

func (t *Tab) sendMessageOnce(a msgArgs) (any, *RPCError) {
	act, rej := t.gate(a.Msg)
	if rej != nil {
		return rej, nil
	}
	if act.RequiresConfirm {
		id := newID()
		t.mu.Lock()
		t.pending[id] = pendingConfirm{variant: act.Variant, msg: a.Msg}
		t.proposed = append(t.proposed, id)
		t.wakeLocked()
		t.mu.Unlock()
		return map[string]any{"status": "pending-confirmation", "confirmId": id}, nil
	}
	start := time.Now()
	t.mu.Lock()
	old := t.state
	ns, err := t.apply(a.Msg)
	if err != nil {
		t.mu.Unlock()
		return map[string]any{"status": "rejected", "reason": "invalid", "detail": err.Error()}, nil
	}
	t.state = ns
	var ups []map[string]any
	for id, p := range t.watches {
		x, _ := lenientPointer(old, p)
		y, _ := lenientPointer(ns, p)
		if !reflect.DeepEqual(x, y) {
			ups = append(ups, map[string]any{"t": "state-update", "id": id, "path": p, "stateAfter": ns})
		}
	}
	after, _ := deepCopy(ns)
	t.mu.Unlock()
	for _, u := range ups {
		t.sendBG(u)
	}
	res := map[string]any{
		"status": "dispatched", "stateDiff": diff(old, after), "actions": t.listActions(),
		"drain": map[string]any{"effectsObserved": 0, "durationMs": time.Since(start).Milliseconds(), "timedOut": false, "errors": []any{}},
	}
	if a.IncludeState {
		res["stateAfter"] = after
	}
	return res, nil
}

func (t *Tab) wouldDispatch(args json.RawMessage) (any, *RPCError) {
	var a msgArgs
	_ = json.Unmarshal(args, &a)
	_, rej := t.gate(a.Msg)
	if rej != nil {
		if errs, ok := rej["errors"]; ok {
			return map[string]any{"status": "rejected", "reason": "schema-mismatch", "errors": errs}, nil
		}
		return rej, nil
	}
	t.mu.Lock()
	old := t.state
	ns, err := t.apply(a.Msg)
	t.mu.Unlock()
	if err != nil {
		return map[string]any{"status": "reducer-threw", "message": err.Error()}, nil
	}
	return map[string]any{"status": "predicted", "stateDiff": diff(old, ns), "effects": []any{}}, nil
}

// diff is a top-level JSON-Patch (add/remove/replace) between two states.
func diff(a, b any) []map[string]any {
	ops := []map[string]any{}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if !reflect.DeepEqual(a, b) {
			ops = append(ops, map[string]any{"op": "replace", "path": "", "value": b})
		}
		return ops
	}
	keys := map[string]bool{}
	for k := range am {
		keys[k] = true
	}
	for k := range bm {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		p := "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
		av, ina := am[k]
		bv, inb := bm[k]
		switch {
		case ina && !inb:
			ops = append(ops, map[string]any{"op": "remove", "path": p})
		case !ina && inb:
			ops = append(ops, map[string]any{"op": "add", "path": p, "value": bv})
		case !reflect.DeepEqual(av, bv):
			ops = append(ops, map[string]any{"op": "replace", "path": p, "value": bv})
		}
	}
	return ops
}

func deepCopy(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = json.Unmarshal(b, &out)
	return out, err
}

func unescape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
}

// lenientPointer: "" or "/" is the root, empty segments are skipped.
func lenientPointer(v any, p string) (any, bool) {
	for _, seg := range strings.Split(p, "/") {
		if seg == "" {
			continue
		}
		var ok bool
		if v, ok = step(v, unescape(seg)); !ok {
			return nil, false
		}
	}
	return v, true
}

// strictPointer is RFC 6901.
func strictPointer(v any, p string) (any, bool) {
	if p == "" {
		return v, true
	}
	if !strings.HasPrefix(p, "/") {
		return nil, false
	}
	for _, seg := range strings.Split(p[1:], "/") {
		var ok bool
		if v, ok = step(v, unescape(seg)); !ok {
			return nil, false
		}
	}
	return v, true
}

func step(v any, seg string) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		r, ok := x[seg]
		return r, ok
	case []any:
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(x) {
			return nil, false
		}
		return x[i], true
	}
	return nil, false
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "c-" + hex.EncodeToString(b[:])
}

// ErrClosed is returned by Next/WaitFor once the connection is gone and every
// recorded frame was consumed.
var ErrClosed = errors.New("lapdtest: connection closed")
