package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/lapd-dev/lapd/internal/storeerr"
	"github.com/lapd-dev/lapd/lap"
)

// Budgets bound how long one tool call may take, retries included
// (reference §2e). Zero values mean the defaults.
type Budgets struct {
	Read           time.Duration // reads, narrate, connect: 20 s
	Slack          time.Duration // added to timeoutMs for /message, /wait, /confirm-result: 2 s
	MessageTimeout time.Duration // send_message timeoutMs default: 5 s
	WaitTimeout    time.Duration // wait_for_change timeoutMs default: 10 s
	ConfirmTimeout time.Duration // get_confirm_result timeoutMs default: 20 s
	// ApprovalTimeout is send_message's approvalTimeoutMs default: how long
	// a dispatch that needs the user's approval waits for it: 20 s.
	ApprovalTimeout time.Duration
}

func (b *Budgets) defaults() {
	if b.Read <= 0 {
		b.Read = 20 * time.Second
	}
	if b.Slack <= 0 {
		b.Slack = 2 * time.Second
	}
	if b.MessageTimeout <= 0 {
		b.MessageTimeout = 5 * time.Second
	}
	if b.WaitTimeout <= 0 {
		b.WaitTimeout = 10 * time.Second
	}
	if b.ConfirmTimeout <= 0 {
		b.ConfirmTimeout = 20 * time.Second
	}
	if b.ApprovalTimeout <= 0 {
		b.ApprovalTimeout = 20 * time.Second
	}
}

// Config configures an Executor (and NewServer). Zero values mean defaults.
type Config struct {
	Client   lap.Client     // required: the only way to lapd
	Mode     Mode           // ModeBridge (stdio, default) or ModeEndpoint (/agent/mcp)
	Tools    ToolSet        // ToolsCore (default) or ToolsAll
	Budgets  Budgets        // per-call time budgets
	Bindings BindingsConfig // bounds of the session table
	Logger   *slog.Logger   // nil = discard; tokens are never logged

	// MaxRetries bounds the retries of one call on 503 paused (reconnect
	// pending) and 429; default 8. Each retry must also fit the budget.
	MaxRetries int
	// ProgressInterval is the progress ticker period; default 1 s.
	ProgressInterval time.Duration
	// After is the clock for retry waits; default time.After. Tests inject
	// one that fires at once.
	After func(time.Duration) <-chan time.Time

	// OnBind, if set, is called after a successful connect_session with the
	// caller scope and the token key (a hash, never the token). The HTTP
	// handler uses it to mark an MCP session authenticated and apply the
	// per-token session cap.
	OnBind func(scope, tokenKey string)

	// DefaultURL is the LAP base URL the bridge uses when connect_session
	// gets a token but no URL (lapd mcp --url); ignored by the endpoint.
	DefaultURL string

	Observer Observer // told about every tool call (metrics); nil = none

	Name    string // server name; default "lapd"
	Version string // server version; default "dev"
}

// Executor runs the tool catalogue over a lap.Client.
type Executor struct {
	cfg      Config
	client   lap.Client
	bindings *Bindings
	log      *slog.Logger
	defs     []toolDef       // every tool: all answer when called by name
	listed   map[string]bool // the ones tools/list names (cfg.Tools)

	// notified, if set, is told the MCP session a notification is about to
	// be sent to (the /agent/mcp fast path leaves such sessions to mcp-go).
	notified func(sessionID string)
}

// NewExecutor validates cfg and returns an Executor with an empty session table.
func NewExecutor(cfg Config) (*Executor, error) {
	if cfg.Client == nil {
		return nil, errors.New("mcp: Config.Client is required")
	}
	cfg.Budgets.defaults()
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 8
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = time.Second
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	if cfg.Name == "" {
		cfg.Name = "lapd"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all := catalogue(cfg.Mode)
	listed := map[string]bool{}
	for _, d := range selectTools(all, cfg.Tools) {
		listed[d.name] = true
	}
	return &Executor{cfg: cfg, client: cfg.Client, bindings: NewBindings(cfg.Bindings), log: log, defs: all, listed: listed}, nil
}

// Bindings exposes the session table (for the HTTP handler and tests).
func (e *Executor) Bindings() *Bindings { return e.bindings }

// Register adds the tools of cfg.Tools and the `connect` prompt to s.
func (e *Executor) Register(s *mcpserver.MCPServer) {
	tools := make([]mcpserver.ServerTool, 0, len(e.defs))
	for _, d := range e.defs {
		tools = append(tools, mcpserver.ServerTool{Tool: d.mcpTool(), Handler: e.toolHandler(d)})
	}
	s.AddTools(tools...)
	s.AddPrompt(connectPrompt(), connectPromptHandler)
}

// toolHandler is the handler of tool d: what mcp-go calls, and what the
// /agent/mcp fast path (fastpath.go) calls for the same request.
func (e *Executor) toolHandler(d toolDef) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		return e.observedCall(ctx, d, req), nil
	}
}

// scope names the caller for default-binding purposes.
func (e *Executor) scope(ctx context.Context) string {
	if e.cfg.Mode == ModeBridge {
		return "stdio"
	}
	if mcpserver.IsModernRequest(ctx) {
		return ""
	}
	if s := mcpserver.ClientSessionFromContext(ctx); s != nil {
		return s.SessionID()
	}
	return ""
}

// args is a tool call's arguments with typed, bounded accessors.
type args map[string]any

func (d toolDef) parseArgs(req mcpgo.CallToolRequest) (args, *toolError) {
	raw := req.GetArguments()
	if raw == nil {
		switch r := req.GetRawArguments().(type) {
		case nil, map[string]any:
		case json.RawMessage:
			if t := bytes.TrimSpace(r); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
				return nil, invalidArgs("arguments must be a JSON object")
			}
		default:
			return nil, invalidArgs("arguments must be a JSON object")
		}
		raw = map[string]any{}
	}
	// Normalise through JSON so in-process callers (Go ints, structs) and wire
	// callers (float64) look the same. Arguments decoded from the wire
	// already are (the common case: no second encode and decode).
	if !jsonNative(raw) {
		if b, err := json.Marshal(raw); err == nil {
			var norm map[string]any
			if json.Unmarshal(b, &norm) == nil && norm != nil {
				raw = norm
			}
		}
	}
	for _, k := range d.ignored {
		if _, ok := raw[k].(string); ok {
			raw = maps.Clone(raw)
			delete(raw, k)
		}
	}
	inputs := d.inputs()
	allowed := map[string]bool{}
	for _, p := range inputs {
		allowed[p.name] = true
	}
	var unknown []string
	for k := range raw {
		if !allowed[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		names := make([]string, 0, len(allowed))
		for k := range allowed {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, invalidArgs("unknown argument(s) %s; %s accepts %s", strings.Join(unknown, ", "), d.name, strings.Join(names, ", "))
	}
	for _, r := range d.required {
		if v, ok := raw[r]; !ok || v == nil {
			return nil, invalidArgs("%s is required", r)
		}
	}
	a := args(raw)
	for _, p := range inputs {
		v, ok := a[p.name]
		if !ok || v == nil {
			continue
		}
		if err := checkType(p, v); err != nil {
			return nil, err
		}
	}
	if d.name == "send_message" && a.has("msg") == a.has("msgs") {
		if a.has("msg") {
			return nil, invalidArgs("pass msg (one action) or msgs (several), not both")
		}
		return nil, invalidArgs("msg or msgs is required: pass msg (one action) or msgs (several), each {\"type\": \"<action>\", ...payload}")
	}
	// LAP refuses an empty narration with a bare "text required"; say it
	// here, with what to do.
	if d.name == "narrate" && strings.TrimSpace(a.str("text")) == "" {
		return nil, invalidArgs("text must not be empty: pass one short line for the user to read")
	}
	return a, nil
}

// jsonNative reports whether v holds only what encoding/json decodes into
// an any: maps of string to any, slices of any, strings, float64, bools and
// nil.
func jsonNative(v any) bool {
	switch v := v.(type) {
	case nil, string, float64, bool:
		return true
	case map[string]any:
		for _, x := range v {
			if !jsonNative(x) {
				return false
			}
		}
		return true
	case []any:
		for _, x := range v {
			if !jsonNative(x) {
				return false
			}
		}
		return true
	}
	return false
}

func checkType(p prop, v any) *toolError {
	switch p.schema["type"] {
	case "string":
		s, ok := v.(string)
		if !ok {
			return invalidArgs("%s must be a string", p.name)
		}
		if m, ok := p.schema["maxLength"].(int); ok && len(s) > m {
			return invalidArgs("%s is longer than %d characters", p.name, m)
		}
		if enum, ok := p.schema["enum"].([]string); ok {
			for _, e := range enum {
				if s == e {
					return nil
				}
			}
			return invalidArgs("%s must be one of %s", p.name, strings.Join(enum, ", "))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return invalidArgs("%s must be true or false", p.name)
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) {
			return invalidArgs("%s must be an integer", p.name)
		}
		if lo, ok := p.schema["minimum"].(int); ok && f < float64(lo) {
			return invalidArgs("%s must be at least %d", p.name, lo)
		}
		if hi, ok := p.schema["maximum"].(int); ok && f > float64(hi) {
			return invalidArgs("%s must be at most %d", p.name, hi)
		}
	case "object":
		if p.name == "msg" {
			return checkMsg("msg", v)
		}
		if _, ok := v.(map[string]any); !ok {
			return invalidArgs("%s must be an object", p.name)
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			return invalidArgs("%s must be an array", p.name)
		}
		if p.name == "msgs" {
			if len(l) == 0 || len(l) > MaxBatch {
				return invalidArgs("msgs takes 1 to %d actions", MaxBatch)
			}
			for i, m := range l {
				if err := checkMsg(fmt.Sprintf("msgs[%d]", i), m); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkMsg checks one action: an object with a non-empty string type.
func checkMsg(name string, v any) *toolError {
	m, ok := v.(map[string]any)
	if !ok {
		return invalidArgs("%s must be an object like {\"type\": \"<action>\", ...payload}", name)
	}
	t, ok := m["type"].(string)
	if !ok || t == "" || len(t) > 200 {
		return invalidArgs("%s.type must be the action name (a non-empty string); the actions are in connect_session's and observe's results", name)
	}
	return nil
}

func (a args) str(k string) string {
	s, _ := a[k].(string)
	return s
}

func (a args) has(k string) bool { v, ok := a[k]; return ok && v != nil }

func (a args) ms(k string, def time.Duration) time.Duration {
	if f, ok := a[k].(float64); ok {
		return time.Duration(f) * time.Millisecond
	}
	return def
}

func (a args) verbose() bool { v, _ := a["verbose"].(bool); return v }

// handle runs one tool call. It never returns a Go error: failures are
// isError results.
func (e *Executor) handle(ctx context.Context, d toolDef, req mcpgo.CallToolRequest) *mcpgo.CallToolResult {
	a, terr := d.parseArgs(req)
	if terr != nil {
		return terr.result()
	}
	p := startProgress(ctx, req, e.cfg.ProgressInterval, e.onNotify(ctx))
	defer p.Stop()
	var res *mcpgo.CallToolResult
	var err error
	switch d.name {
	case "connect_session":
		res, err = e.connect(ctx, a, p)
	case "disconnect_session":
		res, err = e.disconnect(ctx, a, p)
	default:
		var b Binding
		b, err = e.resolve(ctx, a, p)
		if err != nil {
			break
		}
		switch d.name {
		case "send_message":
			res, err = e.sendMessage(ctx, d, a, b, p)
		default:
			res, err = e.forward(ctx, d, a, b, p)
		}
	}
	if err != nil {
		return fromLAP(err, "").result()
	}
	return finish(ctx, res)
}

// onNotify is what a notification sent to the caller's MCP session must
// tell the HTTP endpoint (nil when nothing).
func (e *Executor) onNotify(ctx context.Context) func() {
	if e.notified == nil || mcpserver.IsModernRequest(ctx) {
		return nil
	}
	s := mcpserver.ClientSessionFromContext(ctx)
	if s == nil {
		return nil
	}
	sid := s.SessionID()
	return func() { e.notified(sid) }
}

func (e *Executor) resolve(ctx context.Context, a args, p *progress) (Binding, error) {
	handle := a.str("session")
	var b Binding
	var vis []BindingSummary
	err := e.retryBindings(ctx, p, func() (err error) {
		b, vis, err = e.bindings.Resolve(e.scope(ctx), handle)
		return err
	})
	if err != nil {
		return Binding{}, bindingError(err, handle, vis)
	}
	return b, nil
}

// retryBindings runs f, a Bindings call, again while the cluster's bindings
// store does not answer (ErrBindingsUnavailable), as attempts retries a LAP
// 503 unavailable: after storeerr.RetryAfterMs, at most MaxRetries times,
// within the Read budget.
func (e *Executor) retryBindings(ctx context.Context, p *progress, f func() error) error {
	wait := storeerr.RetryAfterMs * time.Millisecond
	deadline := time.Now().Add(e.cfg.Budgets.Read)
	for attempt := 0; ; attempt++ {
		err := f()
		if !errors.Is(err, ErrBindingsUnavailable) || attempt >= e.cfg.MaxRetries || time.Until(deadline) < wait {
			return err
		}
		e.log.Debug("mcp: retrying a session lookup", "err", err, "wait", wait, "attempt", attempt+1)
		p.Set(fmt.Sprintf("%s; retrying in %d s…", storeUnavailable, seconds(wait)))
		select {
		case <-ctx.Done():
			return err
		case <-e.cfg.After(wait):
		}
	}
}

func (e *Executor) budget(d toolDef, a args) time.Duration {
	b := e.cfg.Budgets
	switch d.budget {
	case budgetMessage:
		return max(a.ms("timeoutMs", b.MessageTimeout), a.ms("approvalTimeoutMs", b.ApprovalTimeout)) + b.Slack
	case budgetWait:
		return a.ms("timeoutMs", b.WaitTimeout) + b.Slack
	case budgetConfirm:
		return a.ms("timeoutMs", b.ConfirmTimeout) + b.Slack
	default:
		return b.Read
	}
}

// call POSTs to LAP within budget, retrying 503 paused (reconnect pending)
// and 429 after their Retry-After when the wait fits the remaining budget.
// body is sent unchanged on every attempt (so an idempotencyKey is reused).
func (e *Executor) call(ctx context.Context, b Binding, route string, body any, budget time.Duration, p *progress) (json.RawMessage, error) {
	return e.callRetryWithin(ctx, b, route, body, budget, budget, p)
}

// callRetryWithin is call whose retries must also end within retryWithin of
// the start: send_message's budget includes the time a human may take to
// approve, which is no reason to wait longer for a rate limit.
func (e *Executor) callRetryWithin(ctx context.Context, b Binding, route string, body any, budget, retryWithin time.Duration, p *progress) (json.RawMessage, error) {
	raw, _, err := e.attempts(ctx, b, route, body, budget, retryWithin, p, false)
	return raw, err
}

// callLent is call that lets a lap.Lender client lend the response body
// (lap.InProcessClient: /agent/mcp) instead of allocating it. A non-nil
// lease comes only with a success, and the caller releases it once nothing
// refers to raw any more: see observe, its one caller.
func (e *Executor) callLent(ctx context.Context, b Binding, route string, body any, budget time.Duration, p *progress) (json.RawMessage, lap.Lease, error) {
	return e.attempts(ctx, b, route, body, budget, budget, p, true)
}

// attempts is call and callLent: lend asks a lap.Lender client to lend the
// body of a success.
func (e *Executor) attempts(ctx context.Context, b Binding, route string, body any, budget, retryWithin time.Duration, p *progress, lend bool) (json.RawMessage, lap.Lease, error) {
	var lender lap.Lender
	if lend {
		lender, _ = e.client.(lap.Lender)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	deadline, _ := ctx.Deadline()
	for attempt := 0; ; attempt++ {
		var raw json.RawMessage
		var lease lap.Lease
		var err error
		if lender != nil {
			raw, lease, err = lender.CallLent(ctx, b.Base, b.Token, route, body)
		} else {
			raw, err = e.client.Call(ctx, b.Base, b.Token, route, body)
		}
		if err == nil {
			return raw, lease, nil
		}
		var le *lap.Error
		if !errors.As(err, &le) {
			le = &lap.Error{Code: CodeNetwork, Detail: err.Error()}
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				// The MCP client cancelled the call (notifications/cancelled,
				// or it went away): nothing is wrong with lapd or the network.
				return nil, nil, errCancelled
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && context.Cause(ctx) != nil {
				return nil, nil, &toolError{Code: CodeNetwork, Detail: fmt.Sprintf("timed out after %d ms", budget.Milliseconds()),
					Hint: "lapd did not answer within the call's budget; call observe to see whether it took effect, then retry (with the same idempotencyKey for send_message)."}
			}
			return nil, nil, le
		}
		wait, why, ok := retryable(le)
		if !ok || attempt >= e.cfg.MaxRetries || time.Until(deadline) < wait || time.Since(start)+wait > retryWithin {
			return nil, nil, le
		}
		e.log.Debug("mcp: retrying LAP call", "route", route, "code", le.Code, "wait", wait, "attempt", attempt+1)
		p.Set(fmt.Sprintf("%s; retrying in %d s…", why, seconds(wait)))
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, nil, errCancelled
			}
			return nil, nil, le
		case <-e.cfg.After(wait):
		}
	}
}

// pausedPoll is the longest wait between retries while the tab reconnects.
const pausedPoll = 2 * time.Second

// retryable reports whether lapd asked to come back later, and when.
func retryable(le *lap.Error) (time.Duration, string, bool) {
	switch {
	case le.Code == "paused" && (le.Reconnect == "pending" || le.Reconnect == ""):
		// Retry-After on a paused session is how long the grace window
		// still runs (up to a minute after a drop mid-call), not when the
		// tab will be back: a reload takes a second or two. Poll.
		w := min(le.RetryAfter, pausedPoll)
		if w <= 0 {
			w = time.Second
		}
		return w, "the app tab is reconnecting", true
	case le.Code == "rate-limited" && le.RetryAfter > 0:
		return le.RetryAfter, "rate limited by lapd", true
	case le.Code == lap.CodeUnavailable && le.RetryAfter > 0:
		return le.RetryAfter, storeUnavailable, true
	}
	return 0, "", false
}

// result is a success: structuredContent is b, and its text copy is the
// same bytes (added by finish, which handle calls on every result).
func result(b []byte) *mcpgo.CallToolResult {
	return &mcpgo.CallToolResult{StructuredContent: json.RawMessage(b)}
}

var errUnexpected = &toolError{Code: "internal", Hint: "lapd returned an unexpected response; call observe and retry once."}

// withFields writes raw's members (an object) into o, leaving out those in skip.
func withFields(o *objw, raw []byte, skip ...string) bool {
	ms, ok := members(raw)
	if !ok {
		return false
	}
	for _, m := range ms {
		if !slices.Contains(skip, m.key) {
			o.raw(m.key, m.val)
		}
	}
	return true
}

func (e *Executor) connect(ctx context.Context, a args, p *progress) (*mcpgo.CallToolResult, error) {
	base, token := "", ""
	if line := a.str("line"); line != "" {
		var err error
		base, token, err = ParseConnectLine(line)
		if err != nil && !a.has("token") {
			return nil, invalidArgs("%s; pass the whole line the user copied from the app's \"Connect an AI\" panel", err.Error())
		}
	}
	if a.has("url") {
		base = a.str("url")
	}
	if a.has("token") {
		token = a.str("token")
	}
	if e.cfg.Mode == ModeEndpoint {
		base = ""
	} else {
		if base == "" {
			base = e.cfg.DefaultURL
		}
		if base == "" {
			return nil, invalidArgs("no LAP URL given; pass the whole connect line as line, or url and token")
		}
		b, err := LAPBase(base)
		if err != nil {
			return nil, invalidArgs("%s", err.Error())
		}
		base = b
	}
	if !strings.HasPrefix(token, "agt_") {
		return nil, invalidArgs("no agt_… token given; pass the whole connect line the user copied from the app")
	}
	scope := e.scope(ctx)
	var b Binding
	if err := e.retryBindings(ctx, p, func() (err error) {
		b, err = e.bindings.Bind(scope, base, token)
		return err
	}); err != nil {
		return nil, bindingError(err, "", nil)
	}
	p.Set("connecting to the app…")
	raw, err := e.call(ctx, b, "/observe", nil, e.cfg.Budgets.Read, p)
	if err != nil {
		_, _ = e.bindings.Remove(b.Handle) // if the store does not answer, the handle nobody was given expires there
		return nil, err
	}
	ob, ok := parseObservation(raw, Binding{})
	if !ok {
		_, _ = e.bindings.Remove(b.Handle)
		return nil, errUnexpected
	}
	e.bindings.Update(b.Handle, func(b *Binding) {
		b.AppName, b.AppVersion, b.SchemaHash = ob.name, ob.version, ob.schemaHash
	})
	if e.cfg.OnBind != nil {
		e.cfg.OnBind(scope, b.TokenKey)
	}
	e.log.Info("mcp: session connected", "session", b.Handle, "app", ob.name, "token", b.TokenKey)
	o := newObj(make([]byte, 0, len(raw)+256))
	o.str("status", "connected")
	o.str("session", b.Handle)
	ob.writeApp(o)
	omitted := false
	if a.verbose() {
		withFields(o, raw)
	} else {
		omitted = e.renderObservation(o, ob, true)
	}
	e.remember(b.Handle, ob)
	next := "Pass session=\"" + b.Handle + "\" on every call; act with send_message (msgs for several steps); narrate first for multi-step work."
	if omitted {
		next += " stateOmitted parts: " + e.readHint() + "."
	}
	o.str("next", next)
	return result(o.close()), nil
}

// readHint says how to read left-out state with this tool set.
func (e *Executor) readHint() string {
	if e.cfg.Tools == ToolsAll {
		return "get_state with their path"
	}
	return "observe returns them"
}

func (e *Executor) disconnect(ctx context.Context, a args, p *progress) (*mcpgo.CallToolResult, error) {
	handle, removed := a.str("session"), false
	var vis []BindingSummary
	err := e.retryBindings(ctx, p, func() (err error) {
		var b Binding
		b, vis, err = e.bindings.Resolve(e.scope(ctx), handle)
		if err != nil {
			if removed && errors.Is(err, ErrUnknownSession) {
				return nil // the delete that timed out went through after all
			}
			return err
		}
		// Removed here at once; a retry (the cluster's store did not take
		// the delete) names the handle, so Resolve adopts it back from the
		// store and Remove deletes it there again.
		handle, removed = b.Handle, true
		_, err = e.bindings.Remove(b.Handle)
		return err
	})
	if err != nil {
		if !removed && (errors.Is(err, ErrUnbound) || errors.Is(err, ErrUnknownSession)) {
			r := map[string]any{"status": "not-connected"}
			if h := a.str("session"); h != "" {
				r["session"] = h
			}
			return structuredMap(r), nil
		}
		return nil, bindingError(err, handle, vis)
	}
	return structuredMap(map[string]any{"status": "disconnected", "session": handle}), nil
}

func structuredMap(v map[string]any) *mcpgo.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		return (&toolError{Code: "internal", Hint: "could not encode the result", Detail: err.Error()}).result()
	}
	return result(b)
}

// forward runs a tool that maps onto one LAP route.
func (e *Executor) forward(ctx context.Context, d toolDef, a args, b Binding, p *progress) (*mcpgo.CallToolResult, error) {
	body := map[string]any{}
	for _, pr := range d.props {
		if a.has(pr.name) && pr.name != "verbose" {
			body[pr.name] = a[pr.name]
		}
	}
	switch d.name {
	case "get_confirm_result":
		body["timeoutMs"] = a.ms("timeoutMs", e.cfg.Budgets.ConfirmTimeout).Milliseconds()
		p.Set("waiting for the user to approve or reject in the app…")
	case "wait_for_change":
		p.Set("waiting for a change in the app…")
	}
	var reqBody any = body
	if len(body) == 0 {
		reqBody = nil
	}
	if d.name == "observe" {
		return e.observe(ctx, d, a, b, reqBody, p)
	}
	raw, err := e.call(ctx, b, d.route, reqBody, e.budget(d, a), p)
	if err != nil {
		return nil, fromLAP(err, b.Base)
	}
	switch d.name {
	case "describe_app":
		if ms, ok := members(raw); ok {
			e.noteSchema(b, jstr(get(ms, "name")), jstr(get(ms, "schemaHash")))
		}
	case "list_actions":
		if a.verbose() {
			break
		}
		ms, ok := members(raw)
		if !ok {
			break
		}
		acts := get(ms, "actions")
		as, ok := leanActionList(acts, b.sigs)
		if !ok {
			break
		}
		e.rememberActions(b.Handle, acts, as)
		o := newObj(nil)
		o.key("actions")
		o.b = encodeActions(o.b, as)
		return result(o.close()), nil
	case "get_confirm_result":
		return e.confirmResult(b, raw, a.verbose())
	case "wait_for_change":
		if !a.verbose() {
			if lw := leanWait(raw, a.str("path")); lw != nil {
				raw = lw
			} else if wd := e.waitDiff(b, raw); wd != nil {
				raw = wd
			} else if c := compactObject(raw); c != nil {
				raw = c
			}
		}
	}
	return result(raw), nil // pass through untouched
}

// observe runs the observe tool. Its LAP body is only read here: the
// result is rendered into a buffer of its own (renderBuf), and what the
// binding keeps of it is copied (remember: bytes.Clone of the raw messages
// and actions, action entries encoded anew, strings; noteSchema: strings),
// so the body is lent (callLent) and given back on return. Keep it that
// way: a sub-slice of raw that outlives this call (in the result, an error,
// a log line, the binding) would read a buffer another call is writing.
// TestObserveLentBodyIsNotKept checks it.
func (e *Executor) observe(ctx context.Context, d toolDef, a args, b Binding, reqBody any, p *progress) (*mcpgo.CallToolResult, error) {
	raw, lease, err := e.callLent(ctx, b, d.route, reqBody, e.budget(d, a), p)
	if err != nil {
		return nil, fromLAP(err, b.Base)
	}
	if lease != nil {
		defer lease.Release()
	}
	ob, ok := parseObservation(raw, b)
	if !ok {
		return nil, errUnexpected
	}
	o := newObj(renderBuf(ctx, len(raw)+512))
	if a.verbose() {
		withFields(o, raw)
	} else {
		ob.writeApp(o)
		e.renderObservation(o, ob, false)
	}
	e.remember(b.Handle, ob)
	if e.noteSchema(b, ob.name, ob.schemaHash) {
		o.bool("schemaChanged", true)
		o.str("schemaChangedNote", "The app's actions or state schema changed since you last looked (the app was updated or navigated). Use the actions and docs in this result; earlier ones may be stale.")
	}
	return result(o.close()), nil
}

// noteSchema records the schema hash (and app name) and reports a change.
func (e *Executor) noteSchema(b Binding, name, hash string) bool {
	if hash == "" {
		return false
	}
	changed := false
	e.bindings.Update(b.Handle, func(bb *Binding) {
		changed = bb.SchemaHash != "" && bb.SchemaHash != hash
		bb.SchemaHash = hash
		if name != "" {
			bb.AppName = name
		}
	})
	return changed
}

func newIdempotencyKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "mcp_" + handleEncoding.EncodeToString(b[:])
}

// connectPrompt is the `connect` prompt: a slash command that turns the
// pasted line into a request to call connect_session.
func connectPrompt() mcpgo.Prompt {
	return mcpgo.NewPrompt("connect",
		mcpgo.WithPromptDescription("Connect to a live app: paste the line from the app's \"Connect an AI\" panel."),
		mcpgo.WithArgument("line", mcpgo.ArgumentDescription("The connect line copied from the app."), mcpgo.RequiredArgument()),
	)
}

func connectPromptHandler(_ context.Context, req mcpgo.GetPromptRequest) (*mcpgo.GetPromptResult, error) {
	line := req.Params.Arguments["line"]
	if strings.TrimSpace(line) == "" {
		return nil, errors.New("line is required: paste the line from the app's \"Connect an AI\" panel")
	}
	if len(line) > MaxConnectLine {
		return nil, errors.New("line is longer than 8 KiB")
	}
	var q bytes.Buffer
	q.WriteString("Please connect to my app: call the lapd connect_session tool with line set to exactly this text:\n\n")
	q.WriteString(line)
	q.WriteString("\n\nIts result is your first look at the app: tell me briefly what you see, and use narrate to tell me what you are doing before multi-step work.")
	return mcpgo.NewGetPromptResult("Connect to a live app", []mcpgo.PromptMessage{
		mcpgo.NewPromptMessage(mcpgo.RoleUser, mcpgo.NewTextContent(q.String())),
	}), nil
}
