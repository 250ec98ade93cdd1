package lap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every test of this package runs with released bodies overwritten, so a
// body read after its Release reads 0xff bytes (and, under -race, races
// with the write).
func init() { poisonReleased = true }

// echoServer answers each route with a body made from the route: /ok/<s>
// with 200 and {"echo":"<s>…"} (n repeats of <s>), /err with a LAP error
// envelope.
func echoServer(n int) *InProcessClient {
	srv := &Server{handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/err" {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"code":"rate-limited","detail":"slow down","reconnect":"pending"}}`))
			return
		}
		s := strings.TrimPrefix(r.URL.Path, "/ok/")
		_, _ = fmt.Fprintf(w, `{"echo":%q}`, strings.Repeat(s, n))
	})}
	return srv.Client()
}

func TestCallLentAnswersAsCall(t *testing.T) {
	t.Parallel()
	c := echoServer(100)
	ctx := context.Background()
	want, err := c.Call(ctx, "", "agt_x", "/ok/abc", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, lease, err := c.CallLent(ctx, "", "agt_x", "/ok/abc", nil)
	if err != nil || lease == nil || !bytes.Equal(got, want) {
		t.Fatalf("CallLent = %.40s, %v, %v; Call = %.40s", got, lease, err, want)
	}
	held := got[:8]
	lease.Release()
	// The lent bytes are the buffer that went back: poisoned now.
	if !bytes.Equal(held, bytes.Repeat([]byte{0xff}, 8)) {
		t.Fatalf("released body still reads %q: not the pooled buffer", held)
	}
	if string(want[:8]) != `{"echo":` {
		t.Fatalf("Call's body changed after another call's release: %q", want[:8])
	}
}

// TestCallLentErrorHoldsNoBuffer: on error the buffer goes back at once
// (poisoned here), and the *Error reads as Call's.
func TestCallLentErrorHoldsNoBuffer(t *testing.T) {
	t.Parallel()
	c := echoServer(1)
	_, want := c.Call(context.Background(), "", "agt_x", "/err", nil)
	raw, lease, err := c.CallLent(context.Background(), "", "agt_x", "/err", nil)
	if raw != nil || lease != nil {
		t.Fatalf("error call lent %q, %v", raw, lease)
	}
	var le, we *Error
	if !errors.As(err, &le) || !errors.As(want, &we) || *le != *we {
		t.Fatalf("CallLent error %#v, Call's %#v", err, want)
	}
	if le.Code != "rate-limited" || le.Detail != "slow down" || le.Reconnect != "pending" || le.RetryAfter != 3*time.Second {
		t.Fatalf("error after release: %#v", le)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if raw, lease, err := c.CallLent(cctx, "", "agt_x", "/ok/a", nil); err == nil || raw != nil || lease != nil {
		t.Fatalf("cancelled: %q %v %v", raw, lease, err)
	}
}

// TestCallLentPoolCap: a buffer beyond maxPooledBody is not kept.
func TestCallLentPoolCap(t *testing.T) {
	t.Parallel()
	small := getMemWriter()
	_, _ = small.Write(make([]byte, 16<<10))
	if !small.release() {
		t.Error("a 16 KiB buffer was not pooled")
	}
	big := getMemWriter()
	_, _ = big.Write(make([]byte, maxPooledBody+1))
	if big.release() {
		t.Errorf("a %d-byte buffer was pooled", big.buf.Cap())
	}
}

// TestCallLentConcurrent: concurrent callers each read their own body, and
// never a buffer someone else still holds or has released (-race).
func TestCallLentConcurrent(t *testing.T) {
	t.Parallel()
	c := echoServer(500)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				s := fmt.Sprintf("g%di%d-", g, i)
				raw, lease, err := c.CallLent(context.Background(), "", "agt_x", "/ok/"+s, nil)
				if err != nil {
					t.Error(err)
					return
				}
				want := fmt.Sprintf(`{"echo":%q}`, strings.Repeat(s, 500))
				if string(raw) != want {
					t.Errorf("goroutine %d call %d read %.60q…", g, i, raw)
				}
				lease.Release()
			}
		})
	}
	wg.Wait()
}
