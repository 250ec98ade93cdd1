package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// TestShutdownUnderLoadLosesNoAuditEntry drives `lapd serve` with its
// default audit sinks (stdout and SQLite) with 16 concurrent agents and a
// 60-second /wait, and sends SIGTERM in the middle:
//
//   - the /wait ends at once with 503 shutting-down (it used to hold the
//     whole shutdown timeout, after which the sinks were closed under the
//     running handlers and entries were lost);
//   - lapd exits 0 well within --shutdown-timeout;
//   - every call that got a 200 has exactly one lap-call entry, both in
//     the SQLite audit and on stdout, and the /wait's refusal is there too.
func TestShutdownUnderLoadLosesNoAuditEntry(t *testing.T) {
	s := startServer(t, "", "--lap-rate", mcpNoRateLimit, "--shutdown-timeout", "8s", "--log-level", "info")
	tab, m := mcpTab(t, s)
	ctx := ctxT(t, time.Minute)

	waitDone := make(chan int, 1)
	go func() {
		status, _ := lapPost(ctx, m, "/wait", `{"timeoutMs":60000}`)
		waitDone <- status
	}()
	if _, err := tab.WaitFor(ctx, "watch"); err != nil { // the long poll is in flight
		t.Fatal(err)
	}

	var ok, refused atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				status, err := lapPost(ctx, m, "/observe", "")
				switch {
				case err != nil: // the listener closed: lapd is gone
					return
				case status == 200:
					ok.Add(1)
				case status == 503:
					refused.Add(1)
				default:
					t.Errorf("status %d", status)
					return
				}
			}
		})
	}
	for ok.Load() < 200 {
		time.Sleep(10 * time.Millisecond) // let the load build up; not synchronisation
	}
	sigAt := time.Now()
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case status := <-waitDone:
		if status != 503 {
			t.Errorf("the /wait in flight answered %d, want 503 shutting-down", status)
		}
		if d := time.Since(sigAt); d > 4*time.Second {
			t.Errorf("the /wait took %v after SIGTERM", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the /wait did not end on shutdown")
	}
	<-s.done
	close(stop)
	wg.Wait()
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("lapd exited %d:\n%s", code, s.stderr.String())
	}
	if d := time.Since(sigAt); d > 8*time.Second {
		t.Errorf("shutdown took %v, over --shutdown-timeout", d)
	}

	// stdout (JSONL): one lap-call per 200.
	var stdoutCalls, stdoutWaitRefusals int
	for _, line := range strings.Split(s.audit.String(), "\n") {
		var e struct {
			Event  string
			Detail map[string]any
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		if e.Event == "lap-call" && e.Detail["tool"] == "observe" {
			stdoutCalls++
		}
		if e.Event == "refused" && e.Detail["endpoint"] == "/agent/lap/v1/wait" && e.Detail["code"] == "shutting-down" {
			stdoutWaitRefusals++
		}
	}
	// SQLite, read back with `lapd audit` after the process is gone.
	out := &bytes.Buffer{}
	cmd := exec.Command(lapdBin, "audit", "--data-dir", s.DataDir, "--event", "lap-call", "--limit", "0", "--format", "json")
	cmd.Stdout, cmd.Stderr = out, io.Discard
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dbCalls := 0
	for _, line := range strings.Split(out.String(), "\n") {
		var e struct{ Detail map[string]any }
		if json.Unmarshal([]byte(line), &e) == nil && e.Detail["tool"] == "observe" {
			dbCalls++
		}
	}
	t.Logf("%d calls answered 200, %d refused with 503 during shutdown; lap-call entries: %d on stdout, %d in SQLite",
		ok.Load(), refused.Load(), stdoutCalls, dbCalls)
	if int64(stdoutCalls) != ok.Load() || int64(dbCalls) != ok.Load() {
		t.Errorf("%d calls answered 200 but %d lap-call entries on stdout and %d in SQLite", ok.Load(), stdoutCalls, dbCalls)
	}
	if stdoutWaitRefusals != 1 {
		t.Errorf("the /wait's shutting-down refusal is audited %d times on stdout, want 1", stdoutWaitRefusals)
	}
}

// lapPost POSTs a LAP call with m's bearer and returns the status.
func lapPost(ctx context.Context, m mintResp, route, body string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.LapURL+route, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+m.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestSecondSignalStopsAtOnce: a second SIGTERM while lapd waits for an
// in-flight call (here one the tab never answers, with a 10-minute
// --shutdown-timeout) stops it at once: it used to be swallowed, and only
// SIGKILL, which loses the queued audit entries, ended the wait. lapd exits
// 1, says so in the log, and the audit entries recorded before are in
// SQLite.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	s := startServer(t, "", "--lap-rate", mcpNoRateLimit, "--shutdown-timeout", "10m", "--log-level", "info")
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	tab, m := mcpTab(t, s, lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		entered <- struct{}{}
		<-release
		return nil, &lapdtest.RPCError{Code: "internal"}
	}))
	ctx := ctxT(t, 2*time.Minute)
	if status, err := lapPost(ctx, m, "/observe", ""); err != nil || status != 200 {
		t.Fatalf("observe: %d %v", status, err)
	}
	go lapPost(ctx, m, "/message", `{"msg":{"type":"inc"}}`) // never answered by the tab
	<-entered
	waitDone := make(chan int, 1)
	go func() {
		status, _ := lapPost(ctx, m, "/wait", `{"timeoutMs":60000}`)
		waitDone <- status
	}()
	if _, err := tab.WaitFor(ctx, "watch"); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if status := <-waitDone; status != 503 { // lapd drains: now it waits for the /message
		t.Fatalf("the /wait answered %d at the first signal, want 503", status)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		t.Fatalf("lapd still waits for its in-flight call after a second SIGTERM:\n%s", s.stderr.String())
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code %d after a second signal, want 1", code)
	}
	if !strings.Contains(s.stderr.String(), "second signal") {
		t.Errorf("the log does not say why lapd stopped early:\n%s", s.stderr.String())
	}
	out := &bytes.Buffer{}
	cmd := exec.Command(lapdBin, "audit", "--data-dir", s.DataDir, "--event", "lap-call,refused", "--limit", "0", "--format", "json")
	cmd.Stdout, cmd.Stderr = out, io.Discard
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if a := out.String(); !strings.Contains(a, `"tool":"observe"`) || !strings.Contains(a, `"endpoint":"/agent/lap/v1/wait"`) {
		t.Errorf("audit after a second signal lacks the observe call or the /wait's refusal:\n%s", a)
	}
}

// TestHangupStopsGracefully: SIGHUP (the terminal of a `lapd serve` closed,
// an ssh session that ends) killed lapd at once by Go's default: no
// "stopped", in-flight calls cut, the queued audit entries lost. It now
// stops as SIGTERM does.
func TestHangupStopsGracefully(t *testing.T) {
	s := startServer(t, "", "--log-level", "info")
	_, m := mcpTab(t, s)
	ctx := ctxT(t, time.Minute)
	for range 20 {
		if status, err := lapPost(ctx, m, "/observe", ""); err != nil || status != 200 {
			t.Fatalf("observe: %d %v", status, err)
		}
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	<-s.done
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGHUP (%v), want 0", code, s.cmd.ProcessState)
	}
	if !strings.Contains(s.stderr.String(), "msg=stopped") {
		t.Errorf("no graceful stop in the log:\n%s", s.stderr.String())
	}
	out := &bytes.Buffer{}
	cmd := exec.Command(lapdBin, "audit", "--data-dir", s.DataDir, "--event", "lap-call", "--limit", "0", "--format", "json")
	cmd.Stdout, cmd.Stderr = out, io.Discard
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), `"tool":"observe"`); n != 20 {
		t.Errorf("%d observe calls audited after SIGHUP, want 20", n)
	}
}

// TestBrokenStdoutDoesNotKill: the audit goes to stdout by default. When
// whatever reads it goes away (`lapd serve | head`, a log shipper that
// dies), Go's default for a write to a broken pipe on stdout killed lapd
// with SIGPIPE at the next audit entry, silently. Now the stdout sink fails
// like any sink (counted, logged, /readyz not ready) and lapd serves on.
func TestBrokenStdoutDoesNotKill(t *testing.T) {
	dir := t.TempDir()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(lapdBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir, "--log-level", "info")
	cmd.Stdout = pw
	s := launchCmd(t, cmd, dir)
	pw.Close()
	pr.Close() // nobody reads lapd's stdout any more
	s.awaitListening(t)
	ctx := ctxT(t, time.Minute)
	m := s.mint(t) // an audit entry, written to the broken stdout
	for {
		if status, err := lapPost(ctx, m, "/observe", ""); err != nil {
			t.Fatalf("lapd is gone after writing to a broken stdout (%v):\n%s", err, s.stderr.String())
		} else if status != 503 { // paused: no tab
			t.Fatalf("observe: %d", status)
		}
		res, err := http.Get(s.URL + "/readyz")
		if err != nil {
			t.Fatalf("lapd is gone after writing to a broken stdout (%v):\n%s", err, s.stderr.String())
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), `"name":"audit","ok":false`) {
			break // the stdout sink's failure is seen; lapd still answers
		}
		if ctx.Err() != nil {
			t.Fatalf("the broken stdout never showed in /readyz: %s", b)
		}
	}
	if !strings.Contains(s.stderr.String(), "sink write failed") {
		t.Errorf("the log does not name the failing sink:\n%s", s.stderr.String())
	}
}

// TestLowOpenFileLimitIsWarned: under a low open-file limit, tabs (whose
// WebSockets --max-conns does not count) took every descriptor and nothing
// could connect any more, /healthz included, with only "accept4: too many
// open files" in the log. lapd now says so when it starts.
func TestLowOpenFileLimitIsWarned(t *testing.T) {
	dir := t.TempDir()
	s := launchCmd(t, exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" serve --addr 127.0.0.1:0 --data-dir "$1"`, lapdBin, dir), dir)
	s.awaitListening(t) // the warning comes before the "listening" line
	if !strings.Contains(s.stderr.String(), "the open-file limit is low") || !strings.Contains(s.stderr.String(), "limit=256") {
		t.Errorf("no warning of the open-file limit at start:\n%s", s.stderr.String())
	}
}
