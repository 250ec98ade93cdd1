package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// config is one way of starting `lapd serve`.
type config struct {
	Name  string   `json:"name"`
	Flags []string `json:"flags"` // besides the benchmark's own (address, data dir, rate limits)
	// Cluster configurations: three `lapd serve --nats` nodes on one
	// nats-server (started by lapbench), each with these flags. The tab
	// pairs with node A; Cross sends the agents' calls to node B.
	Nodes int  `json:"nodes,omitempty"`
	Cross bool `json:"cross,omitempty"`
}

// configs are the configurations users pick. "default" is `lapd serve` with
// no flags: the SQLite token store, audit to stdout and to SQLite.
var configs = map[string]config{
	"default":       {"default", nil, 0, false},
	"memory-none":   {"memory-none", []string{"--store", "memory", "--audit", "none"}, 0, false},
	"memory-file":   {"memory-file", []string{"--store", "memory", "--audit", "file:@DATA/audit.jsonl"}, 0, false},
	"memory-stdout": {"memory-stdout", []string{"--store", "memory"}, 0, false},
	"sqlite-none":   {"sqlite-none", []string{"--audit", "none"}, 0, false},
	"sqlite-sqlite": {"sqlite-sqlite", []string{"--audit", "sqlite"}, 0, false},
	"sqlite-file":   {"sqlite-file", []string{"--audit", "file:@DATA/audit.jsonl"}, 0, false},
	// The admin listener (metrics on the hot path, issue #11) against
	// default, and default again: an A/A pair that shows the noise alone.
	"default-admin": {"default-admin", []string{"--admin-addr", "127.0.0.1:0"}, 0, false},
	"default-again": {"default-again", nil, 0, false},
	// Scale-out (issue #12): default flags plus --nats, three nodes sharing
	// this machine. nats-local: the agents call the tab's node (A);
	// nats-cross: they call node B, which forwards to A over NATS.
	"nats-local": {"nats-local", nil, 3, false},
	"nats-cross": {"nats-cross", nil, 3, true},
	// nats-cross with the peer link in TLS, as between machines (on one
	// machine the default link is plain TCP).
	"nats-cross-tls": {"nats-cross-tls", []string{"--peer-tls", "on"}, 3, true},
	// /agent/mcp without its tools/call fast path (mcp-go answers every
	// request), against default in the same run.
	"default-nofast": {"default-nofast", []string{"--mcp-fast-path=false"}, 0, false},
}

// proc is a running server process (lapd serve or the floor server).
type proc struct {
	URL     string
	cmd     *exec.Cmd
	dataDir string
	stderr  *tailBuffer
	lines   atomic.Int64 // lines the server wrote to stdout (JSONL audit entries)
	done    chan struct{}
	pprof   string // pprof base URL when started with --pprof
	config  string
	peers   []*proc // a cluster's other nodes (B, C)
	extra   []int   // other processes whose CPU counts as the server's (nats-server)
}

var listenRE = regexp.MustCompile(`listening on (http://[0-9.:\[\]]+)`) // lapd's line comes before the admin listener's
var pprofRE = regexp.MustCompile(`pprof on (http://[0-9.:\[\]]+)`)

// startLapd runs `lapd serve` with cfg's flags on a free loopback port and a
// fresh data dir, and waits until it listens. Its stdout (the JSONL audit
// stream of the default configuration) is read and counted, as a terminal
// or journald would read it.
func startLapd(bin string, cfg config, pprofOn bool) (*proc, error) {
	dir, err := os.MkdirTemp("", "lapbench-")
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir,
		// A load test would hit the per-token and per-IP rate limits at once.
		"--lap-rate", "1000000000", "--mint-rate", "1000000000"}
	for _, f := range cfg.Flags {
		args = append(args, strings.ReplaceAll(f, "@DATA", dir))
	}
	if pprofOn {
		args = append(args, "--pprof", "127.0.0.1:0")
	}
	p, err := startProc(bin, args, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.config = cfg.Name
	return p, nil
}

func startProc(bin string, args []string, dataDir string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LAPD_ADDR=", "LAPD_DATA_DIR=")
	p := &proc{cmd: cmd, dataDir: dataDir, stderr: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	urlc := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := stdout.Read(buf)
			p.lines.Add(int64(bytes.Count(buf[:n], []byte{'\n'})))
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(io.TeeReader(stderr, p.stderr))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := pprofRE.FindStringSubmatch(sc.Text()); m != nil {
				p.pprof = m[1]
			}
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case urlc <- m[1]:
				default:
				}
			}
		}
	}()
	go func() { wg.Wait(); _ = cmd.Wait(); close(p.done) }()
	select {
	case p.URL = <-urlc:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before listening:\n%s", bin, p.stderr.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("%s did not listen within 30s:\n%s", bin, p.stderr.String())
	}
}

// stop sends SIGINT, waits for a graceful exit and removes the data dir
// (the peers' too).
func (p *proc) stop() error {
	for _, q := range p.peers {
		defer func() { _ = q.stop() }()
	}
	defer func() {
		if p.dataDir != "" {
			os.RemoveAll(p.dataDir)
		}
	}()
	select {
	case <-p.done:
		return fmt.Errorf("server had exited:\n%s", p.stderr.String())
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("server did not stop within 30s")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("server exited with %d:\n%s", code, p.stderr.String())
	}
	return nil
}

// auditLines is how many lines the server (and its cluster peers) wrote
// to stdout.
// settledAuditLines waits (up to 3 s) until the audit line count stops
// moving for a few of the audit writer's batch lingers, then returns it: the
// writer is asynchronous, so lines of calls already answered may still be
// on their way.
func (p *proc) settledAuditLines() int64 {
	n := p.auditLines()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		time.Sleep(80 * time.Millisecond)
		m := p.auditLines()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

func (p *proc) auditLines() int64 {
	n := p.lines.Load()
	for _, q := range p.peers {
		n += q.lines.Load()
	}
	return n
}

// cpu is utime+stime of the process (all threads), plus its cluster
// peers' and the nats-server's.
func (p *proc) cpu() (time.Duration, error) {
	d, err := cpuOf(strconv.Itoa(p.cmd.Process.Pid))
	for _, q := range p.peers {
		c, qerr := q.cpu()
		d += c
		err = errors.Join(err, qerr)
	}
	for _, pid := range p.extra {
		c, xerr := cpuOf(strconv.Itoa(pid))
		d += c
		err = errors.Join(err, xerr)
	}
	return d, err
}

// cpuParts is cpu split by process: the node itself, each peer (B, C),
// then each extra process (the nats-server).
func (p *proc) cpuParts() []time.Duration {
	d, _ := cpuOf(strconv.Itoa(p.cmd.Process.Pid))
	out := []time.Duration{d}
	for _, q := range p.peers {
		c, _ := cpuOf(strconv.Itoa(q.cmd.Process.Pid))
		out = append(out, c)
	}
	for _, pid := range p.extra {
		c, _ := cpuOf(strconv.Itoa(pid))
		out = append(out, c)
	}
	return out
}

// cpuOf reads utime+stime of /proc/<pid> ("self" for lapbench itself).
func cpuOf(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the whole line.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// rss is the resident set size in bytes.
func (p *proc) rss() (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// mint is POST /agent/mint.
type mintResp struct {
	Token     string `json:"token"`
	TabSecret string `json:"tabSecret"`
	TID       string `json:"tid"`
	WSURL     string `json:"wsUrl"`
	LapURL    string `json:"lapUrl"`
}

func mint(ctx context.Context, hc *http.Client, base string) (mintResp, error) {
	var m mintResp
	// As lapd.js mints: with a tab secret, which only the tab holds.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/agent/mint", strings.NewReader(`{"tab":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("mint: %w %d: %s", errStatus, resp.StatusCode, b)
	}
	return m, json.Unmarshal(b, &m)
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// buildLapd builds ./cmd/lapd (without -race) into dir and returns the path.
func buildLapd(dir string) (string, error) {
	out := filepath.Join(dir, "lapd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/lapd")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building lapd (run lapbench from the repository root): %w", err)
	}
	return out, nil
}

// mallocs reads the server's count of heap objects allocated since it
// started (runtime.MemStats.Mallocs, from heap?debug=1); 0 without a
// profiler listener.
func (p *proc) mallocs(ctx context.Context) uint64 {
	if p.pprof == "" {
		return 0
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.pprof+"/debug/pprof/heap?debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := mallocsRE.FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return n
}

var mallocsRE = regexp.MustCompile(`(?m)^# Mallocs = ([0-9]+)$`)

// rssAfterGC triggers a GC through the profiler listener (heap?gc=1),
// gives the runtime two seconds to return memory and reads RSS; without a
// listener it reads RSS as it is.
func (p *proc) rssAfterGC(ctx context.Context) int64 {
	if p.pprof != "" {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.pprof+"/debug/pprof/heap?gc=1", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
	}
	r, _ := p.rss()
	return r
}

// heapProfile saves the in-use heap (after a GC) and the goroutine
// profile of the server.
func (p *proc) heapProfile(ctx context.Context, dir, name string) error {
	if p.pprof == "" {
		return errors.New("server has no pprof listener")
	}
	for _, x := range []struct{ path, file string }{{"/debug/pprof/heap?gc=1", name + ".heap.pprof"},
		{"/debug/pprof/goroutine", name + ".goroutine.pprof"}, {"/debug/pprof/heap?debug=1", name + ".memstats.txt"}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.pprof+x.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(dir, x.file))
		if err != nil {
			resp.Body.Close()
			return err
		}
		_, err = io.Copy(f, resp.Body)
		resp.Body.Close()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// profile fetches a CPU profile (seconds long) and an allocs profile from
// the server's pprof listener into dir.
func (p *proc) profile(ctx context.Context, dir, name string, seconds int) error {
	if p.pprof == "" {
		return errors.New("server has no pprof listener")
	}
	get := func(path, file string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.pprof+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(f, resp.Body)
		return err
	}
	if err := get("/debug/pprof/profile?seconds="+strconv.Itoa(seconds), name+".cpu.pprof"); err != nil {
		return err
	}
	return get("/debug/pprof/allocs", name+".allocs.pprof")
}
