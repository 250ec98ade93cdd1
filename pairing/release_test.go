package pairing

import (
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/tokens"
)

// TestReleaserTick: memory is released once per burst, only after the
// burst went quiet for the set number of ticks, never while accepts
// continue, never for fewer accepts than a burst, and at most once per
// interval.
func TestReleaserTick(t *testing.T) {
	t.Parallel()
	var l releaser
	l.init()
	l.burst, l.quiet, l.every = 10, 2, time.Minute
	freed := 0
	l.free = func() { freed++ }
	t0 := time.Unix(1000, 0)
	tick := func(accepted int64, at time.Duration) {
		l.accepted.Store(accepted)
		l.tick(t0.Add(at))
	}
	steps := []struct {
		accepted int64
		at       time.Duration
		freed    int
	}{
		{5, 0, 0},
		{5, time.Second, 0},      // quiet, but 5 accepts are no burst
		{5, 2 * time.Second, 0},  //
		{12, 3 * time.Second, 0}, // a burst, still pairing
		{20, 4 * time.Second, 0},
		{20, 5 * time.Second, 0}, // quiet tick 1
		{20, 6 * time.Second, 1}, // quiet tick 2: released
		{20, 7 * time.Second, 1}, // nothing new since
		{40, 8 * time.Second, 1}, // another burst…
		{40, 9 * time.Second, 1},
		{40, 10 * time.Second, 1}, // …over, but within a minute of the last release
		{40, 65 * time.Second, 1},
		{40, 67 * time.Second, 2}, // a minute later: released
	}
	for i, s := range steps {
		tick(s.accepted, s.at)
		if freed != s.freed {
			t.Fatalf("step %d (accepted %d at %v): released %d times, want %d", i, s.accepted, s.at, freed, s.freed)
		}
	}
	if got := l.releases.Load(); got != 2 {
		t.Errorf("releases counted %d, want 2", got)
	}
}

// TestMemoryReleasedAfterPairingBurst: the registry loop releases memory
// once a burst of pairings is over, and counts it.
func TestMemoryReleasedAfterPairingBurst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 300 * time.Millisecond })
	released := make(chan struct{}, 1)
	e.reg.rel.burst, e.reg.rel.quiet = 3, 2 // set before the loop starts (the first pairing)
	e.reg.rel.free = func() { released <- struct{}{} }
	for range 3 {
		tok, _ := e.mint("")
		e.pair(tok)
	}
	recv(t, released)
	deadline := time.Now().Add(10 * time.Second)
	for e.reg.Stats().MemoryReleases != 1 { // counted right after free returns
		if time.Now().After(deadline) {
			t.Fatalf("MemoryReleases %d, want 1", e.reg.Stats().MemoryReleases)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, not synchronisation
	}
}

// TestReleaseDoesNotBlockTheLoop: while a release runs (here, until the test
// lets it finish) the registry loop goes on: a tab that stopped answering
// pings is closed meanwhile. The release is counted when it returns.
func TestReleaseDoesNotBlockTheLoop(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 300 * time.Millisecond })
	started, unblock := make(chan struct{}, 1), make(chan struct{})
	e.reg.rel.burst, e.reg.rel.quiet = 3, 2
	e.reg.rel.free = func() {
		started <- struct{}{}
		<-unblock
	}
	defer func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	}()
	for range 3 {
		tok, _ := e.mint("")
		e.pair(tok)
	}
	recv(t, started)
	tok, tid := e.mint("")
	ws, _, err := e.dialRaw(tok, dialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	dead := e.wrap(ws, dialOpts{noReader: true})
	if err := dead.ws.Write(ctxT(t), websocket.MessageText, []byte(`{"t":"hello","appName":"x","schemaHash":"h"}`)); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, e.closed); got != tid {
		t.Fatalf("closed %q, want the silent tab %q", got, tid)
	}
	if n := e.reg.Stats().MemoryReleases; n != 0 {
		t.Fatalf("MemoryReleases %d while the release is under way, want 0", n)
	}
	close(unblock)
	deadline := time.Now().Add(10 * time.Second)
	for e.reg.Stats().MemoryReleases != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("MemoryReleases %d after the release returned, want 1", e.reg.Stats().MemoryReleases)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, not synchronisation
	}
}
