package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/lapd-dev/lapd/internal/jsonscan"
	"github.com/lapd-dev/lapd/lap"
)

// The tools/call fast path of /agent/mcp.
//
// For every POST, mcp-go's Streamable HTTP server parses the body six times
// over (the envelope, the era, the _meta twice, the JSON-RPC base, the
// request), builds a throw-away session with buffered channels and a
// notification forwarder goroutine, stamps 2026-07-28 results through
// reflection, and encodes the response through a map. For a tool call that
// is most of what /agent/mcp spends beyond the LAP call itself. The fast
// path answers the one request that matters for speed, a tools/call, itself
// — and only when mcp-go would answer it with a plain JSON result:
//
//   - Content-Type application/json; a JSON object with exactly the members
//     jsonrpc ("2.0"), id (a string or a number), method ("tools/call") and
//     params, each once; params decoded as mcp-go's CallToolParams decodes
//     them (read from their parts when they have the usual shape, by
//     CallToolParams itself otherwise; FuzzParseToolCall compares), with
//     a tool lapd serves, no task, no multi-round-trip answers and no
//     progress token (progress is sent as SSE events: mcp-go's job);
//   - modern (2026-07-28): the checks mcp-go makes, with its exported
//     validators: no Last-Event-ID, MCP-Protocol-Version equal to the
//     _meta version and served, client capabilities present, Mcp-Method /
//     Mcp-Name (and any Mcp-Param-* the tool declares) matching the body;
//   - legacy: a supported or absent MCP-Protocol-Version, an Mcp-Session-Id
//     that the session table validates (the same Validate mcp-go calls) and
//     that mcp-go registered at initialize, no notification waiting for the
//     session and none ever sent to it (mcp-go answers such a session in SSE
//     from then on).
//
// Anything else — another method, a malformed or unusual request, a failed
// check — goes to mcp-go untouched, which answers it (errors included)
// exactly as before. The Host, Origin and body-size checks of ServeHTTP run
// first either way; session creation is never taken here; LAP's own gates,
// rate limits and audit run inside the tool call as always.
//
// The fast path calls the tool handler mcp-go has (Executor.toolHandler:
// request ids, metrics, the per-binding memory of shown actions, LAP's
// audit, all as on mcp-go's path) with the context mcp-go would give it
// (the session, the request's protocol information, the supported
// versions), behind the same two middlewares (panic recovery outside, the
// mcp.tool log line inside), registers the call for notifications/cancelled
// under mcp-go's key, logs mcp-go's mcp.request line, and writes the
// response as mcp-go writes it (Content-Type, status 200, the body in one
// Write, so net/http frames both alike). A result whose structuredContent
// the executor holds as bytes goes into a template of mcp-go's own encoding
// of that response (captured at start-up by running a probe tool through a
// second, identically configured mcp-go server); any other result and a
// recovered panic are encoded with mcp-go's types as mcp-go encodes them.
// If the probe finds an encoding it does not expect (a future mcp-go), the
// fast path stays off. HTTPConfig.DisableFastPath (lapd serve
// --mcp-fast-path=false) turns it off.
//
// How it is checked: TestFastPathMatchesMCPGo* send the same requests to an
// endpoint with the fast path and one without and compare the status, every
// header, the framing and the body byte for byte, then the LAP calls made
// (with their request ids), the metrics instruments' records, the log lines
// and the audit entries; FuzzParseToolCall checks the envelope parser
// against mcp-go's own decoding; TestFastPathMirrorsMCPGoUse fails when this
// package starts using a part of mcp-go the fast path does not mirror.
//
// Hooks and middlewares the fast path does not run: lapd installs none on
// its mcp-go server besides the recovery and logging middlewares (mirrored
// here) and the session register/unregister hooks the fast path itself
// uses, and configures no session idle TTL, event store, HTTP context
// function, CORS, schema validation or tracing. Adding one to NewServer or
// NewHTTPHandler needs the same here (the test above names it).
//
// The one difference a client could see is a race mcp-go itself has: while
// a legacy session's call with a progress token is sending progress, a
// concurrent call on the same session that the fast path had already taken
// answers in JSON and never carries that call's notifications, where
// mcp-go's own path might have delivered some of them on the concurrent
// call's response (as SSE) instead of the call they belong to. Every call
// the fast path takes after the first notification of a session goes to
// mcp-go, as mcp-go answers such a session in SSE from then on.

// fastPath answers tools/call requests of /agent/mcp without mcp-go's
// per-request machinery (see above).
type fastPath struct {
	srv   *mcpserver.MCPServer
	http  *mcpserver.StreamableHTTPServer
	table *sessionTable
	tools map[string]fastTool
	log   *slog.Logger // mcp-go's server logger: its mcp.request and mcp.tool lines
	tlog  *slog.Logger // mcp-go's transport logger

	sessions sync.Map // legacy session id → the mcpserver.ClientSession mcp-go registered
	notified sync.Map // legacy session ids a notification was sent to
	inflight sync.Map // mcp-go's in-flight key "<session id>:<request id>" → context.CancelFunc

	legacy, modern responseTemplate
	versions       []string             // the protocol versions the transport serves
	serverInfo     mcpgo.Implementation // what mcp-go stamps on modern results

	served atomic.Int64 // requests answered here (tests)
}

type fastTool struct {
	handler      mcpserver.ToolHandlerFunc
	tool         mcpgo.Tool
	paramHeaders bool            // the tool declares x-mcp-header parameters (none of lapd's do)
	nameParams   json.RawMessage // {"name":…}: what the standard-header check reads of params
}

// responseTemplate is mcp-go's encoding of a tools/call response whose
// result is a placeholder: head + id + mid + "content":… + tail.
type responseTemplate struct {
	head, mid, tail []byte
}

// fastResult carries a result's structuredContent bytes from finish to the
// fast path's writer.
type fastResult struct {
	res     mcpgo.CallToolResult // what finish returns in its place
	sc      []byte
	scratch *respBuf // renderBuf's pooled buffer (sc may alias it), released by run
}

type fastKey struct{}

func fastResultFrom(ctx context.Context) *fastResult {
	fr, _ := ctx.Value(fastKey{}).(*fastResult)
	return fr
}

// init sets the fast path up for the endpoint's server and transport and
// captures mcp-go's response encodings with a probe; an error says why the
// fast path stays off. cfg is the executor's configuration.
func (f *fastPath) init(cfg Config, e *Executor, srv *mcpserver.MCPServer, transport *mcpserver.StreamableHTTPServer, table *sessionTable) error {
	f.srv, f.http, f.table, f.log, f.tlog = srv, transport, table, mcpgoLogger(e.log), e.log
	f.versions = mcpserver.FilterSupportedVersions(transport)
	f.tools = map[string]fastTool{}
	for _, d := range e.defs {
		t := d.mcpTool()
		np, _ := json.Marshal(map[string]string{"name": d.name})
		f.tools[d.name] = fastTool{handler: e.toolHandler(d), tool: t, paramHeaders: len(mcpgo.ExtractParamHeaderBindings(&t)) > 0, nameParams: np}
	}
	return f.probe(cfg)
}

// hooks keeps the fast path's view of mcp-go's registered sessions.
func (f *fastPath) hooks(h *mcpserver.Hooks) {
	h.AddOnRegisterSession(func(_ context.Context, s mcpserver.ClientSession) {
		f.sessions.Store(s.SessionID(), s)
	})
	h.AddOnUnregisterSession(func(_ context.Context, s mcpserver.ClientSession) {
		f.sessions.CompareAndDelete(s.SessionID(), s)
	})
}

// forget drops what the fast path knows of a session that ended.
func (f *fastPath) forget(id string) {
	f.sessions.Delete(id)
	f.notified.Delete(id)
}

// noteNotified records that a notification was sent to a legacy session.
func (f *fastPath) noteNotified(id string) {
	if id != "" {
		f.notified.Store(id, true)
	}
}

const probeTool = "lapd_probe"

// probe runs a legacy and a modern tools/call of a tool returning the
// splice placeholder through a second mcp-go server configured as the real
// one, and keeps mcp-go's encoding of both responses around the id and the
// placeholder's content.
func (f *fastPath) probe(cfg Config) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	id := "lapd-probe-" + hex.EncodeToString(rnd[:])
	marker := splicePrefix + "probe"
	cfg.Client = noLAP{}
	cfg.Logger = nil
	cfg.OnBind = nil
	ps, _, err := NewServer(cfg)
	if err != nil {
		return err
	}
	ps.AddTool(mcpgo.NewTool(probeTool), func(context.Context, mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		return placeholder(marker), nil
	})
	pt := mcpserver.NewStreamableHTTPServer(ps, mcpserver.WithStateful(true), mcpserver.WithDisableLocalhostProtection(true),
		mcpserver.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler)))
	defer func() { _ = pt.Shutdown(context.Background()) }()
	post := func(body string, hdr map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		pt.ServeHTTP(w, r)
		return w
	}
	qid := strconv.Quote(id)

	// legacy: initialize, then the call on the session
	init := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+mcpgo.LATEST_LEGACY_PROTOCOL_VERSION+`","capabilities":{},"clientInfo":{"name":"lapd-probe","version":"1"}}}`,
		map[string]string{mcpgo.HeaderProtocolVersion: mcpgo.LATEST_LEGACY_PROTOCOL_VERSION})
	sid := init.Header().Get(mcpserver.HeaderKeySessionID)
	if init.Code != http.StatusOK || sid == "" {
		return fmt.Errorf("legacy probe: initialize answered %d", init.Code)
	}
	w := post(`{"jsonrpc":"2.0","id":`+qid+`,"method":"tools/call","params":{"name":"`+probeTool+`"}}`,
		map[string]string{mcpgo.HeaderProtocolVersion: mcpgo.LATEST_LEGACY_PROTOCOL_VERSION, mcpserver.HeaderKeySessionID: sid})
	if f.legacy, err = parseTemplate(w, qid, marker); err != nil {
		return fmt.Errorf("legacy probe: %w", err)
	}

	// modern: one request with its _meta and headers
	params := `{"name":"` + probeTool + `","_meta":{"` + mcpgo.MetaKeyProtocolVersion + `":"` + mcpgo.LATEST_PROTOCOL_VERSION + `","` + mcpgo.MetaKeyClientCapabilities + `":{}}}`
	hdr := map[string]string{mcpgo.HeaderProtocolVersion: mcpgo.LATEST_PROTOCOL_VERSION}
	for k, v := range mcpgo.StandardHeaders(mcpgo.LATEST_PROTOCOL_VERSION, mcpgo.MethodToolsCall, json.RawMessage(params)) {
		hdr[k] = v
	}
	w = post(`{"jsonrpc":"2.0","id":`+qid+`,"method":"tools/call","params":`+params+`}`, hdr)
	if f.modern, err = parseTemplate(w, qid, marker); err != nil {
		return fmt.Errorf("modern probe: %w", err)
	}
	var res struct {
		Result struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		return fmt.Errorf("modern probe: %w", err)
	}
	si := res.Result.Meta[mcpgo.MetaKeyServerInfo]
	if si == nil || json.Unmarshal(si, &f.serverInfo) != nil {
		return errors.New("modern probe: no serverInfo in the result's _meta")
	}
	return nil
}

// parseTemplate splits a probe response around its id and its placeholder
// content.
func parseTemplate(w *httptest.ResponseRecorder, qid, marker string) (responseTemplate, error) {
	body := w.Body.Bytes()
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
		return responseTemplate{}, fmt.Errorf("answered %d %s: %.200s", w.Code, w.Header().Get("Content-Type"), body)
	}
	ph := []byte(placeholderHead + strconv.Quote(marker) + placeholderTail)
	if bytes.Count(body, []byte(qid)) != 1 || bytes.Count(body, ph) != 1 {
		return responseTemplate{}, fmt.Errorf("unexpected encoding: %.300s", body)
	}
	i := bytes.Index(body, []byte(qid))
	rest := body[i+len(qid):]
	j := bytes.Index(rest, ph)
	if j < 0 {
		return responseTemplate{}, fmt.Errorf("the id comes after the content: %.300s", body)
	}
	return responseTemplate{
		head: bytes.Clone(body[:i]),
		mid:  bytes.Clone(rest[:j]),
		tail: bytes.Clone(rest[j+len(ph):]),
	}, nil
}

// appendSpliced appends the response with id and the result whose
// structuredContent (and text copy) is sc.
func (t *responseTemplate) appendSpliced(b, id, sc []byte) []byte {
	b = append(b, t.head...)
	b = append(b, id...)
	b = append(b, t.mid...)
	b = append(b, `"content":[{"type":"text","text":`...)
	b = appendJSONString(b, sc)
	b = append(b, `}],"structuredContent":`...)
	b = append(b, sc...)
	return append(b, t.tail...)
}

// noLAP is the probe server's lap.Client: the probe tool never calls it.
type noLAP struct{}

func (noLAP) Call(context.Context, string, string, string, any) (json.RawMessage, error) {
	return nil, &lap.Error{Code: "internal", Detail: "probe"}
}

// fastCall is one tools/call the fast path took.
type fastCall struct {
	id     any    // the JSON-RPC id as mcp-go decodes it
	idJSON []byte // and as mcp-go encodes it back
	sid    string // legacy MCP session id ("" for modern)
	tool   fastTool
	req    mcpgo.CallToolRequest
	info   *mcpserver.RequestProtocolInfo
	sess   mcpserver.ClientSession // legacy only
}

// serve answers r if it is a tools/call the fast path takes (see the top of
// this file) and reports whether it did; if not, nothing was written and r
// goes to mcp-go.
func (f *fastPath) serve(w http.ResponseWriter, r *http.Request, body []byte) bool {
	c, ok := f.accept(r, body)
	if !ok {
		return false
	}
	f.served.Add(1)
	f.run(w, r, c)
	return true
}

// jsonContentType is mcp-go's check of a POST's Content-Type.
func jsonContentType(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// parseToolCall reads a tools/call envelope the fast path takes: a JSON
// object with exactly the members jsonrpc ("2.0"), id (a string or a
// number), method ("tools/call") and params (an object that mcp-go's
// CallToolParams decodes, with no task and no multi-round-trip answers),
// each once and spelt exactly. It fills c.id and c.idJSON as mcp-go decodes
// and encodes the id, and c.req.Params as mcp-go decodes them, and returns
// the raw params. Anything else is false (mcp-go answers it).
// FuzzParseToolCall checks it against mcp-go's own decoding.
//
// The body is validated once, as it is split (jsonscan); the common shapes
// of an id and of params are then read from their parts, and anything
// unusual goes through encoding/json as mcp-go decodes it.
func parseToolCall(body []byte, c *fastCall) (params []byte, ok bool) {
	var jsonrpc, id, method []byte
	n, bad := 0, false
	if !jsonscan.Object(body, func(k, v []byte) {
		n++
		var slot *[]byte
		switch string(k) {
		case "jsonrpc":
			slot = &jsonrpc
		case "id":
			slot = &id
		case "method":
			slot = &method
		case "params":
			slot = &params
		default:
			bad = true
			return
		}
		if *slot != nil {
			bad = true // a member twice
		}
		*slot = v
	}) || bad || n != 4 {
		return nil, false
	}
	if string(jsonrpc) != `"2.0"` || string(method) != `"tools/call"` || len(params) == 0 || params[0] != '{' {
		return nil, false
	}
	if !parseID(id, c) {
		return nil, false
	}
	p := &c.req.Params
	if !parseParams(params, p) && json.Unmarshal(params, p) != nil {
		return nil, false
	}
	if p.Task != nil || p.InputResponses != nil || p.RequestState != "" {
		return nil, false
	}
	return params, true
}

// parseID reads a JSON-RPC id (valid JSON) as HandleMessage decodes it
// (into an any) and as its responses encode it (mcpgo.NewRequestId(id)):
// a plain integer of up to 15 digits is a float64 written back as it came,
// a string of printable ASCII with nothing encoding/json escapes is itself;
// anything else goes through encoding/json. null (a notification) and
// other kinds are false: mcp-go answers them.
func parseID(id []byte, c *fastCall) bool {
	if plainInt(id) {
		v, err := strconv.ParseInt(string(id), 10, 64)
		if err == nil {
			c.id, c.idJSON = float64(v), id
			return true
		}
	}
	if plainString(id) {
		c.id, c.idJSON = string(id[1:len(id)-1]), id
		return true
	}
	if json.Unmarshal(id, &c.id) != nil {
		return false
	}
	switch c.id.(type) {
	case string, float64:
	default:
		return false
	}
	var err error
	c.idJSON, err = json.Marshal(mcpgo.NewRequestId(c.id))
	return err == nil
}

// plainInt: 0 or -?[1-9][0-9]{0,14}, exact as a float64 and formatted
// back by encoding/json digit for digit (-0 is left to encoding/json: it
// decodes to a negative zero).
func plainInt(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
		if len(b) > 0 && b[0] == '0' {
			return false
		}
	}
	if len(b) == 0 || len(b) > 15 || (b[0] == '0' && len(b) > 1) {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// plainString: a quoted string of printable ASCII without the characters
// encoding/json escapes when it writes a string back (\, ", <, >, &).
func plainString(b []byte) bool {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return false
	}
	for _, c := range b[1 : len(b)-1] {
		if c < 0x20 || c >= 0x7f || c == '\\' || c == '"' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// parseParams decodes params (a valid JSON object) into p as
// CallToolParams.UnmarshalJSON does, when its members are only name (a
// string), arguments and _meta, each once and spelt exactly; false leaves
// p as it was, for encoding/json.
func parseParams(params []byte, p *mcpgo.CallToolParams) bool {
	var name, args, meta []byte
	bad := false
	jsonscan.Object(params, func(k, v []byte) {
		var slot *[]byte
		switch string(k) {
		case "name":
			slot = &name
		case "arguments":
			slot = &args
		case "_meta":
			slot = &meta
		default:
			bad = true
			return
		}
		if *slot != nil {
			bad = true
		}
		*slot = v
	})
	if bad || len(name) == 0 || name[0] != '"' {
		return false
	}
	nm, ok := jsonscan.String(name)
	if !ok {
		return false
	}
	var q mcpgo.CallToolParams
	q.Name = nm
	if meta != nil && string(meta) != "null" {
		// (*mcpgo.Meta).UnmarshalJSON: the object as a map, its
		// progressToken taken out
		raw, ok := decodeAny(meta)
		m, isObj := raw.(map[string]any)
		if !ok || !isObj {
			return false
		}
		q.Meta = &mcpgo.Meta{ProgressToken: m["progressToken"], AdditionalFields: m}
		delete(m, "progressToken")
	}
	if args != nil {
		q.RawArguments = append(json.RawMessage(nil), args...)
		var ok bool
		if q.Arguments, ok = decodeAny(args); !ok {
			return false
		}
	}
	*p = q
	return true
}

// decodeAny decodes v (valid JSON) as encoding/json decodes it into an
// any: objects into map[string]any (the last of a repeated key wins),
// strings as they read (invalid UTF-8 as U+FFFD), numbers as float64;
// arrays go through encoding/json itself.
func decodeAny(v []byte) (any, bool) {
	if len(v) == 0 {
		return nil, false
	}
	switch c := v[0]; {
	case c == '{':
		m := map[string]any{}
		ok := true
		jsonscan.Object(v, func(k, x []byte) {
			val, vok := decodeAny(x)
			ok = ok && vok
			m[string(k)] = val
		})
		return m, ok
	case c == '"':
		return jsonscan.String(v)
	case c == 't' || c == 'f':
		return jsonscan.Bool(v)
	case c == 'n':
		return nil, string(v) == "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return jsonscan.Float(v)
	}
	var x any
	return x, json.Unmarshal(v, &x) == nil
}

// accept decides whether the fast path takes r; it writes nothing.
func (f *fastPath) accept(r *http.Request, body []byte) (fastCall, bool) {
	var c fastCall
	if !jsonContentType(r.Header.Get("Content-Type")) {
		return c, false
	}
	params, ok := parseToolCall(body, &c)
	if !ok {
		return c, false
	}
	p := &c.req.Params
	if c.tool, ok = f.tools[p.Name]; !ok {
		return c, false
	}
	meta := p.Meta
	if meta != nil && meta.ProgressToken != nil {
		return c, false
	}
	hv := r.Header.Get(mcpgo.HeaderProtocolVersion)
	mv := meta.ProtocolVersion()
	if mcpgo.IsModernProtocol(mv) || mcpgo.IsModernProtocol(hv) {
		if r.Header.Get(mcpgo.HeaderLastEventID) != "" || hv == "" || mv == "" || hv != mv ||
			!f.http.SupportsProtocolVersion(mv) || !mcpgo.IsValidProtocolVersion(mv) {
			return c, false
		}
		caps := meta.ClientCapabilities()
		if caps == nil {
			return c, false
		}
		// mcp-go reads the name in params as CallToolParams did: the
		// tool's (FuzzParseToolCall checks it), so the check reads that.
		if mcpgo.ValidateStandardHeaders(r.Header.Get, mv, mcpgo.MethodToolsCall, c.tool.nameParams) != nil {
			return c, false
		}
		if c.tool.paramHeaders && mcpgo.ValidateParamHeadersLookup(headerLookup(r.Header), &c.tool.tool, params) != nil {
			return c, false
		}
		c.info = &mcpserver.RequestProtocolInfo{Modern: true, ProtocolVersion: mv, ClientInfo: meta.ClientInfo(), ClientCapabilities: caps, LogLevel: meta.LogLevel()}
	} else {
		if hv != "" && !mcpgo.IsValidProtocolVersion(hv) {
			return c, false
		}
		c.sid = r.Header.Get(mcpserver.HeaderKeySessionID)
		if c.sid == "" {
			return c, false
		}
		if _, n := f.notified.Load(c.sid); n {
			return c, false
		}
		s, ok := f.sessions.Load(c.sid)
		if !ok {
			return c, false
		}
		c.sess = s.(mcpserver.ClientSession)
		if len(c.sess.NotificationChannel()) > 0 {
			return c, false
		}
		if terminated, err := f.table.ResolveSessionIdManager(r).Validate(c.sid); err != nil || terminated {
			return c, false
		}
		c.info = &mcpserver.RequestProtocolInfo{ProtocolVersion: mv}
	}
	c.req.Method = string(mcpgo.MethodToolsCall)
	c.req.Header = r.Header
	return c, true
}

func headerLookup(h http.Header) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v := h.Values(name)
		if len(v) == 0 {
			return "", false
		}
		return v[0], true
	}
}

// run calls the tool and writes the response.
func (f *fastPath) run(w http.ResponseWriter, r *http.Request, c fastCall) {
	start := time.Now()
	ctx := mcpserver.WithRequestProtocolInfo(r.Context(), c.info)
	if c.sess != nil {
		ctx = f.srv.WithContext(ctx, c.sess)
	}
	ctx = mcpserver.WithSupportedProtocolVersions(ctx, f.versions)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// notifications/cancelled finds the call under mcp-go's key.
	key := fmt.Sprintf("%s:%v", c.sid, c.id)
	f.inflight.Store(key, cancel)
	defer f.inflight.Delete(key)
	fr := &fastResult{}
	ctx = context.WithValue(ctx, fastKey{}, fr)
	defer func() {
		if fr.scratch != nil {
			putRespBuf(fr.scratch)
		}
	}()

	res, err := f.call(ctx, c)

	tmpl := &f.legacy
	if c.info.Modern {
		tmpl = &f.modern
	}
	buf := getRespBuf()
	defer putRespBuf(buf)
	var msg mcpgo.JSONRPCMessage
	switch {
	case err != nil:
		msg = mcpgo.JSONRPCError{JSONRPC: mcpgo.JSONRPC_VERSION, ID: mcpgo.NewRequestId(c.id), Error: mcpgo.NewJSONRPCErrorDetails(mcpgo.INTERNAL_ERROR, err.Error(), nil)}
	case res == nil:
		err = fmt.Errorf("tool '%s' handler returned no result", c.req.Params.Name)
		msg = mcpgo.JSONRPCError{JSONRPC: mcpgo.JSONRPC_VERSION, ID: mcpgo.NewRequestId(c.id), Error: mcpgo.NewJSONRPCErrorDetails(mcpgo.INTERNAL_ERROR, err.Error(), nil)}
	case res == &fr.res:
		buf.b = tmpl.appendSpliced(buf.b, c.idJSON, fr.sc)
	default:
		if c.info.Modern {
			// what mcp-go's decorateResponse does to a modern result
			if res.GetResultType() == "" {
				res.SetResultType(mcpgo.ResultTypeComplete)
			}
			if m := res.EnsureResultMeta(); m.ServerInfo() == nil {
				m.SetServerInfo(f.serverInfo)
			}
		}
		msg = mcpgo.NewJSONRPCResultResponse(mcpgo.NewRequestId(c.id), res)
	}
	// mcp-go logs the request when its handler returns, before writing.
	f.logRequest(ctx, c, start, err)
	if r.Context().Err() != nil {
		return // the client is gone; mcp-go writes nothing either
	}
	// As mcp-go writes a JSON response: Content-Type, the status (200, also
	// for INTERNAL_ERROR in the modern era), then the body in one Write
	// (net/http frames it as it frames mcp-go's: Content-Length when it is
	// small, chunked otherwise).
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if msg != nil {
		bb := bytes.NewBuffer(buf.b)
		if jerr := json.NewEncoder(bb).Encode(msg); jerr != nil {
			f.tlog.Error("Failed to write response", "err", jerr)
			return
		}
		buf.b = bb.Bytes()
	}
	_, _ = w.Write(buf.b)
}

// call runs the tool's handler behind mcp-go's two middlewares as lapd
// configures them: panic recovery (outside) and the mcp.tool log line.
func (f *fastPath) call(ctx context.Context, c fastCall) (res *mcpgo.CallToolResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("panic recovered in %s tool handler: %v", c.req.Params.Name, p)
		}
	}()
	start := time.Now()
	res, err = c.tool.handler(ctx, c.req)
	if f.log.Enabled(ctx, slog.LevelInfo) {
		attrs := []slog.Attr{slog.String("mcp.tool.name", c.req.Params.Name), slog.Float64("duration_s", time.Since(start).Seconds())}
		switch {
		case err != nil:
			attrs = append(attrs, slog.String("outcome", "error"), slog.String("error", err.Error()))
		case res != nil && res.IsError:
			attrs = append(attrs, slog.String("outcome", "error_result"))
		default:
			attrs = append(attrs, slog.String("outcome", "ok"))
		}
		f.log.LogAttrs(ctx, slog.LevelInfo, "mcp.tool", attrs...)
	}
	return res, err
}

// logRequest writes mcp-go's mcp.request line (lapd logs it at debug).
func (f *fastPath) logRequest(ctx context.Context, c fastCall, start time.Time, err error) {
	if !f.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := []slog.Attr{slog.String("mcp.method", string(mcpgo.MethodToolsCall))}
	if c.sid != "" {
		attrs = append(attrs, slog.String("mcp.session.id", c.sid))
	}
	if v := c.req.Header.Get(mcpgo.HeaderProtocolVersion); v != "" {
		attrs = append(attrs, slog.String("mcp.protocol.version", v))
	}
	attrs = append(attrs, slog.Float64("duration_s", time.Since(start).Seconds()))
	if err != nil {
		attrs = append(attrs, slog.String("outcome", "error"), slog.String("error", err.Error()))
	} else {
		attrs = append(attrs, slog.String("outcome", "ok"))
	}
	f.log.LogAttrs(ctx, slog.LevelInfo, "mcp.request", attrs...)
}

// cancelled applies a notifications/cancelled that mcp-go accepted to a
// call the fast path runs (mcp-go cancels its own).
func (f *fastPath) cancelled(r *http.Request, body []byte) {
	var n struct {
		Params struct {
			RequestID any         `json:"requestId"`
			Meta      *mcpgo.Meta `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &n) != nil || n.Params.RequestID == nil {
		return
	}
	sid := ""
	if !mcpgo.IsModernProtocol(n.Params.Meta.ProtocolVersion()) && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
		sid = r.Header.Get(mcpserver.HeaderKeySessionID)
	}
	if cancel, ok := f.inflight.LoadAndDelete(fmt.Sprintf("%s:%v", sid, n.Params.RequestID)); ok {
		cancel.(context.CancelFunc)()
	}
}

// isCancelledNotification reports whether body is a notifications/cancelled.
func isCancelledNotification(body []byte) bool {
	if !bytes.Contains(body, []byte(mcpgo.MethodNotificationCancelled)) {
		return false
	}
	ms, ok := members(body)
	return ok && jstr(get(ms, "method")) == string(mcpgo.MethodNotificationCancelled)
}

// statusRecorder remembers the status mcp-go wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// respBuf is a pooled response buffer.
type respBuf struct{ b []byte }

var respBufs = sync.Pool{New: func() any { return &respBuf{b: make([]byte, 0, 32<<10)} }}

func getRespBuf() *respBuf { return respBufs.Get().(*respBuf) }

func putRespBuf(b *respBuf) {
	if cap(b.b) > 1<<20 {
		return // keep the pool's memory bounded
	}
	b.b = b.b[:0]
	respBufs.Put(b)
}
