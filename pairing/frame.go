package pairing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/jsonscan"
)

// inFrame is the envelope of every tab→server frame. Payload fields that are
// only forwarded (result, stateAfter, entry, schemas) stay raw: they are
// validated once by the scanner, never decoded, and alias the read buffer
// until copied.
type inFrame struct {
	T string

	// rpc-reply / rpc-error / state-update
	ID         string
	Result     json.RawMessage
	Code       string
	Detail     json.RawMessage
	StateAfter json.RawMessage

	// log-append
	Entry json.RawMessage

	// visibility, hello
	Visible *bool

	// confirm-resolved
	ConfirmID string
	Outcome   string

	// hello
	AppName           string
	AppVersion        string
	MsgSchema         json.RawMessage
	StateSchema       json.RawMessage
	AffordancesSample json.RawMessage
	Docs              json.RawMessage
	SchemaHash        string
	LapVersion        *float64
	Policy            json.RawMessage
}

var (
	errMalformed = errors.New("pairing: malformed frame")
	errUnknownT  = errors.New("pairing: unknown frame type")
)

// decodeFrame decodes and checks one inbound frame: errMalformed when it is
// not a JSON object with the fields its t requires, errUnknownT for an
// unknown t. Keys match exactly (as lapd.js writes them); a field of the
// wrong type is malformed, null reads as absent. The frame is scanned once
// (internal/jsonscan): a 10 KiB rpc-reply costs a tenth of what
// encoding/json's two passes did.
func decodeFrame(b []byte) (inFrame, error) {
	var f inFrame
	bad := false
	str := func(dst *string, v []byte) {
		if string(v) == "null" {
			return
		}
		s, ok := jsonscan.String(v)
		if !ok {
			bad = true
		}
		*dst = s
	}
	raw := func(dst *json.RawMessage, v []byte) { *dst = v }
	ok := jsonscan.Object(b, func(k, v []byte) {
		switch string(k) {
		case "t":
			str(&f.T, v)
		case "id":
			str(&f.ID, v)
		case "result":
			raw(&f.Result, v)
		case "code":
			str(&f.Code, v)
		case "detail":
			raw(&f.Detail, v)
		case "stateAfter":
			raw(&f.StateAfter, v)
		case "entry":
			raw(&f.Entry, v)
		case "visible":
			if string(v) == "null" {
				f.Visible = nil
				return
			}
			x, ok := jsonscan.Bool(v)
			if !ok {
				bad = true
			}
			f.Visible = &x
		case "confirmId":
			str(&f.ConfirmID, v)
		case "outcome":
			str(&f.Outcome, v)
		case "appName":
			str(&f.AppName, v)
		case "appVersion":
			str(&f.AppVersion, v)
		case "msgSchema":
			raw(&f.MsgSchema, v)
		case "stateSchema":
			raw(&f.StateSchema, v)
		case "affordancesSample":
			raw(&f.AffordancesSample, v)
		case "docs":
			raw(&f.Docs, v)
		case "schemaHash":
			str(&f.SchemaHash, v)
		case "lapVersion":
			if string(v) == "null" {
				f.LapVersion = nil
				return
			}
			x, ok := jsonscan.Float(v)
			if !ok {
				bad = true
			}
			f.LapVersion = &x
		case "policy":
			raw(&f.Policy, v)
		}
	})
	if !ok || bad {
		return inFrame{}, errMalformed
	}
	switch f.T {
	case "hello", "ping":
	case "rpc-reply":
		if f.ID == "" {
			return f, errMalformed
		}
	case "rpc-error":
		if f.ID == "" || f.Code == "" {
			return f, errMalformed
		}
	case "state-update":
		if f.ID == "" {
			return f, errMalformed
		}
	case "log-append":
		if !isObject(f.Entry) {
			return f, errMalformed
		}
	case "confirm-resolved":
		if f.ConfirmID == "" || (f.Outcome != "confirmed" && f.Outcome != "user-cancelled") {
			return f, errMalformed
		}
	case "visibility":
		if f.Visible == nil {
			return f, errMalformed
		}
	case "":
		return f, errMalformed
	default:
		return f, errUnknownT
	}
	return f, nil
}

// clone copies raw bytes out of the read buffer (nil stays nil).
func clone(b json.RawMessage) json.RawMessage {
	if b == nil {
		return nil
	}
	return append(json.RawMessage(nil), b...)
}

func isObject(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{'
}

// detailString turns rpc-error's detail into text (a string as is, anything
// else as its JSON).
func detailString(d json.RawMessage) string {
	if len(d) == 0 || string(d) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(d, &s) == nil {
		return s
	}
	return string(d)
}

// entryID reads a log entry's id (a string) without decoding the rest.
func entryID(e json.RawMessage) string {
	var id string
	jsonscan.Object(e, func(k, v []byte) {
		if string(k) == "id" {
			id, _ = jsonscan.String(v)
		}
	})
	return id
}

// entryKind reads a log entry's kind without decoding the rest.
func entryKind(e json.RawMessage) string {
	var k struct {
		Kind string `json:"kind"`
	}
	_ = json.Unmarshal(e, &k)
	return k.Kind
}

// solicited reports whether f answers a request of the server's own: an
// rpc-reply or rpc-error for a call in flight, a state-update for a watch,
// a log-append whose entry id the server expects back (logID). Those are
// not counted in the socket's inbound rates: the server paced them (its
// calls are bounded by the LAP rate limit and MaxInFlight), and lapd.js
// sends two of them per call, so a per-socket rate would cap how fast one
// tab can be called far below what the LAP rate allows.
func (s *session) solicited(f *inFrame, logID string) bool {
	switch f.T {
	case "rpc-reply", "rpc-error", "state-update", "log-append":
	default:
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch f.T {
	case "state-update":
		_, ok := s.watches[f.ID]
		return ok
	case "log-append":
		return logID != "" && slices.Contains(s.expect, logID)
	}
	_, ok := s.calls[f.ID]
	return ok
}

// handoffSize is the rpc-reply result size from which the result is handed
// to its caller in the read buffer instead of copied out of it.
const handoffSize = 4 << 10

// handle processes one inbound frame on the reader goroutine. b is only valid
// during the call (pooled): everything kept is copied (clone).
//
// It reports whether it kept buf: a large rpc-reply result is handed to its
// caller inside buf (Reply), which gives it back.
func (c *conn) handle(buf *bytes.Buffer) (kept bool) {
	r, s := c.r, c.s
	f, err := decodeFrame(buf.Bytes())
	var logID string
	if err == nil && f.T == "log-append" {
		logID = entryID(f.Entry)
	}
	if err != nil || !s.solicited(&f, logID) {
		c.in.wait(r, buf.Len())
	}
	switch {
	case errors.Is(err, errUnknownT):
		r.unknown.Add(1)
		return
	case err != nil:
		r.malformed.Add(1)
		return
	}
	hooks := r.hooks.Load()
	switch f.T {
	case "rpc-reply":
		res := callResult{data: f.Result}
		switch {
		case len(f.Result) == 0:
			res.data = json.RawMessage("null")
		case len(f.Result) >= handoffSize:
			res.buf = buf // the caller reads it in place and gives buf back
		default:
			res.data = clone(f.Result)
		}
		if !s.retire(&s.calls, f.ID, res) {
			r.unknownReplies.Add(1)
			return false
		}
		return res.buf != nil
	case "rpc-error":
		if !s.retire(&s.calls, f.ID, callResult{err: &RPCError{Code: f.Code, Detail: detailString(f.Detail)}}) {
			r.unknownReplies.Add(1)
		}
	case "state-update":
		st := clone(f.StateAfter)
		if len(st) == 0 {
			st = json.RawMessage("null")
		}
		if !s.retire(&s.watches, f.ID, callResult{data: st}) {
			r.unknownReplies.Add(1)
		}
	case "log-append":
		f.Entry = clone(f.Entry)
		id := logID
		s.mu.Lock()
		if len(f.Entry) <= MaxLogEntry && !s.dropped {
			delta, dropped := s.appendLogLocked(f.Entry, r.cfg.LogRing, r.cfg.LogRingBytes)
			r.bufBytes.Add(int64(delta))
			_ = dropped // the ring's own bound, not a shed
		}
		echo := s.takeExpectedLocked(id)
		s.mu.Unlock()
		if r.overBudget() {
			r.shed()
		}
		if hooks.OnLogAppend != nil {
			hooks.OnLogAppend(s.tid, f.Entry, echo)
		}
	case "confirm-resolved":
		if c.noApprove {
			// This socket took over a live tab without the tab secret
			// (whoever holds the agent token can open one): its
			// approvals are not the human's.
			r.refusedApprovals.Add(1)
			// Within the tab's budget and one shared by all tabs (as
			// unsolicited log-appends): many tabs cannot flood the audit.
			r.cfg.Audit.RecordPooled(context.Background(), "tab:"+s.tid, "refused-approval", audit.Entry{TID: s.tid, Event: audit.EventRefused,
				Detail: map[string]any{"endpoint": wsEndpoint, "code": "approval-refused", "confirmId": f.ConfirmID,
					"detail": "confirm-resolved from a socket that superseded a live tab without the tab secret"}})
			return
		}
		if hooks.OnConfirmResolved != nil {
			hooks.OnConfirmResolved(s.tid, ConfirmResolved{ConfirmID: f.ConfirmID, Outcome: f.Outcome, StateAfter: clone(f.StateAfter)})
		}
	case "visibility":
		v := *f.Visible
		s.mu.Lock()
		s.visible = &v
		s.mu.Unlock()
	case "ping":
		c.heartbeat(true)
		_ = c.enqueue([]byte(`{"t":"pong","at":` + strconv.FormatInt(time.Now().UnixMilli(), 10) + `}`))
	case "hello":
		c.hello(f)
	}
	return false
}

// hello caches the tab's hello, answers hello-ack and, the first time on this
// socket, calls OnPaired (before hello-ack is written).
func (c *conn) hello(f inFrame) {
	r, s := c.r, c.s
	ack := `{"t":"hello-ack","lapVersion":` + strconv.Itoa(LapVersion) + `,"minClientVersion":` + strconv.Itoa(MinClientVersion) +
		`,"heartbeatMs":` + strconv.FormatInt(r.cfg.PingInterval.Milliseconds(), 10) + `}`
	if f.LapVersion != nil && *f.LapVersion < MinClientVersion {
		// As the reference: the hello is answered (hello-ack names the
		// minimum client version), then the pairing ends.
		_ = c.enqueue([]byte(ack))
		r.drop(s.tid, CloseVersionSkew, "lap version too old", "version-skew")
		return
	}
	// The fields still alias the read buffer: intern copies them only
	// when no tab sent this hello before.
	h := &Hello{AppName: f.AppName, AppVersion: f.AppVersion, MsgSchema: f.MsgSchema, StateSchema: f.StateSchema,
		AffordancesSample: f.AffordancesSample, Docs: f.Docs, SchemaHash: f.SchemaHash, Policy: f.Policy}
	if f.LapVersion != nil {
		h.LapVersion = int(*f.LapVersion)
	}
	if size := helloSize(h); size > r.cfg.MaxHello {
		r.hellosTooBig.Add(1)
		r.cfg.Logger.Warn("pairing: a tab's hello is over MaxHello; closing it with 1009", "tid", s.tid,
			"hello_bytes", size, "max_hello", r.cfg.MaxHello)
		c.close(int(websocket.StatusMessageTooBig), "hello too big")
		return
	}
	h = r.hellos.intern(h)
	s.mu.Lock()
	mine := s.cur == c && !s.dropped
	if mine {
		r.bufBytes.Add(int64(helloSize(h) - helloSize(s.hello)))
		s.hello = h
		s.helloGen++
		if f.Visible != nil {
			v := *f.Visible
			s.visible = &v
		}
	}
	s.mu.Unlock()
	if mine && r.overBudget() && !r.shed() && !r.shedHellos(s, helloSize(h)) {
		// Even without closed tabs' buffers, log rings and the live
		// hellos larger than this one, the live tabs' hellos do not fit:
		// this one is refused, its tab retries later.
		s.mu.Lock()
		if s.hello == h {
			r.bufBytes.Add(-int64(helloSize(h)))
			s.hello = nil
		}
		s.mu.Unlock()
		r.overloadCloses.Add(1)
		r.cfg.Logger.Warn("pairing: a tab's hello does not fit the buffer budget; closing it with 1013", "tid", s.tid,
			"hello_bytes", helloSize(h), "kept_bytes", r.bufBytes.Load(), "budget", r.cfg.BufferBytes)
		c.close(CloseOverloaded, overloadedText)
		return
	}
	// hello-ack is written once OnPaired has returned: a tab that has it
	// is counted as paired everywhere (e.g. /healthz), and what OnPaired
	// pushes follows it.
	if c.send([]byte(ack), sendHold) != nil {
		return
	}
	c.mu.Lock()
	first := !c.acked
	c.acked = true
	c.mu.Unlock()
	if first {
		if hooks := r.hooks.Load(); hooks.OnPaired != nil {
			hooks.OnPaired(s.tid, c.repair)
		}
	}
	c.flush()
}

// rpcFrame builds {t:'rpc', id, tool, args} plus lapd's optional rid (the
// request id of the call that made it; "" = none); json.RawMessage args are
// inserted as is ({} when empty).
func rpcFrame(id, tool string, args any, rid string) ([]byte, error) {
	var a []byte
	switch v := args.(type) {
	case json.RawMessage:
		a = v
	case nil:
	default:
		var err error
		if a, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	if len(bytes.TrimSpace(a)) == 0 {
		a = []byte("{}")
	}
	b := make([]byte, 0, len(a)+len(tool)+len(rid)+64)
	b = append(b, `{"t":"rpc","id":"`...)
	b = append(b, id...)
	b = append(b, `","tool":`...)
	if plainString(tool) { // what json.Marshal would write, without its allocations
		b = append(b, '"')
		b = append(b, tool...)
		b = append(b, '"')
	} else {
		toolJSON, err := json.Marshal(tool)
		if err != nil {
			return nil, err
		}
		b = append(b, toolJSON...)
	}
	b = append(b, `,"args":`...)
	b = append(b, a...)
	if rid != "" && audit.ValidRequestID(rid) { // nothing to escape
		b = append(b, `,"rid":"`...)
		b = append(b, rid...)
		b = append(b, '"')
	}
	b = append(b, '}')
	return b, nil
}

// plainString reports whether json.Marshal writes s as itself in quotes
// (printable ASCII, nothing it escapes).
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// marshalFrame turns a Push argument into bytes.
func marshalFrame(frame any) ([]byte, error) {
	switch v := frame.(type) {
	case json.RawMessage:
		return v, nil
	case []byte:
		return v, nil
	}
	return json.Marshal(frame)
}
