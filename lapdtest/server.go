package lapdtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
)

// Server is a lapd running in-process on a loopback listener, like
// httptest.Server is for an http.Handler.
type Server struct {
	URL  string       // base URL, http://127.0.0.1:PORT (no trailing slash)
	Lapd *lapd.Server // the running parts (Tokens, Registry, Audit, Revoke, …)

	cfg   lapd.Config
	http  *httptest.Server
	audit *recorder
}

// NewServer starts lapd.New(cfg) on a loopback port with its Handler mounted
// at /. A test server is reachable from this machine only, so when cfg has
// no Identity it mints anonymously (AllowAnonymous), as `lapd serve` does on
// loopback. Every audit entry is also kept in memory (AuditEntries,
// WaitAudit). It panics if lapd.New refuses cfg (a bug in the test). Close
// it when done.
func NewServer(cfg lapd.Config) *Server {
	if cfg.Identity == nil {
		cfg.AllowAnonymous = true
	}
	rec := &recorder{notify: make(chan struct{})}
	cfg.AuditSinks = append(append([]audit.Sink(nil), cfg.AuditSinks...), rec)
	l, err := lapd.New(context.Background(), cfg)
	if err != nil {
		panic("lapdtest: " + err.Error())
	}
	hs := httptest.NewServer(l.Handler())
	return &Server{URL: hs.URL, Lapd: l, cfg: cfg, http: hs, audit: rec}
}

// Restart shuts lapd down as a deploy would (tabs get 1012 and reconnect)
// and starts a new one from the same Config on the same address. Sessions
// survive only with persistent stores (a DataDir, or your own TokenStore and
// ConfirmStore), inside the grace window. Lapd is replaced: do not call
// Restart while other goroutines use the Server.
func (s *Server) Restart() error {
	addr := s.http.Listener.Addr().String()
	s.Close()
	l, err := lapd.New(context.Background(), s.cfg)
	if err != nil {
		return fmt.Errorf("lapdtest: restart: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = l.Shutdown(context.Background())
		return fmt.Errorf("lapdtest: restart: %w", err)
	}
	hs := httptest.NewUnstartedServer(l.Handler())
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	s.Lapd, s.http = l, hs
	return nil
}

// Close shuts lapd down gracefully (tabs are closed with 1012, audit is
// flushed) and then closes the listener. It blocks for at most ten seconds.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.Lapd.Shutdown(ctx)
	s.http.Close()
}

// AuditEntries returns every audit entry recorded so far, oldest first.
func (s *Server) AuditEntries() []audit.Entry {
	s.audit.mu.Lock()
	defer s.audit.mu.Unlock()
	return append([]audit.Entry(nil), s.audit.entries...)
}

// WaitAudit returns the first audit entry (since the server started) for
// which match is true, waiting for it.
func (s *Server) WaitAudit(ctx context.Context, match func(audit.Entry) bool) (audit.Entry, error) {
	seen := 0
	for {
		s.audit.mu.Lock()
		for ; seen < len(s.audit.entries); seen++ {
			if e := s.audit.entries[seen]; match(e) {
				s.audit.mu.Unlock()
				return e, nil
			}
		}
		ch := s.audit.notify
		s.audit.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return audit.Entry{}, fmt.Errorf("lapdtest: waiting for an audit entry: %w", ctx.Err())
		}
	}
}

// Approve approves confirmID in tab as the human would, once lapd has
// recorded the proposal (its confirm-proposed audit entry), so the answer
// cannot overtake it. Use it with Tab.WaitConfirm.
func (s *Server) Approve(ctx context.Context, tab *Tab, confirmID string) error {
	if err := s.awaitProposal(ctx, confirmID); err != nil {
		return err
	}
	return tab.Approve(ctx, confirmID)
}

// Reject is Approve's opposite: the human said no.
func (s *Server) Reject(ctx context.Context, tab *Tab, confirmID string) error {
	if err := s.awaitProposal(ctx, confirmID); err != nil {
		return err
	}
	return tab.Reject(ctx, confirmID)
}

func (s *Server) awaitProposal(ctx context.Context, confirmID string) error {
	_, err := s.WaitAudit(ctx, func(e audit.Entry) bool {
		return e.Event == audit.EventConfirmProposed && e.Detail["confirmId"] == confirmID
	})
	return err
}

// recorder is the in-memory audit sink behind AuditEntries.
type recorder struct {
	mu      sync.Mutex
	entries []audit.Entry
	notify  chan struct{} // closed and replaced on every entry
}

func (r *recorder) Write(_ context.Context, e audit.Entry) error {
	r.mu.Lock()
	r.entries = append(r.entries, e)
	close(r.notify)
	r.notify = make(chan struct{})
	r.mu.Unlock()
	return nil
}

func (r *recorder) Close() error { return nil }

// Client returns an HTTP client for the server.
func (s *Server) Client() *http.Client { return s.http.Client() }

// LAPURL is the LAP base URL ({URL}{Prefix}/lap/v1) that connect_session takes.
func (s *Server) LAPURL() string { return s.URL + s.Lapd.LAP().BasePath() }

// MCPURL is the MCP Streamable HTTP endpoint, {URL}{Prefix}/mcp.
func (s *Server) MCPURL() string { return s.URL + s.Lapd.Prefix() + "/mcp" }

// WSURL is the tab's WebSocket endpoint, ws://…{Prefix}/ws.
func (s *Server) WSURL() string {
	return "ws" + strings.TrimPrefix(s.URL, "http") + s.Lapd.Prefix() + "/ws"
}

// Mint mints a session anonymously (POST {Prefix}/mint).
func (s *Server) Mint(ctx context.Context) (Session, error) {
	return Mint(ctx, s.Client(), s.URL+s.Lapd.Prefix()+"/mint")
}

// Pair mints a session and pairs a tab with it; opts configure the tab
// (WithApp, WithHandler, …). Close the tab when done.
func (s *Server) Pair(ctx context.Context, opts ...Option) (*Tab, Session, error) {
	sess, err := s.Mint(ctx)
	if err != nil {
		return nil, Session{}, err
	}
	tab, err := sess.Pair(ctx, opts...)
	return tab, sess, err
}

// Session is the body of a successful mint.
type Session struct {
	Token     string `json:"token"`     // agt_…: the bearer for LAP and connect_session (what the LLM side gets)
	TabSecret string `json:"tabSecret"` // tab_…: the tab's own credential for its WebSocket; never given to the LLM side
	TID       string `json:"tid"`       // the session id
	WSURL     string `json:"wsUrl"`     // where the tab connects
	LapURL    string `json:"lapUrl"`    // the LAP base URL for connect_session
	ExpiresAt int64  `json:"expiresAt"` // Unix ms
}

// ConnectLine is the line a human pastes into the chat, as lapd.js's panel
// shows it.
func (s Session) ConnectLine() string {
	return "Connect to my app with lapd: connect_session url=" + s.LapURL + " token=" + s.Token
}

// Pair connects a tab to the session's WebSocket with its token and tab
// secret.
func (s Session) Pair(ctx context.Context, opts ...Option) (*Tab, error) {
	return Dial(ctx, s.WSURL, s.Token, append([]Option{WithTabSecret(s.TabSecret)}, opts...)...)
}

// MintError is a refused mint.
type MintError struct {
	Status int
	Body   []byte
}

func (e *MintError) Error() string {
	return fmt.Sprintf("lapdtest: mint refused: status %d %s", e.Status, strings.TrimSpace(string(e.Body)))
}

// Mint POSTs {"tab":true} to mintURL (a lapd's {Prefix}/mint, e.g.
// http://127.0.0.1:8080/agent/mint), as lapd.js does, so the session has a
// tab secret (Session.TabSecret; Session.Pair presents it), with hc, nil meaning
// http.DefaultClient. To mint as a logged-in user of your app, give hc a
// cookie jar holding your app's session (or a Transport that adds it). A
// refusal is a *MintError.
func Mint(ctx context.Context, hc *http.Client, mintURL string) (Session, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, mintURL, strings.NewReader(`{"tab":true}`))
	if err != nil {
		return Session{}, fmt.Errorf("lapdtest: mint: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		return Session{}, fmt.Errorf("lapdtest: mint: %w", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if res.StatusCode != http.StatusOK {
		return Session{}, &MintError{Status: res.StatusCode, Body: b}
	}
	var s Session
	if err := json.Unmarshal(b, &s); err != nil || s.Token == "" {
		return Session{}, fmt.Errorf("lapdtest: mint: unexpected body %q", b)
	}
	return s, nil
}
