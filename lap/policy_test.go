package lap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lapd-dev/lapd/schema"
)

// A policy is compiled once however many calls (and tabs sending the same
// bytes) need it at the same time; before, every call that found no cached
// entry compiled it again (8 concurrent calls × a hint bomb = 3 GB).
func TestPolicyCompiledOncePerPolicy(t *testing.T) {
	t.Parallel()
	pc := newPolicyCache(0)
	var compiles atomic.Int32
	release := make(chan struct{})
	pc.parse = func(raw json.RawMessage) (*schema.Policy, error) {
		compiles.Add(1)
		<-release
		return schema.Parse(raw)
	}
	pol := `{"variants":{"a":{"schema":{"type":"object"}}}}`
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw := []byte(pol) // each tab's hello has its own bytes
			p, err := pc.get(context.Background(), fmt.Sprintf("tid-%d", i%4), raw)
			if err != nil || p == nil {
				t.Errorf("get: %v %v", p, err)
			}
		}()
	}
	for compiles.Load() == 0 {
		// wait until the first compile started (it blocks on release)
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if n := compiles.Load(); n != 1 {
		t.Errorf("compiled %d times, want 1", n)
	}
	// A new hello with other bytes compiles once more; the same hello again does not.
	raw := []byte(strings.Replace(pol, `"a"`, `"b"`, 1))
	for range 3 {
		if _, err := pc.get(context.Background(), "tid-0", raw); err != nil {
			t.Fatal(err)
		}
	}
	if n := compiles.Load(); n != 2 {
		t.Errorf("compiled %d times, want 2", n)
	}
}

func TestPolicyCacheBudget(t *testing.T) {
	t.Parallel()
	pc := newPolicyCache(1) // smaller than any policy: only the newest is kept
	for i := range 5 {
		raw := []byte(fmt.Sprintf(`{"variants":{"v%d":{}}}`, i))
		if _, err := pc.get(context.Background(), fmt.Sprint("t", i), raw); err != nil {
			t.Fatal(err)
		}
	}
	n, _, shed := pc.stats()
	if n != 1 || shed != 4 {
		t.Errorf("kept %d, shed %d; want 1 and 4", n, shed)
	}
}

// A session that keeps sending new policies gets them compiled only so
// often: compile work per session is bounded.
func TestPolicyCompileQuota(t *testing.T) {
	t.Parallel()
	pc := newPolicyCache(0)
	var err error
	n := 0
	for i := range 20 {
		raw := []byte(fmt.Sprintf(`{"variants":{"v%d":{}}}`, i))
		if _, err = pc.get(context.Background(), "t", raw); err != nil {
			break
		}
		n++
	}
	if n != compileBurst || !errors.Is(err, errCompileQuota) {
		t.Errorf("compiled %d new policies, then %v; want %d then errCompileQuota", n, err, compileBurst)
	}
	// another session is not affected, nor a policy already compiled
	if _, err := pc.get(context.Background(), "u", []byte(`{"variants":{"v0":{}}}`)); err != nil {
		t.Errorf("cached policy for another tab: %v", err)
	}
}
