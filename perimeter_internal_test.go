package lapd

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A drain does not wait for bodies that are still trickling in: Shutdown cuts
// them at once, so a handful of slow clients cannot spend the shutdown budget.
func TestShutdownCutsTrickledBodies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(ctx, Config{AllowAnonymous: true, BodyReadTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /agent/mint HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	for s.perim.readingCount() == 0 { // the handler is now reading the body
		select {
		case <-ctx.Done():
			t.Fatal("the trickled request never reached the handler")
		case <-time.After(time.Millisecond):
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown waited for a trickled body: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	res.Body.Close()
	if res.StatusCode < 400 {
		t.Errorf("trickled mint answered %d", res.StatusCode)
	}
}

// readingCount is how many request bodies are still arriving.
func (p *perimeter) readingCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reading)
}
