// Package e2e tests lapd from the outside: the real binary (`lapd serve`,
// `lapd mcp`), real HTTP and WebSocket, a real SQLite file, mcp-go's real
// client, the MCP conformance suite and a real headless Chromium.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var lapdBin string // built once in TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lapd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lapdBin = filepath.Join(dir, "lapd")
	build := exec.Command("go", "build", "-race", "-o", lapdBin, "../cmd/lapd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building lapd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// inCI reports whether tests run under CI, where nothing may skip.
func inCI() bool { return os.Getenv("CI") == "true" }

// needTool skips (or, under CI, fails) when a tool is missing.
func needTool(t *testing.T, what, path string) {
	t.Helper()
	if path != "" {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	if inCI() {
		t.Fatalf("%s is required under CI (CI=true) but was not found (%q); .ci/run installs it", what, path)
	}
	t.Skipf("%s not found (%q); skipping (CI installs it)", what, path)
}

// server is a running `lapd serve`.
type server struct {
	URL     string // http://127.0.0.1:PORT
	DataDir string
	cmd     *exec.Cmd
	stderr  *syncBuffer
	audit   *syncBuffer
	done    chan struct{}
	urlc    chan string // the URL, once it listens
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenRE = regexp.MustCompile(`listening on (http://[0-9.:]+)`)

// startServer runs `lapd serve` on a free loopback port with a data dir
// (reused when dataDir != "") and waits until it listens.
func startServer(t *testing.T, dataDir string, extra ...string) *server {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	args := append([]string{"--addr", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "debug"}, extra...)
	return runServer(t, lapdBin, dataDir, args...)
}

// runServer runs `bin serve args…` (args must name a port and keep the log
// level at info or below: the "listening on" line gives the URL), waits until
// it listens and stops it gracefully on cleanup.
func runServer(tb testing.TB, bin, dataDir string, args ...string) *server {
	tb.Helper()
	s := launchServer(tb, bin, dataDir, args...)
	s.awaitListening(tb)
	return s
}

// launchServer starts `bin serve args…` and returns at once (several nodes
// start together as an operator's shell loop starts them); awaitListening
// waits for it. It is stopped gracefully on cleanup.
func launchServer(tb testing.TB, bin, dataDir string, args ...string) *server {
	tb.Helper()
	return launchCmd(tb, exec.Command(bin, append([]string{"serve"}, args...)...), dataDir)
}

// launchCmd is launchServer for a command made by the caller (`ip netns
// exec NS lapd serve …`, which runs lapd itself in the namespace).
func launchCmd(tb testing.TB, cmd *exec.Cmd, dataDir string) *server {
	tb.Helper()
	cmd.Env = append(os.Environ(), "LAPD_ADDR=", "LAPD_DATA_DIR=")
	s := &server{DataDir: dataDir, cmd: cmd, stderr: &syncBuffer{}, audit: &syncBuffer{}, done: make(chan struct{}), urlc: make(chan string, 1)}
	if cmd.Stdout == nil { // a test may give lapd a stdout of its own
		cmd.Stdout = s.audit
	}
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(s.stderr, pw)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case s.urlc <- m[1]:
				default:
				}
			}
		}
	}()
	go func() { cmd.Wait(); pw.Close(); close(s.done) }()
	tb.Cleanup(func() { s.stop(tb) })
	return s
}

// awaitListening waits until a launched server listens and sets its URL.
func (s *server) awaitListening(tb testing.TB) {
	tb.Helper()
	select {
	case s.URL = <-s.urlc:
	case <-s.done:
		tb.Fatalf("lapd serve exited before listening:\n%s", s.stderr.String())
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		tb.Fatalf("lapd serve did not listen within 20s:\n%s", s.stderr.String())
	}
}

// stop sends SIGTERM and waits for a graceful exit.
func (s *server) stop(t testing.TB) {
	t.Helper()
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		t.Errorf("lapd serve did not shut down within 15s:\n%s", s.stderr.String())
	}
}

// mintResp is the body of POST /agent/mint.
type mintResp struct {
	Token     string `json:"token"`
	TID       string `json:"tid"`
	WSURL     string `json:"wsUrl"`
	LapURL    string `json:"lapUrl"`
	ExpiresAt int64  `json:"expiresAt"`
}

func (s *server) mint(t *testing.T) mintResp {
	t.Helper()
	var m mintResp
	status := s.postJSON(t, "/agent/mint", "", nil, &m)
	if status != 200 {
		t.Fatalf("mint: status %d", status)
	}
	return m
}

// postJSON POSTs body to path (with a bearer when token != "") and decodes
// the response into out (when non-nil). It returns the status.
func (s *server) postJSON(t *testing.T, path, token string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest("POST", s.URL+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("POST %s: decoding %q: %v", path, raw, err)
		}
	}
	return resp.StatusCode
}

// auditLines returns the JSONL audit entries written to stdout so far.
func (s *server) auditEvents() []string {
	var ev []string
	for _, line := range strings.Split(s.audit.String(), "\n") {
		var e struct{ Event string }
		if json.Unmarshal([]byte(line), &e) == nil && e.Event != "" {
			ev = append(ev, e.Event)
		}
	}
	return ev
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
