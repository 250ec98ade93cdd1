package mcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// Binding is one connected app session: where its LAP endpoint is and the
// bearer that opens it. The token lives only in memory and is never logged,
// audited or returned to the model.
type Binding struct {
	Handle     string    // "s_" + 16 base32 characters (80 random bits); doubles as a capability
	Scope      string    // who may use it without naming it: "stdio", an MCP session id, or "" (modern HTTP)
	Base       string    // LAP base URL (bridge mode); empty in endpoint mode
	Token      string    // the agt_ bearer; never logged
	TokenKey   string    // short SHA-256 prefix of Token, for per-token caps and logs
	AppName    string    // from the prefetched /observe
	AppVersion string    // from the prefetched /observe
	SchemaHash string    // last seen description.schemaHash
	CreatedAt  time.Time // bind time
	LastUsed   time.Time // last tool call that used it

	// What the model was last shown through this binding (lean.go): the
	// action list (shownSet false = never, or too large to remember), as LAP
	// sent it (shownRaw) and as rendered; and the payload signatures of the
	// app's messages, with the description.messages they came from. The
	// raw bytes let a call that gets the same list or messages skip the
	// rendering.
	shown    []leanAction
	shownRaw []byte
	shownSet bool
	sigs     map[string]string
	sigsRaw  []byte

	// The last whole state a result gave the model, and the patches shown
	// since (view.go); nil view = not known.
	view    []byte
	viewOps [][]byte
}

// BindingSummary is what the model may see about a binding (no token).
type BindingSummary struct {
	Session string `json:"session"`
	AppName string `json:"appName,omitempty"`
}

// BindingsConfig bounds a Bindings table. Zero values mean the documented defaults.
// The bounds are counts: one binding keeps at most its view (maxViewBytes +
// maxViewOpsBytes), the action list shown (maxShownBytes) and the messages'
// signatures (maxSigsBytes), and their renderings while each is at most
// maxRenderBytes (183 KiB together at worst: TestBindingWorstCase), so about
// 400 KiB a binding and 100 MiB for 256; a typical app's binding a few KiB.
type BindingsConfig struct {
	MaxBindings         int              // whole table; default 256
	MaxBindingsPerScope int              // per caller scope (an MCP session, the stdio bridge; modern HTTP clients have none); default 16
	MaxBindingsPerToken int              // per bearer; default 8
	IdleTTL             time.Duration    // a binding unused this long is dropped; default 30 min
	Now                 func() time.Time // clock; default time.Now
	// Shared, if set, makes handles work on every node of a cluster: a
	// handle this table does not hold is looked up there (a modern HTTP
	// client's next call may reach any node). nil = this process only.
	Shared SharedBindings
}

// SharedBindings keeps bindings where the other nodes of a cluster find
// them. The handle is the capability: an implementation must not make the
// token readable to whoever lacks the handle (lapd's encrypts it with a
// key derived from the handle). Calls may block on the network; they are
// never made with the table's lock held. An error that says the store did
// not answer (a NATS timeout, no responders, a connection down: see
// internal/storeerr) makes the Bindings call fail with
// ErrBindingsUnavailable, which the executor retries after 2 s and
// otherwise reports as "unavailable, retry in 2 s"; other errors are
// treated as before (Put: the handle works on this node only; Get: the
// handle is unknown; Delete: ignored).
type SharedBindings interface {
	Put(ctx context.Context, handle, base, token string) error
	Get(ctx context.Context, handle string) (base, token string, ok bool, err error)
	Delete(ctx context.Context, handle string) error
}

// sharedTimeout bounds a SharedBindings call.
const sharedTimeout = 5 * time.Second

// Errors returned by Bindings lookups. The executor turns them into
// model-facing messages (errors.go).
var (
	ErrUnbound         = errors.New("mcp: no app session is connected")
	ErrAmbiguous       = errors.New("mcp: several app sessions are connected; pass session")
	ErrUnknownSession  = errors.New("mcp: unknown or expired session handle")
	ErrSessionRequired = errors.New("mcp: this client has no MCP session; pass session")
	// ErrBindingsUnavailable: the cluster's bindings store (Shared) did
	// not answer; the same call may succeed in a few seconds. The store's
	// error is wrapped with it.
	ErrBindingsUnavailable = errors.New("mcp: the cluster's session store did not answer")
)

// Bindings is the table of connected app sessions, keyed by handle. It is
// safe for concurrent use. It starts no goroutines: expiry is applied lazily
// on every access.
type Bindings struct {
	cfg BindingsConfig

	mu sync.Mutex
	m  map[string]*Binding
}

// NewBindings returns an empty table with cfg's bounds.
func NewBindings(cfg BindingsConfig) *Bindings {
	if cfg.MaxBindings <= 0 {
		cfg.MaxBindings = 256
	}
	if cfg.MaxBindingsPerScope <= 0 {
		cfg.MaxBindingsPerScope = 16
	}
	if cfg.MaxBindingsPerToken <= 0 {
		cfg.MaxBindingsPerToken = 8
	}
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = 30 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Bindings{cfg: cfg, m: make(map[string]*Binding)}
}

var handleEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newHandle returns "s_" + 16 base32 characters (80 random bits).
func newHandle() string {
	var b [10]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "s_" + handleEncoding.EncodeToString(b[:])
}

// tokenKey is a short, non-reversible name for a token (for caps and logs).
func tokenKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}

// Bind stores a binding for scope and returns a copy of it. If scope already
// has a binding for the same base and token, that one is refreshed and its
// handle kept (connect_session is idempotent). Bounds are enforced by evicting
// the least recently used binding of the same token, then of the same scope,
// then of the whole table. With Shared set, a new binding is stored there
// too; if the store does not answer, the binding is dropped again and Bind
// returns ErrBindingsUnavailable (a handle that works on this node only
// would fail on the next call that reaches another one).
func (t *Bindings) Bind(scope, base, token string) (Binding, error) {
	b, fresh := t.bind(scope, base, token)
	if fresh && t.cfg.Shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		err := t.cfg.Shared.Put(ctx, b.Handle, b.Base, b.Token)
		cancel()
		if storeerr.Unavailable(err) {
			t.mu.Lock()
			delete(t.m, b.Handle)
			t.mu.Unlock()
			return Binding{}, fmt.Errorf("%w: %w", ErrBindingsUnavailable, err)
		}
		// Another error: without it the handle works on this node only.
	}
	return b, nil
}

func (t *Bindings) bind(scope, base, token string) (Binding, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.sweepLocked(now)
	key := tokenKey(token)
	for _, b := range t.m {
		if b.Scope == scope && b.Base == base && b.TokenKey == key && b.Token == token {
			b.LastUsed = now
			return *b, false
		}
	}
	t.evictLocked(func(b *Binding) bool { return b.TokenKey == key }, t.cfg.MaxBindingsPerToken-1)
	if scope != "" {
		// Scope "" is every modern HTTP client (they have no MCP session),
		// not one caller: capped as one, 16 anonymous tokens evicted every
		// other modern client's binding.
		t.evictLocked(func(b *Binding) bool { return b.Scope == scope }, t.cfg.MaxBindingsPerScope-1)
	}
	t.makeRoomLocked()
	b := &Binding{Handle: newHandle(), Scope: scope, Base: base, Token: token, TokenKey: key, CreatedAt: now, LastUsed: now}
	for t.m[b.Handle] != nil { // astronomically unlikely
		b.Handle = newHandle()
	}
	t.m[b.Handle] = b
	return *b, true
}

// evictLocked removes least-recently-used bindings matching match until at
// most keep remain.
func (t *Bindings) evictLocked(match func(*Binding) bool, keep int) {
	var sel []*Binding
	for _, b := range t.m {
		if match(b) {
			sel = append(sel, b)
		}
	}
	if len(sel) <= keep {
		return
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].LastUsed.Before(sel[j].LastUsed) })
	for _, b := range sel[:len(sel)-keep] {
		delete(t.m, b.Handle)
	}
}

// makeRoomLocked frees a slot in a full table: the least recently used
// binding of the token holding the most goes, so a token's binding is
// evicted only while no token holds more (a holder of 32 anonymous tokens
// with 8 bindings each, in legacy MCP sessions, used to push every other
// binding out of the 256 by recency alone).
func (t *Bindings) makeRoomLocked() {
	for len(t.m) >= t.cfg.MaxBindings && len(t.m) > 0 {
		count := map[string]int{}
		most := 0
		for _, b := range t.m {
			count[b.TokenKey]++
			most = max(most, count[b.TokenKey])
		}
		var victim *Binding
		for _, b := range t.m {
			if count[b.TokenKey] == most && (victim == nil || b.LastUsed.Before(victim.LastUsed)) {
				victim = b
			}
		}
		delete(t.m, victim.Handle)
	}
}

func (t *Bindings) sweepLocked(now time.Time) {
	for h, b := range t.m {
		if now.Sub(b.LastUsed) > t.cfg.IdleTTL {
			delete(t.m, h)
		}
	}
}

// Resolve finds the binding a call addresses. With handle set, the handle is
// the capability: it works from any scope. Without it, the caller's only
// binding is the default; scope "" (a modern HTTP client, which has no MCP
// session) never gets a default. On ErrAmbiguous the visible bindings are
// returned so the error can list them.
func (t *Bindings) Resolve(scope, handle string) (Binding, []BindingSummary, error) {
	b, vis, err := t.resolve(scope, handle)
	if !errors.Is(err, ErrUnknownSession) || t.cfg.Shared == nil {
		return b, vis, err
	}
	// Bound on another node of the cluster?
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	base, token, ok, serr := t.cfg.Shared.Get(ctx, handle)
	cancel()
	if storeerr.Unavailable(serr) {
		return b, vis, fmt.Errorf("%w: %w", ErrBindingsUnavailable, serr)
	}
	if serr != nil || !ok {
		return b, vis, err
	}
	t.adopt(handle, base, token)
	return t.resolve(scope, handle)
}

// adopt holds a binding made on another node, under its handle. It gets no
// scope: only its handle names it here.
func (t *Bindings) adopt(handle, base, token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[handle] != nil {
		return
	}
	now := t.cfg.Now()
	key := tokenKey(token)
	t.evictLocked(func(b *Binding) bool { return b.TokenKey == key }, t.cfg.MaxBindingsPerToken-1)
	t.makeRoomLocked()
	t.m[handle] = &Binding{Handle: handle, Base: base, Token: token, TokenKey: key, CreatedAt: now, LastUsed: now}
}

func (t *Bindings) resolve(scope, handle string) (Binding, []BindingSummary, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.sweepLocked(now)
	if handle != "" {
		b := t.m[handle]
		if b == nil {
			return Binding{}, t.visibleLocked(scope), ErrUnknownSession
		}
		b.LastUsed = now
		return *b, nil, nil
	}
	if scope == "" {
		return Binding{}, nil, ErrSessionRequired
	}
	vis := t.visibleLocked(scope)
	switch len(vis) {
	case 0:
		return Binding{}, nil, ErrUnbound
	case 1:
		b := t.m[vis[0].Session]
		b.LastUsed = now
		return *b, nil, nil
	default:
		return Binding{}, vis, ErrAmbiguous
	}
}

// visibleLocked lists scope's bindings, oldest first (stable for the model).
func (t *Bindings) visibleLocked(scope string) []BindingSummary {
	if scope == "" {
		return nil
	}
	var bs []*Binding
	for _, b := range t.m {
		if b.Scope == scope {
			bs = append(bs, b)
		}
	}
	sort.Slice(bs, func(i, j int) bool {
		if !bs[i].CreatedAt.Equal(bs[j].CreatedAt) {
			return bs[i].CreatedAt.Before(bs[j].CreatedAt)
		}
		return bs[i].Handle < bs[j].Handle
	})
	out := make([]BindingSummary, len(bs))
	for i, b := range bs {
		out[i] = BindingSummary{Session: b.Handle, AppName: b.AppName}
	}
	return out
}

// Update applies fn to the binding with handle, if it still exists.
func (t *Bindings) Update(handle string, fn func(*Binding)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.m[handle]; b != nil {
		fn(b)
	}
}

// Remove deletes one binding and reports whether it existed. With Shared
// set it is deleted there too; if the store does not answer, Remove
// returns ErrBindingsUnavailable: the handle still works on the other
// nodes, and removing it again (after Resolve adopts it back) finishes.
func (t *Bindings) Remove(handle string) (bool, error) {
	t.mu.Lock()
	_, ok := t.m[handle]
	delete(t.m, handle)
	t.mu.Unlock()
	if t.cfg.Shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		err := t.cfg.Shared.Delete(ctx, handle)
		cancel()
		if storeerr.Unavailable(err) {
			return ok, fmt.Errorf("%w: %w", ErrBindingsUnavailable, err)
		}
	}
	return ok, nil
}

// DropScope deletes every binding of scope (an MCP session that ended).
func (t *Bindings) DropScope(scope string) int {
	if scope == "" {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for h, b := range t.m {
		if b.Scope == scope {
			delete(t.m, h)
			n++
		}
	}
	return n
}

// Len reports the number of live bindings.
func (t *Bindings) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(t.cfg.Now())
	return len(t.m)
}
