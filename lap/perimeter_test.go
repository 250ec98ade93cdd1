package lap_test

import (
	"fmt"
	"testing"
)

// A full rate-limit table used to refuse every new key (429 for everyone
// once 100,000 distinct forwarded addresses had minted); now the least
// recently used key makes room.
func TestRateTableFullEvictsInsteadOfRefusing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.TrustProxy = 1; c.lap.MaxRateKeys = 8 })
	for i := range 20 {
		xff := fmt.Sprintf("198.51.100.%d", i)
		if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", xff); r.status != 200 {
			t.Fatalf("mint from %s with a full table: %d %s", xff, r.status, r.body)
		}
	}
	if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", "203.0.113.1"); r.status != 200 {
		t.Fatalf("a newcomer after the flood: %d %s", r.status, r.body)
	}
}

// One IPv6 subscriber holds a whole /64: its addresses share one bucket.
func TestMintRateGroupsIPv6By64(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.TrustProxy = 1; c.lap.MintBurst = 2; c.lap.MintRate = 0.0001 })
	for i, want := range []int{200, 200, 429} {
		xff := fmt.Sprintf("2001:db8:aa:bb::%x", i+1)
		if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", xff); r.status != want {
			t.Fatalf("mint %d from %s: %d %s, want %d", i, xff, r.status, r.body, want)
		}
	}
	if r := e.do("POST", "/agent/mint", "", "", "X-Forwarded-For", "2001:db8:aa:cc::1"); r.status != 200 {
		t.Fatalf("another /64: %d %s", r.status, r.body)
	}
}
