package pairing

import (
	"testing"
	"time"

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
