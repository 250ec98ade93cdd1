package lap

import (
	"context"
	"net/http"
	"testing"
	"time"
)

func TestIdempotency(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	im := newIdempotency(time.Minute, 2, func() time.Time { return now })
	ctx := context.Background()
	runs := 0
	ok := func(v string) func() (any, *apiError) {
		return func() (any, *apiError) { runs++; return v, nil }
	}
	fail := func() (any, *apiError) { runs++; return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "") }

	if v, _ := im.do(ctx, "t", "a", ok("1")); v != "1" {
		t.Fatal(v)
	}
	if v, _ := im.do(ctx, "t", "a", ok("2")); v != "1" || runs != 1 {
		t.Errorf("repeat ran again: %v runs=%d", v, runs)
	}
	if v, _ := im.do(ctx, "u", "a", ok("3")); v != "3" {
		t.Errorf("keys are per tid: %v", v)
	}
	// a failure is not remembered
	if _, e := im.do(ctx, "t", "f", fail); e == nil {
		t.Fatal("want error")
	}
	if v, _ := im.do(ctx, "t", "f", ok("4")); v != "4" {
		t.Errorf("after failure: %v", v)
	}
	// per-tid cap evicts the oldest finished key
	if v, _ := im.do(ctx, "t", "g", ok("5")); v != "5" {
		t.Errorf("over cap: %v", v)
	}
	if len(im.m["t"]) > 2 {
		t.Errorf("%d keys kept", len(im.m["t"]))
	}
	// expiry
	now = now.Add(2 * time.Minute)
	if v, _ := im.do(ctx, "u", "a", ok("6")); v != "6" {
		t.Errorf("after ttl: %v", v)
	}
	im.drop("t")
	im.drop("u")
	if im.total != 0 {
		t.Errorf("total = %d after drop", im.total)
	}
}
