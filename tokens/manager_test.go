package tokens_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a fake clock the tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.UnixMilli(1_800_000_000_000)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// storeKinds are the stores every Manager test runs against.
var storeKinds = map[string]func(t *testing.T) tokens.Store{
	"memory": func(*testing.T) tokens.Store { return tokens.NewMemoryStore() },
	"sqlite": func(t *testing.T) tokens.Store { return openSQLite(t) },
}

type fixture struct {
	m     *tokens.Manager
	clock *clock
	store tokens.Store
	ctx   context.Context
}

// forEachStore runs fn as a parallel subtest per store kind, with a Manager
// built from cfg (Store and Clock filled in).
func forEachStore(t *testing.T, cfg tokens.Config, fn func(t *testing.T, f *fixture)) {
	t.Helper()
	for name, open := range storeKinds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() { s.Close() })
			c := newClock()
			cfg := cfg
			cfg.Store, cfg.Clock = s, c.Now
			m, err := tokens.NewManager(cfg)
			if err != nil {
				t.Fatal(err)
			}
			fn(t, &fixture{m: m, clock: c, store: s, ctx: t.Context()})
		})
	}
}

func (f *fixture) mint(t *testing.T, uid string) (string, tokens.Record) {
	t.Helper()
	tok, rec, err := f.m.Mint(f.ctx, uid, "https://app.example", "")
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	return tok, rec
}

// paired mints, accepts and activates: an active record.
func (f *fixture) paired(t *testing.T, uid string) (string, tokens.Record) {
	t.Helper()
	tok, rec := f.mint(t, uid)
	if _, _, err := f.m.Accept(f.ctx, tok); err != nil {
		t.Fatalf("Accept: %v", err)
	}
	rec, _, err := f.m.Activate(f.ctx, rec.TID)
	if err != nil {
		t.Fatalf("Activate: %v", err)
	}
	return tok, rec
}

func (f *fixture) status(t *testing.T, tid string) tokens.Status {
	t.Helper()
	rec, err := f.m.Get(f.ctx, tid)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec.Status
}

func TestNewManagerNeedsStore(t *testing.T) {
	t.Parallel()
	if _, err := tokens.NewManager(tokens.Config{}); err == nil {
		t.Fatal("NewManager without a Store succeeded")
	}
}

func TestHash(t *testing.T) {
	t.Parallel()
	tok, hash := tokens.Generate()
	tests := []struct {
		name, token string
		ok          bool
	}{
		{"generated", tok, true},
		{"empty", "", false},
		{"no prefix", strings.TrimPrefix(tok, tokens.Prefix) + "abcd", false},
		{"old prefix", "llui-agent_" + tok[4:], false},
		{"short", tok[:46], false},
		{"long", tok + "A", false},
		{"bad charset", tok[:46] + "=", false},
		{"plus", tok[:10] + "+" + tok[11:], false},
	}
	for _, tt := range tests {
		h, err := tokens.Hash(tt.token)
		if tt.ok && (err != nil || h != hash) {
			t.Errorf("%s: Hash = %q, %v; want %q", tt.name, h, err, hash)
		}
		if !tt.ok && !errors.Is(err, tokens.ErrMalformed) {
			t.Errorf("%s: Hash(%q) = %v, want ErrMalformed", tt.name, tt.token, err)
		}
	}
	if len(tok) != 47 || !strings.HasPrefix(tok, "agt_") || len(hash) != 64 {
		t.Errorf("Generate = %q (%d chars), %q", tok, len(tok), hash)
	}
	if tok2, _ := tokens.Generate(); tok2 == tok {
		t.Error("Generate repeated a token")
	}
}

func TestMint(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		now := f.m.Now()
		tok, rec, err := f.m.Mint(f.ctx, "alice", "https://app.example", "my tab")
		if err != nil {
			t.Fatal(err)
		}
		h, _ := tokens.Hash(tok)
		want := tokens.Record{TID: rec.TID, TokenHash: h, UID: "alice", Status: tokens.StatusAwaitingWS,
			CreatedAt: now, ExpiresAt: now + 24*3600*1000, LastSeenAt: now, Origin: "https://app.example", Label: "my tab"}
		if rec != want {
			t.Errorf("Mint record = %+v, want %+v", rec, want)
		}
		if len(rec.TID) != 36 || rec.TID[14] != '4' || !strings.ContainsRune("89ab", rune(rec.TID[19])) {
			t.Errorf("tid %q is not a v4 UUID", rec.TID)
		}
		if got, err := f.m.Verify(f.ctx, tok); err != nil || got != want {
			t.Errorf("Verify = %+v, %v", got, err)
		}
		_, rec2 := f.mint(t, "alice")
		if rec2.TID == rec.TID {
			t.Error("two mints share a tid")
		}
	})
}

func TestVerify(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{TTL: time.Hour}, func(t *testing.T, f *fixture) {
		tok, rec := f.mint(t, "alice")
		other, _ := tokens.Generate()
		tests := []struct {
			name  string
			token string
			want  error
		}{
			{"malformed", "Bearer x", tokens.ErrMalformed},
			{"unknown", other, tokens.ErrUnknown},
			{"awaiting-ws", tok, nil},
		}
		for _, tt := range tests {
			if _, err := f.m.Verify(f.ctx, tt.token); !errors.Is(err, tt.want) {
				t.Errorf("%s: Verify = %v, want %v", tt.name, err, tt.want)
			}
		}
		// Every live status verifies; a pending-resume past grace too (the
		// caller answers 503 paused/expired).
		f.m.Accept(f.ctx, tok)
		checkVerify(t, f, tok, tokens.StatusAwaitingClaude, nil)
		f.m.Activate(f.ctx, rec.TID)
		checkVerify(t, f, tok, tokens.StatusActive, nil)
		f.m.Disconnected(f.ctx, rec.TID)
		checkVerify(t, f, tok, tokens.StatusPendingResume, nil)
		f.clock.Advance(2 * time.Minute)
		checkVerify(t, f, tok, tokens.StatusPendingResume, nil)
		// Hard expiry: exactly at ExpiresAt the token is dead.
		f.clock.Advance(time.Hour - 2*time.Minute - time.Millisecond)
		checkVerify(t, f, tok, tokens.StatusPendingResume, nil)
		f.clock.Advance(time.Millisecond)
		got, err := f.m.Verify(f.ctx, tok)
		if !errors.Is(err, tokens.ErrExpired) || got.TID != rec.TID {
			t.Errorf("at ExpiresAt: Verify = %+v, %v; want the record and ErrExpired", got, err)
		}
	})
}

func checkVerify(t *testing.T, f *fixture, tok string, status tokens.Status, want error) {
	t.Helper()
	rec, err := f.m.Verify(f.ctx, tok)
	if !errors.Is(err, want) {
		t.Errorf("Verify in %s = %v, want %v", status, err, want)
	}
	if rec.Status != status {
		t.Errorf("Verify returned status %s, want %s", rec.Status, status)
	}
}

func TestVerifyRevoked(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, rec := f.paired(t, "alice")
		if _, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{UID: "alice"}); err != nil {
			t.Fatal(err)
		}
		got, err := f.m.Verify(f.ctx, tok)
		if !errors.Is(err, tokens.ErrRevoked) || got.TID != rec.TID {
			t.Errorf("Verify(revoked) = %+v, %v; want the record and ErrRevoked", got, err)
		}
	})
}

func TestSlidingTTL(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{SlidingTTL: 10 * time.Minute}, func(t *testing.T, f *fixture) {
		tok, rec := f.paired(t, "alice")
		f.clock.Advance(10 * time.Minute) // LastSeenAt+TTL == now: still alive
		if _, err := f.m.Verify(f.ctx, tok); err != nil {
			t.Fatalf("at the sliding deadline: %v", err)
		}
		if err := f.m.Touch(f.ctx, rec.TID); err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(10 * time.Minute)
		if _, err := f.m.Verify(f.ctx, tok); err != nil {
			t.Fatalf("Touch did not slide the window: %v", err)
		}
		f.clock.Advance(time.Millisecond)
		if _, err := f.m.Verify(f.ctx, tok); !errors.Is(err, tokens.ErrExpired) {
			t.Errorf("past the sliding TTL: Verify = %v, want ErrExpired", err)
		}
		if _, _, err := f.m.Accept(f.ctx, tok); !errors.Is(err, tokens.ErrExpired) {
			t.Errorf("past the sliding TTL: Accept = %v, want ErrExpired", err)
		}
	})
}

func TestSlidingTTLOffByDefault(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, _ := f.paired(t, "alice")
		f.clock.Advance(23 * time.Hour)
		if _, err := f.m.Verify(f.ctx, tok); err != nil {
			t.Errorf("idle for 23h without SlidingTTL: %v", err)
		}
	})
}

func TestAcceptActivate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uid, label, wantLabel string
	}{
		{"alice", "", "alice"},
		{"alice", "my tab", "alice"},
		{"", "my tab", "my tab"},
		{"", "", "Claude"},
	}
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		for _, tt := range tests {
			tok, rec, err := f.m.Mint(f.ctx, tt.uid, "https://app.example", tt.label)
			if err != nil {
				t.Fatal(err)
			}
			if rec, _, err := f.m.Activate(f.ctx, rec.TID); err != nil || rec.Status != tokens.StatusAwaitingWS {
				t.Errorf("Activate before Accept moved the record: %+v, %v", rec, err)
			}
			f.clock.Advance(time.Second)
			got, repair, err := f.m.Accept(f.ctx, tok)
			if err != nil || repair || got.Status != tokens.StatusAwaitingClaude || got.LastSeenAt != f.m.Now() {
				t.Fatalf("Accept = %+v, %v, %v", got, repair, err)
			}
			got, changed, err := f.m.Activate(f.ctx, rec.TID)
			if err != nil || !changed || got.Status != tokens.StatusActive || got.Label != tt.wantLabel {
				t.Errorf("uid %q label %q: Activate = %+v, %v, %v; want active %q", tt.uid, tt.label, got, changed, err, tt.wantLabel)
			}
			if _, changed, err := f.m.Activate(f.ctx, rec.TID); err != nil || changed {
				t.Errorf("second Activate changed = %v, %v", changed, err)
			}
			// A second socket while active regresses to awaiting-claude.
			got, repair, err = f.m.Accept(f.ctx, tok)
			if err != nil || repair || got.Status != tokens.StatusAwaitingClaude {
				t.Errorf("Accept while active = %+v, %v, %v", got, repair, err)
			}
		}
		if _, _, err := f.m.Activate(f.ctx, "nope"); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Activate(unknown) = %v", err)
		}
	})
}

func TestDisconnected(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{Grace: 30 * time.Second}, func(t *testing.T, f *fixture) {
		tok, awaitingWS := f.mint(t, "alice")
		if rec, err := f.m.Disconnected(f.ctx, awaitingWS.TID); err != nil || rec.Status != tokens.StatusAwaitingWS {
			t.Errorf("Disconnected(awaiting-ws) = %+v, %v; want unchanged", rec, err)
		}
		f.m.Accept(f.ctx, tok)
		rec, err := f.m.Disconnected(f.ctx, awaitingWS.TID)
		if err != nil || rec.Status != tokens.StatusPendingResume || rec.PendingResumeUntil != f.m.Now()+30_000 {
			t.Errorf("Disconnected(awaiting-claude) = %+v, %v", rec, err)
		}
		// A second close (the stale socket) leaves the deadline alone.
		f.clock.Advance(time.Second)
		if again, err := f.m.Disconnected(f.ctx, awaitingWS.TID); err != nil || again != rec {
			t.Errorf("Disconnected(pending-resume) = %+v, %v; want unchanged %+v", again, err, rec)
		}
		_, active := f.paired(t, "alice")
		if rec, err := f.m.Disconnected(f.ctx, active.TID); err != nil || rec.Status != tokens.StatusPendingResume {
			t.Errorf("Disconnected(active) = %+v, %v", rec, err)
		}
		_, revoked := f.paired(t, "alice")
		f.m.Revoke(f.ctx, revoked.TID, tokens.Owner{UID: "alice"})
		if rec, err := f.m.Disconnected(f.ctx, revoked.TID); err != nil || rec.Status != tokens.StatusRevoked {
			t.Errorf("Disconnected(revoked) = %+v, %v; want still revoked", rec, err)
		}
	})
}

func TestRepairInsideGrace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		after   time.Duration
		wantErr error
	}{
		{"at once", 0, nil},
		{"1ms before the deadline", 60*time.Second - time.Millisecond, nil},
		{"exactly at the deadline", 60 * time.Second, tokens.ErrExpired},
		{"after the deadline", 61 * time.Second, tokens.ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
				tok, rec := f.mint(t, "")
				f.m.Accept(f.ctx, tok)
				f.m.Activate(f.ctx, rec.TID)
				f.m.Disconnected(f.ctx, rec.TID)
				f.clock.Advance(tt.after)
				got, repair, err := f.m.Accept(f.ctx, tok)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Accept = %v, want %v", err, tt.wantErr)
				}
				if err != nil {
					if s := f.status(t, rec.TID); s != tokens.StatusPendingResume {
						t.Errorf("refused Accept moved the record to %s", s)
					}
					return
				}
				if !repair || got.Status != tokens.StatusActive || got.PendingResumeUntil != 0 || got.Label != "Claude" || !got.Used {
					t.Errorf("re-pair = %+v, repair=%v", got, repair)
				}
			})
		})
	}
}

func TestRepairLabel(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		// Closed before any LAP call: no label yet, so it reads "(reconnected)".
		tok, rec := f.mint(t, "")
		f.m.Accept(f.ctx, tok)
		f.m.Disconnected(f.ctx, rec.TID)
		got, repair, err := f.m.Accept(f.ctx, tok)
		if err != nil || !repair || got.Label != "(reconnected)" || got.Status != tokens.StatusActive || got.Used {
			t.Errorf("re-pair = %+v, %v, %v", got, repair, err)
		}
		// The model's first call then marks it used (the caller pushes
		// {t:'active'} once more) and gives it the activation's label.
		got, changed, err := f.m.Activate(f.ctx, rec.TID)
		if err != nil || !changed || !got.Used || got.Status != tokens.StatusActive || got.Label != "Claude" {
			t.Errorf("first call after a re-pair before any model: %+v, changed=%v, %v", got, changed, err)
		}
		if _, changed, err := f.m.Activate(f.ctx, rec.TID); err != nil || changed {
			t.Errorf("second call: changed=%v, %v", changed, err)
		}
		// Used survives the next re-pair.
		f.m.Disconnected(f.ctx, rec.TID)
		if got, _, err := f.m.Accept(f.ctx, tok); err != nil || !got.Used || got.Label != "Claude" {
			t.Errorf("re-pair after a model's call = %+v, %v", got, err)
		}
	})
}

func TestZeroGrace(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{Grace: -1}, func(t *testing.T, f *fixture) {
		tok, rec := f.paired(t, "alice")
		got, _ := f.m.Disconnected(f.ctx, rec.TID)
		if got.PendingResumeUntil != f.m.Now() {
			t.Errorf("PendingResumeUntil = %d, want now %d", got.PendingResumeUntil, f.m.Now())
		}
		if _, _, err := f.m.Accept(f.ctx, tok); !errors.Is(err, tokens.ErrExpired) {
			t.Errorf("Accept with zero grace = %v, want ErrExpired", err)
		}
		if _, _, _, err := f.m.Claim(f.ctx, rec.TID, "https://app.example", tokens.Owner{UID: "alice"}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("Claim with zero grace = %v, want ErrForbidden", err)
		}
	})
}

func TestClaim(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{TTL: time.Hour}, func(t *testing.T, f *fixture) {
		oldTok, rec := f.mint(t, "alice")
		f.m.Accept(f.ctx, oldTok)
		f.m.Activate(f.ctx, rec.TID) // the model used the old token
		f.m.Disconnected(f.ctx, rec.TID)
		f.clock.Advance(10 * time.Second)
		tok, tab, got, err := f.m.Claim(f.ctx, rec.TID, "https://app.example", tokens.Owner{UID: "alice"})
		if err != nil || tab != "" {
			t.Fatal(err)
		}
		now := f.m.Now()
		if got.TID != rec.TID || got.Status != tokens.StatusActive || got.ExpiresAt != now+3600_000 ||
			got.PendingResumeUntil != 0 || got.LastSeenAt != now || got.Label != "alice" || got.Used {
			t.Errorf("Claim record = %+v (a new token: no model has used it)", got)
		}
		if tok == oldTok {
			t.Fatal("Claim did not rotate the token")
		}
		if _, err := f.m.Verify(f.ctx, oldTok); !errors.Is(err, tokens.ErrUnknown) {
			t.Errorf("old token after Claim: %v, want ErrUnknown", err)
		}
		if v, err := f.m.Verify(f.ctx, tok); err != nil || v.TID != rec.TID {
			t.Errorf("new token: %+v, %v", v, err)
		}
		// The tab reconnects with the new token; the next LAP call activates.
		if a, repair, err := f.m.Accept(f.ctx, tok); err != nil || repair || a.Status != tokens.StatusAwaitingClaude {
			t.Errorf("Accept after Claim = %+v, %v, %v", a, repair, err)
		}
		if _, _, _, err := f.m.Claim(f.ctx, rec.TID, "https://app.example", tokens.Owner{UID: "alice"}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("second Claim of a no longer pending record = %v, want ErrForbidden", err)
		}
	})
}

func TestClaimRefused(t *testing.T) {
	t.Parallel()
	const origin = "https://app.example"
	tests := []struct {
		name        string
		before      time.Duration // clock advance between Accept and Disconnected
		after       func(f *fixture, tid string)
		tid, uid, o string
	}{
		{name: "unknown tid", tid: "nope", uid: "alice", o: origin},
		{name: "other uid", uid: "bob", o: origin},
		{name: "anonymous caller", uid: "", o: origin},
		{name: "other origin", uid: "alice", o: "https://evil.example"},
		{name: "exactly at the grace deadline", uid: "alice", o: origin,
			after: func(f *fixture, _ string) { f.clock.Advance(time.Minute) }},
		{name: "inside grace, at hard expiry", uid: "alice", o: origin, before: 59*time.Minute + 30*time.Second,
			after: func(f *fixture, _ string) { f.clock.Advance(30 * time.Second) }},
		{name: "revoked", uid: "alice", o: origin,
			after: func(f *fixture, tid string) { f.m.Revoke(f.ctx, tid, tokens.Owner{UID: "alice"}) }},
		{name: "already claimed (active)", uid: "alice", o: origin, after: func(f *fixture, tid string) {
			f.m.Claim(f.ctx, tid, origin, tokens.Owner{UID: "alice"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			forEachStore(t, tokens.Config{TTL: time.Hour}, func(t *testing.T, f *fixture) {
				tok, rec := f.mint(t, "alice")
				f.m.Accept(f.ctx, tok)
				f.clock.Advance(tt.before)
				f.m.Disconnected(f.ctx, rec.TID)
				if tt.after != nil {
					tt.after(f, rec.TID)
				}
				tid := rec.TID
				if tt.tid != "" {
					tid = tt.tid
				}
				before, _ := f.m.Get(f.ctx, rec.TID)
				newTok, _, got, err := f.m.Claim(f.ctx, tid, tt.o, tokens.Owner{UID: tt.uid})
				if !errors.Is(err, tokens.ErrForbidden) || newTok != "" || got.TID != "" {
					t.Errorf("Claim = %q, %+v, %v; want ErrForbidden", newTok, got, err)
				}
				if after, _ := f.m.Get(f.ctx, rec.TID); after != before {
					t.Errorf("refused Claim changed the record: %+v → %+v", before, after)
				}
			})
		})
	}
}

func TestRevoke(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, rec := f.paired(t, "alice")
		if _, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{UID: "bob"}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("Revoke by another uid = %v, want ErrForbidden", err)
		}
		if _, err := f.m.Revoke(f.ctx, "nope", tokens.Owner{UID: "alice"}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("Revoke(unknown) = %v, want ErrForbidden", err)
		}
		got, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{UID: "alice"})
		if err != nil || got.Status != tokens.StatusRevoked {
			t.Fatalf("Revoke = %+v, %v", got, err)
		}
		if again, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{UID: "alice"}); err != nil || again != got {
			t.Errorf("second Revoke = %+v, %v; want no error, unchanged", again, err)
		}
		// Terminal: nothing moves it again.
		if _, _, err := f.m.Accept(f.ctx, tok); !errors.Is(err, tokens.ErrRevoked) {
			t.Errorf("Accept(revoked) = %v, want ErrRevoked", err)
		}
		f.m.Activate(f.ctx, rec.TID)
		f.m.Disconnected(f.ctx, rec.TID)
		f.m.Claim(f.ctx, rec.TID, "https://app.example", tokens.Owner{UID: "alice"})
		if s := f.status(t, rec.TID); s != tokens.StatusRevoked {
			t.Errorf("revoked record moved to %s", s)
		}
	})
}

func TestAcceptRefused(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		other, _ := tokens.Generate()
		if _, _, err := f.m.Accept(f.ctx, other); !errors.Is(err, tokens.ErrUnknown) {
			t.Errorf("Accept(unknown) = %v", err)
		}
		if _, _, err := f.m.Accept(f.ctx, "agt_short"); !errors.Is(err, tokens.ErrMalformed) {
			t.Errorf("Accept(malformed) = %v", err)
		}
		tok, _ := f.mint(t, "alice")
		f.clock.Advance(24 * time.Hour)
		if _, _, err := f.m.Accept(f.ctx, tok); !errors.Is(err, tokens.ErrExpired) {
			t.Errorf("Accept(expired) = %v", err)
		}
	})
}

func TestResumeList(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		_, active := f.paired(t, "alice")
		_, pending := f.paired(t, "alice")
		f.m.Disconnected(f.ctx, pending.TID)
		tok, unlabelled := f.mint(t, "alice")
		f.m.Accept(f.ctx, tok)
		f.m.Disconnected(f.ctx, unlabelled.TID)
		_, bobs := f.paired(t, "bob")
		f.m.Disconnected(f.ctx, bobs.TID)
		_, anon := f.paired(t, "")
		f.m.Disconnected(f.ctx, anon.TID)

		all := []string{active.TID, pending.TID, unlabelled.TID, bobs.TID, anon.TID, "nope"}
		tests := []struct {
			uid  string
			want []string
		}{
			{"alice", []string{pending.TID + ":alice", unlabelled.TID + ":(unknown)"}},
			{"bob", []string{bobs.TID + ":bob"}},
			{"", []string{anon.TID + ":Claude"}},
			{"carol", []string{}},
		}
		for _, tt := range tests {
			recs, err := f.m.ResumeList(f.ctx, tt.uid, all)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, r := range recs {
				got = append(got, r.TID+":"+r.Label)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("ResumeList(%q) = %v, want %v", tt.uid, got, tt.want)
			}
		}
		f.clock.Advance(time.Minute) // exactly at every deadline
		if recs, err := f.m.ResumeList(f.ctx, "alice", all); err != nil || len(recs) != 0 {
			t.Errorf("ResumeList past grace = %v, %v; want none", recs, err)
		}
	})
}

func TestResumeListBounded(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		_, rec := f.paired(t, "alice")
		f.m.Disconnected(f.ctx, rec.TID)
		tids := make([]string, tokens.MaxResumeTIDs)
		for i := range tids {
			tids[i] = fmt.Sprint("unknown-", i)
		}
		if recs, _ := f.m.ResumeList(f.ctx, "alice", append(tids, rec.TID)); len(recs) != 0 {
			t.Errorf("ResumeList looked past MaxResumeTIDs: %v", recs)
		}
		if recs, _ := f.m.ResumeList(f.ctx, "alice", append([]string{rec.TID}, tids...)); len(recs) != 1 {
			t.Errorf("ResumeList = %v, want the one record", recs)
		}
	})
}

func TestSessions(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		f.mint(t, "alice") // awaiting-ws: not listed
		_, a := f.paired(t, "alice")
		_, p := f.paired(t, "alice")
		f.m.Disconnected(f.ctx, p.TID)
		_, r := f.paired(t, "alice")
		f.m.Revoke(f.ctx, r.TID, tokens.Owner{UID: "alice"})
		f.paired(t, "bob")
		f.paired(t, "")
		recs, err := f.m.Sessions(f.ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := tids(recs), []string{a.TID, p.TID}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Sessions(alice) = %v, want %v", got, want)
		}
		if recs, err := f.m.Sessions(f.ctx, ""); err != nil || recs == nil || len(recs) != 0 {
			t.Errorf("Sessions(anonymous) = %#v, %v; want empty", recs, err)
		}
	})
}

func tids(recs []tokens.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.TID
	}
	return out
}

func TestTouch(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		_, rec := f.mint(t, "alice")
		f.clock.Advance(5 * time.Second)
		if err := f.m.Touch(f.ctx, rec.TID); err != nil {
			t.Fatal(err)
		}
		if got, _ := f.m.Get(f.ctx, rec.TID); got.LastSeenAt != f.m.Now() || got.Status != tokens.StatusAwaitingWS {
			t.Errorf("after Touch: %+v", got)
		}
		if err := f.m.Touch(f.ctx, "nope"); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Touch(unknown) = %v", err)
		}
	})
}

func TestSweep(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{TTL: time.Hour, Retention: 10 * time.Minute}, func(t *testing.T, f *fixture) {
		_, old := f.mint(t, "alice") // sweeps nothing, starts the one-minute window
		f.clock.Advance(30 * time.Minute)
		_, mid := f.mint(t, "alice")
		f.clock.Advance(40*time.Minute + time.Millisecond) // old: ExpiresAt+Retention just passed
		f.mint(t, "alice")
		if _, err := f.m.Get(f.ctx, old.TID); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("Mint did not sweep a dead record: %v", err)
		}
		if _, err := f.m.Get(f.ctx, mid.TID); err != nil {
			t.Errorf("Mint swept a live record: %v", err)
		}
		f.clock.Advance(30 * time.Minute) // mid: ExpiresAt+Retention passed
		f.mint(t, "alice")
		if _, err := f.m.Get(f.ctx, mid.TID); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("mid not swept: %v", err)
		}
	})
}

func TestSweepAtMostOncePerMinute(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{TTL: time.Minute, Retention: time.Millisecond}, func(t *testing.T, f *fixture) {
		f.mint(t, "alice") // sweeps at t0
		_, a := f.mint(t, "alice")
		f.clock.Advance(59 * time.Second)
		_, b := f.mint(t, "alice") // within the minute: no sweep
		f.clock.Advance(2 * time.Second)
		// a is dead (ExpiresAt+1ms passed) but the last sweep was 61s ago: this sweeps.
		f.mint(t, "alice")
		if _, err := f.m.Get(f.ctx, a.TID); !errors.Is(err, tokens.ErrNotFound) {
			t.Errorf("a not swept: %v", err)
		}
		f.clock.Advance(59 * time.Second) // b dead now; last sweep 59s ago
		f.mint(t, "alice")
		if _, err := f.m.Get(f.ctx, b.TID); err != nil {
			t.Errorf("swept twice within a minute: %v", err)
		}
		n, err := f.m.Sweep(f.ctx)
		if err != nil || n < 1 {
			t.Errorf("explicit Sweep = %d, %v", n, err)
		}
	})
}

func TestConcurrentLifecycle(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, rec := f.mint(t, "alice")
		f.m.Accept(f.ctx, tok)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() { f.m.Touch(f.ctx, rec.TID) })
			wg.Go(func() { f.m.Verify(f.ctx, tok) })
		}
		var changed atomic.Int32
		for range 10 {
			wg.Go(func() {
				if _, c, err := f.m.Activate(f.ctx, rec.TID); err == nil && c {
					changed.Add(1)
				}
			})
		}
		wg.Wait()
		if s := f.status(t, rec.TID); s != tokens.StatusActive {
			t.Errorf("status = %s", s)
		}
		if n := changed.Load(); n != 1 {
			t.Errorf("%d concurrent Activate calls reported a change, want exactly 1 (one {t:'active'} push)", n)
		}
	})
}

func TestTouchResolution(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		_, rec := f.paired(t, "")
		seen := func() int64 {
			r, err := f.m.Get(f.ctx, rec.TID)
			if err != nil {
				t.Fatal(err)
			}
			return r.LastSeenAt
		}
		f.clock.Advance(5 * time.Second)
		if err := f.m.Touch(f.ctx, rec.TID); err != nil {
			t.Fatal(err)
		}
		first := seen()
		if first != f.m.Now() {
			t.Fatalf("Touch after 5 s: LastSeenAt %d, want now %d", first, f.m.Now())
		}
		f.clock.Advance(tokens.TouchResolution - time.Millisecond)
		if err := f.m.Touch(f.ctx, rec.TID); err != nil {
			t.Fatal(err)
		}
		if got := seen(); got != first {
			t.Errorf("Touch within the resolution rewrote LastSeenAt: %d → %d", first, got)
		}
		f.clock.Advance(time.Millisecond)
		if err := f.m.Touch(f.ctx, rec.TID); err != nil {
			t.Fatal(err)
		}
		if got := seen(); got != f.m.Now() {
			t.Errorf("Touch at the resolution: LastSeenAt %d, want %d", got, f.m.Now())
		}
		if err := f.m.Touch(f.ctx, "no-such-tid"); err == nil {
			t.Error("Touch of an unknown tid must fail")
		}
	})
}

// downStore fails every Update as a store that does not answer (a NATS
// timeout) and counts them.
type downStore struct {
	tokens.Store
	updates atomic.Int32
	down    atomic.Bool
}

func (s *downStore) Update(ctx context.Context, tid string, fn func(*tokens.Record) error) (tokens.Record, error) {
	s.updates.Add(1)
	if s.down.Load() {
		return tokens.Record{}, nats.ErrTimeout
	}
	return s.Store.Update(ctx, tid, fn)
}

// A touch the store did not take is not tried again for TouchResolution:
// while the store cannot write, every call of a tab would otherwise wait
// for its timeout. Once it writes again, touching resumes.
func TestTouchWhileStoreDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &downStore{Store: tokens.NewMemoryStore()}
	var now atomic.Int64
	now.Store(time.Unix(1000, 0).UnixMilli())
	m, err := tokens.NewManager(tokens.Config{Store: st, Clock: func() time.Time { return time.UnixMilli(now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	_, rec, err := m.Mint(ctx, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	st.down.Store(true)
	now.Add(5000)
	before := st.updates.Load()
	for range 5 {
		if err := m.Touch(ctx, rec.TID); err != nil && !tokens.Unavailable(err) {
			t.Fatal(err)
		}
		now.Add(100)
	}
	if n := st.updates.Load() - before; n != 1 {
		t.Fatalf("5 touches within a second of a failed write made %d writes, want 1", n)
	}
	st.down.Store(false)
	now.Add(int64(tokens.TouchResolution / time.Millisecond))
	if err := m.Touch(ctx, rec.TID); err != nil {
		t.Fatal(err)
	}
	got, _ := m.Get(ctx, rec.TID)
	if got.LastSeenAt != now.Load() {
		t.Fatalf("LastSeenAt %d after the store came back, want %d", got.LastSeenAt, now.Load())
	}
}
