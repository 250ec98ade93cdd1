package lapd_test

import (
	"bufio"
	"context"
	"errors"
	"github.com/lapd-dev/lapd/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lapdtest"
)

// keepAlive opens a connection, makes one request on it and leaves it
// open (idle keep-alive), returning it and the response's status and body.
func keepAlive(t *testing.T, addr string) (net.Conn, int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return c, res.StatusCode, string(b)
}

func waitOpen(t *testing.T, a *lapd.Server, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _, _ := a.OpenConns()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("open connections %d, want %d", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// One client may keep MaxConnsPerClient HTTP connections open. Past it, a
// new connection closes the client's connection idle the longest; when all
// of them are serving a request, the new one is answered 503
// too-many-connections at once and closed (audited). Upgraded WebSockets
// do not count.
func TestConnectionsPerClient(t *testing.T) {
	t.Parallel()
	s := &sink{}
	cfg := lapd.Config{AllowAnonymous: true, MaxConnsPerClient: 3, AuditSinks: []audit.Sink{s}}
	cfg.Admin.Enabled = true
	a, err := lapd.New(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.log = a.Audit()
	// /test-busy is a request that runs until the test releases it.
	started, release := make(chan struct{}, 3), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/", a.Handler())
	mux.HandleFunc("/test-busy", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = a.ConnState
	srv.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		srv.Close()
	})
	addr := srv.Listener.Addr().String()
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the server's Close (cleanups run last first)

	// Three idle keep-alive connections, then a fourth: it is served, and
	// the one idle the longest is closed by lapd.
	var idle []net.Conn
	for range 3 {
		c, st, _ := keepAlive(t, addr)
		if st != 200 {
			t.Fatalf("connection within the cap: %d", st)
		}
		idle = append(idle, c)
	}
	if _, st, _ := keepAlive(t, addr); st != 200 {
		t.Fatalf("fourth connection with three idle: %d, want it served", st)
	}
	if n, refused, reaped := a.OpenConns(); n != 3 || refused != 0 || reaped != 1 {
		t.Fatalf("open %d refused %d reaped %d, want 3, 0, 1", n, refused, reaped)
	}
	// One of the three was closed by lapd (which one went idle first is
	// up to the server's goroutines): it reads EOF at once, the others
	// have nothing to read.
	closed := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			closed++
		}
		c.Close()
	}
	if closed != 1 {
		t.Fatalf("%d of the idle connections were closed by lapd, want 1", closed)
	}
	waitOpen(t, a, 1)

	// Three connections each serving a request: the next is refused.
	var busy []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /test-busy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-started
		busy = append(busy, c)
	}
	_, st, body := keepAlive(t, addr)
	if st != http.StatusServiceUnavailable || !strings.Contains(body, `"too-many-connections"`) || !strings.Contains(body, "--max-conns-per-client") {
		t.Fatalf("connection past the cap, all busy: %d %s, want 503 too-many-connections saying what to do", st, body)
	}
	if es := s.find(func(e audit.Entry) bool {
		return e.Event == audit.EventRefused && e.Detail["code"] == "too-many-connections"
	}); len(es) == 0 {
		t.Fatal("refusal not audited")
	}
	adm := httptest.NewServer(a.AdminHandler()) // (no ConnState: not counted)
	defer adm.Close()
	fams, _ := scrape(t, adm.URL, "")
	_, refused, reaped := a.OpenConns()
	if value(fams, "lapd_http_connections") != 3 || value(fams, "lapd_http_connections_closed_total", "reason", "refused") != float64(refused) ||
		value(fams, "lapd_http_connections_closed_total", "reason", "made-room") != float64(reaped) || reaped != 2 {
		t.Fatalf("metrics: open %v refused %v made-room %v (reaped %d)", value(fams, "lapd_http_connections"),
			value(fams, "lapd_http_connections_closed_total", "reason", "refused"), value(fams, "lapd_http_connections_closed_total", "reason", "made-room"), reaped)
	}
	free()
	for _, c := range busy {
		c.Close()
	}
	waitOpen(t, a, 0)

	// Tabs: mint without keep-alive, then upgrade; three paired tabs hold
	// no HTTP slot.
	_, _, reapedBefore := a.OpenConns()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		res, err := hc.Post(srv.URL+"/agent/mint", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		tok := between(string(b), `"token":"`, `"`)
		tab, err := lapdtest.Dial(ctxT(t), srv.URL+"/agent/ws", tok)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tab.Close() })
	}
	waitOpen(t, a, 0)
	for range 3 {
		if _, st, _ := keepAlive(t, addr); st != 200 {
			t.Fatalf("with three tabs paired: %d", st)
		}
	}
	if _, refused, reaped := a.OpenConns(); reaped != reapedBefore {
		t.Fatalf("reaped %d (refused %d) with three tabs paired and three connections: the tabs count", reaped, refused)
	}
}

func between(s, from, to string) string {
	_, after, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(after, to)
	return v
}

// A data directory that was there before, open to other users, is kept as
// it is and named in a warning at start; one lapd creates is 0700.
func TestDataDirModeWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pre  bool
		warn bool
	}{{"existing 0755", true, true}, {"created", false, false}} {
		dir := filepath.Join(t.TempDir(), "data")
		if tc.pre {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(dir, 0o755) // whatever the umask
		}
		var buf syncbuf.Buffer
		a, err := lapd.New(ctxT(t), lapd.Config{DataDir: dir, Store: "sqlite", Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		_ = a.Shutdown(ctxT(t))
		if got := strings.Contains(buf.String(), "open to other users"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v: %s", tc.name, got, tc.warn, buf.String())
		}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]os.FileMode{true: 0o755, false: 0o700}[tc.pre]; fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", tc.name, fi.Mode().Perm(), want)
		}
	}
}
