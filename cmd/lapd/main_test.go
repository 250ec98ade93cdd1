package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestServeFlagsEnvAndFlags(t *testing.T) {
	t.Parallel()
	env := envMap(map[string]string{"LAPD_ADDR": "127.0.0.1:9999", "LAPD_GRACE": "2m", "LAPD_STORE": "memory"})
	c, err := parseServeFlags([]string{"--grace", "30s"}, io.Discard, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:9999" {
		t.Errorf("addr from env: got %q", c.Addr)
	}
	if c.Grace != 30*time.Second {
		t.Errorf("flag must win over env: grace %v", c.Grace)
	}
	if c.Store != "memory" {
		t.Errorf("store from env: got %q", c.Store)
	}
}

func TestServeFlagsRefuseBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--store", "redis"}, nil, "--store must be sqlite or memory"},
		{[]string{"--allow-anonymous", "maybe"}, nil, "--allow-anonymous must be"},
		{[]string{"--lap-rate", "0"}, nil, "must be positive"},
		{[]string{"--heartbeat", "1ns"}, nil, "--heartbeat 1ns: must be at least 1s"},
		{[]string{"--heartbeat", "0s"}, nil, "--heartbeat 0s: must be at least 1s"},
		{[]string{"--token-ttl", "-1h"}, nil, "--token-ttl -1h0m0s: must be positive"},
		{[]string{"--token-ttl", "0s"}, nil, "--token-ttl 0s: must be positive"},
		{[]string{"--grace", "0s"}, nil, "--grace 0s: must be positive"},
		{[]string{"--confirm-expiry", "-5m"}, nil, "--confirm-expiry -5m0s: must be positive"},
		{nil, map[string]string{"LAPD_SHUTDOWN_TIMEOUT": "0s"}, "--shutdown-timeout 0s: must be positive"},
		{[]string{"--sliding-ttl", "-1s"}, nil, "--sliding-ttl -1s: must be 0 (off)"},
		{[]string{"--trust-proxy", "-1"}, nil, "--trust-proxy -1: give the number of proxies"},
		{[]string{"--max-conns", "-7"}, nil, "-1 for no cap"},
		{[]string{"--max-conns-per-client", "-2"}, nil, "-1 for no cap"},
		{[]string{"--max-kept-mib", "99999999999999"}, nil, "--max-kept-mib 99999999999999 is more than any machine has"},
		{[]string{"--tools", "most"}, nil, "--tools must be core or all"},
		{nil, map[string]string{"LAPD_GRACE": "soon"}, "LAPD_GRACE"},
		{[]string{"extra"}, nil, "unexpected argument"},
		{[]string{"--nope"}, nil, "unknown flag --nope"},
		{[]string{"--port", "9000"}, nil, "unknown flag --port (did you mean --addr?)"},
		{[]string{"--adr", "x"}, nil, "did you mean --addr?"},
		{[]string{"--data", "x"}, nil, "did you mean --data-dir?"},
		{[]string{"--grace", "5"}, nil, `--grace "5": not a duration: use a duration like 60s (units ms, s, m, h; did you mean 5s?)`},
		{[]string{"--grace", "soon"}, nil, `--grace "soon": not a duration: use a duration like 60s`},
		{[]string{"--lap-rate", "lots"}, nil, `--lap-rate "lots": not a whole number`},
		{[]string{"--demo=maybe"}, nil, `--demo "maybe": want true or false`},
		{[]string{"--addr"}, nil, "--addr needs a value"},
		{[]string{"--addr", "8787"}, nil, `--addr "8787": want host:port`},
		{nil, map[string]string{"LAPD_GRACE": "5"}, `environment LAPD_GRACE="5": not a duration: use a duration like 60s`},
		{[]string{"--origins", "foo"}, nil, `--origins: "foo" is not an origin: it has no scheme`},
		{[]string{"--origins", "*"}, nil, `"*" is not an origin: wildcards are not allowed`},
		{[]string{"--origins", "a.example"}, nil, `"a.example" is not an origin: it has no scheme`},
		{[]string{"--origins", "a.example:8080"}, nil, `"a.example:8080" is not an origin: it has no scheme`},
		{[]string{"--origins", "http://a.example/path"}, nil, `"http://a.example/path" is not an origin: an origin has no path, query or fragment`},
		{[]string{"--origins", "https://ok.example,ftp://a.example"}, nil, `"ftp://a.example" is not an origin: the scheme must be http or https`},
		{[]string{"--origins", "http://*.example"}, nil, "wildcards"},
		{[]string{"--origins", "http://a.example:99999"}, nil, "port"},
		{[]string{"--public-url", "lapd.example.com"}, nil, `--public-url: "lapd.example.com" is not an origin: it has no scheme`},
		{[]string{"--public-url", "https://lapd.example.com/app"}, nil, `--public-url: "https://lapd.example.com/app" is not an origin: an origin has no path`},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--store", "memory"}, nil, "--store memory cannot be shared by a cluster"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-cert", "c.pem"}, nil, "--nats-cert and --nats-key go together"},
		{[]string{"--nats-creds", "x.creds"}, nil, "need --nats"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--cluster-name", "a.b"}, nil, `--cluster-name "a.b": use letters`},
		{nil, map[string]string{"LAPD_NATS_CA": "ca.pem"}, "need --nats"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-replicas", "0"}, nil, `--nats-replicas "0": want a number from 1 to 5`},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-replicas", "7"}, nil, `--nats-replicas "7": want a number from 1 to 5`},
		{nil, map[string]string{"LAPD_NATS": "nats://127.0.0.1:4222", "LAPD_NATS_REPLICAS": "three"}, `--nats-replicas "three"`},
		{[]string{"--nats-replicas", "3"}, nil, "--nats-replicas needs --nats"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--peer-listen", "7422"}, nil, `--peer-listen "7422": want host:port`},
		{[]string{"--peer-advertise", "10.0.0.5:7422"}, nil, "--peer-advertise needs --nats"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--peer-listen", ":7422"}, nil, "listens on every interface: say which address the other nodes dial with --peer-advertise"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--peer-listen", "off", "--peer-advertise", "10.0.0.5:7422"}, nil, "--peer-listen is off"},
		{nil, map[string]string{"LAPD_NATS": "nats://127.0.0.1:4222", "LAPD_PEER_ADVERTISE": "host"}, `--peer-advertise "host": want host:port`},
	} {
		_, err := parseServeFlags(tc.args, io.Discard, envMap(tc.env))
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want a usage error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestOriginsNormalised(t *testing.T) {
	t.Parallel()
	c, err := parseServeFlags([]string{"--origins", " HTTPS://App.Example.com:443/ ,http://localhost:3000,http://a.example:80"}, io.Discard, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://app.example.com,http://localhost:3000,http://a.example"; c.Origins != want {
		t.Errorf("origins %q, want %q (as browsers send them)", c.Origins, want)
	}
	c, err = parseServeFlags([]string{"--public-url", "HTTPS://Lapd.Example.com:443/"}, io.Discard, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://lapd.example.com"; c.PublicURL != want {
		t.Errorf("public URL %q, want %q (as browsers send it in Origin)", c.PublicURL, want)
	}
}

// TestCommandLineErrors: a bad command line prints the error and one line
// pointing at --help (not the whole usage), and --help goes to stdout.
func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	var out, errw bytes.Buffer
	err := run(context.Background(), []string{"serve", "--port", "9000"}, nil, &out, &errw, envMap(nil))
	var ue usageError
	want := "unknown flag --port (did you mean --addr?)\nRun \"lapd serve --help\" to see every flag."
	if !errors.As(err, &ue) || err.Error() != want || out.Len() != 0 || errw.Len() != 0 {
		t.Errorf("bad flag: err %q, stdout %q, stderr %q; want only the error %q", err, out.String(), errw.String(), want)
	}
	for _, args := range [][]string{{"serve", "--help"}, {"serve", "-h"}, {"help", "serve"}} {
		out.Reset()
		errw.Reset()
		if err := run(context.Background(), args, nil, &out, &errw, envMap(nil)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "Usage: lapd serve [flags]") || !strings.Contains(out.String(), "\n  --addr string\n") ||
			!strings.Contains(out.String(), "\n  --grace duration\n") || !strings.Contains(out.String(), "(env LAPD_GRACE) (default 1m)") || errw.Len() != 0 {
			t.Errorf("%v: help on stdout %q, stderr %q", args, out.String(), errw.String())
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"audit", "--help"}, nil, &out, io.Discard, envMap(nil)); err != nil || !strings.Contains(out.String(), "confirm-*") {
		t.Errorf("audit --help: %v %q", err, out.String())
	}
	err = run(context.Background(), []string{"serv"}, nil, io.Discard, io.Discard, envMap(nil))
	if !errors.As(err, &ue) || err.Error() != "unknown command \"serv\" (did you mean serve?)\nRun \"lapd help\" to see the commands." {
		t.Errorf("unknown command: %q", err)
	}
}

func TestListenURLs(t *testing.T) {
	t.Parallel()
	addrs := func() ([]net.Addr, error) {
		var out []net.Addr
		for _, c := range []string{"127.0.0.1/8", "192.168.1.20/24", "::1/128", "fe80::1/64", "2001:db8::5/64", "10.0.0.7/8"} {
			ip, n, _ := net.ParseCIDR(c)
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}
	for addr, want := range map[string]string{
		"127.0.0.1:8787": "http://127.0.0.1:8787",
		"0.0.0.0:8787":   "http://127.0.0.1:8787 http://192.168.1.20:8787 http://10.0.0.7:8787",
		"[::]:8787":      "http://127.0.0.1:8787 http://192.168.1.20:8787 http://10.0.0.7:8787 http://[2001:db8::5]:8787",
		"10.0.0.7:80":    "http://10.0.0.7:80",
	} {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		got := strings.Join(listenURLs(&net.TCPAddr{IP: net.ParseIP(host), Port: p}, addrs), " ")
		if got != want {
			t.Errorf("listenURLs(%s) = %s, want %s", addr, got, want)
		}
	}
}

// bannerFor is the start-up banner of lapd serve with args, listening on urls.
func bannerFor(t *testing.T, args []string, urls ...string) string {
	t.Helper()
	c, err := parseServeFlags(args, io.Discard, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := lapdConfig(c, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	printBanner(&b, c, a, urls, "")
	return b.String()
}

// The JSON lines a first click prints on stdout are the audit trail: the
// banner says so, and where lapd audit finds the copy it reads.
func TestBannerNamesAuditTrail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Audit trail:   stdout (one JSON line each); " + filepath.Join("lapd-data", "lapd.db") + " (lapd audit reads it)\n"},
		{[]string{"--audit", "file:/var/log/lapd.jsonl", "--data-dir", "d"}, "Audit trail:   /var/log/lapd.jsonl; " + filepath.Join("d", "lapd.db") + " (lapd audit reads it)\n"},
		{[]string{"--store", "memory"}, "Audit trail:   stdout (one JSON line each)\n"},
		{[]string{"--audit", "none"}, "Audit trail:   off (--audit none)\n"},
	} {
		if b := bannerFor(t, tc.args, "http://127.0.0.1:8787"); !strings.Contains(b, tc.want) {
			t.Errorf("%v: banner lacks %q:\n%s", tc.args, tc.want, b)
		}
	}
}

func TestBannerSaysAnonymousMintIsOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"--addr", "0.0.0.0:8787"}, []string{"Anonymous mint is off: lapd listens beyond loopback (0.0.0.0:8787)", "401 auth-required", "--allow-anonymous true"}, nil},
		{[]string{"--addr", "0.0.0.0:8787", "--allow-anonymous", "true"}, nil, []string{"Anonymous mint is off"}},
		{[]string{"--allow-anonymous", "false"}, []string{"Anonymous mint is off: --allow-anonymous is false"}, nil},
		{[]string{}, []string{"Demo app:      http://127.0.0.1:8787/"}, []string{"Anonymous mint is off"}},
	} {
		b := bannerFor(t, tc.args, "http://127.0.0.1:8787", "http://192.168.1.20:8787")
		for _, w := range tc.want {
			if !strings.Contains(b, w) {
				t.Errorf("%v: banner lacks %q:\n%s", tc.args, w, b)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(b, w) {
				t.Errorf("%v: banner has %q:\n%s", tc.args, w, b)
			}
		}
	}
}

func TestParseEvents(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                  "",
		"mint":              "mint",
		"confirm-*":         "confirm-proposed confirm-approved confirm-rejected confirm-expired",
		"mint, revoke,mint": "mint revoke",
		"msg-*,m*":          "msg-dispatched msg-blocked mint",
	} {
		got, err := parseEvents(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("parseEvents(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"mnit":     `no audit event is called "mnit" (did you mean mint?); events are: mint, claim`,
		"bogus":    `no audit event is called "bogus"; events are:`,
		"confirm":  `no audit event is called "confirm" (did you mean confirm-*?)`,
		"zzz-*":    `"zzz-*" matches no audit event`,
		"mint,[a-": `--event "[a-": syntax error in pattern`,
	} {
		if _, err := parseEvents(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseEvents(%q): %v, want an error containing %q", in, err, want)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8787": true, "localhost:1": true, "[::1]:80": true,
		"0.0.0.0:8787": false, ":8787": false, "10.0.0.1:80": false, "bad": false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestLapdConfig(t *testing.T) {
	t.Parallel()
	base, err := parseServeFlags(nil, io.Discard, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	c := base
	a, err := lapdConfig(c, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.AllowAnonymous || !a.AuditStdout || !a.AuditSQLite {
		t.Errorf("defaults on loopback: anonymous=%v stdout=%v sqlite=%v", a.AllowAnonymous, a.AuditStdout, a.AuditSQLite)
	}
	c.Addr = "0.0.0.0:8787"
	if a, _ := lapdConfig(c, io.Discard, nil); a.AllowAnonymous {
		t.Error("auto must refuse anonymous mint when listening beyond loopback")
	}
	// Behind a proxy everything arrives from loopback, from anyone.
	for _, mod := range []func(*serveConfig){
		func(c *serveConfig) { c.TrustProxy = 1 },
		func(c *serveConfig) { c.PublicURL = "https://app.example.com" },
	} {
		c = base
		mod(&c)
		if a, _ := lapdConfig(c, io.Discard, nil); a.AllowAnonymous {
			t.Errorf("auto must refuse anonymous mint behind a proxy (trust-proxy %d, public-url %q)", c.TrustProxy, c.PublicURL)
		}
	}
	c = base
	c.Hosts = "lapd.internal, app.example.com"
	if a, _ := lapdConfig(c, io.Discard, nil); len(a.Hosts) != 2 || a.Hosts[1] != "app.example.com" {
		t.Errorf("--hosts: %v", a.Hosts)
	}
	c = base
	c.Audit = "stdout,carrier-pigeon"
	if _, err := lapdConfig(c, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Errorf("unknown audit sink: %v", err)
	}
	c = base
	c.IdentityCookie, c.IdentityCookieKey = "uid", "short"
	if _, err := lapdConfig(c, io.Discard, nil); err == nil {
		t.Error("a short identity cookie key must be refused")
	}
	c = base
	c.Store, c.Audit = "memory", "sqlite"
	if _, err := lapdConfig(c, io.Discard, nil); err == nil {
		t.Error("--audit sqlite with --store memory must be refused")
	}
}

func TestParseWhen(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]int64{
		"":                     0,
		"1h":                   now.Add(-time.Hour).UnixMilli(),
		"2026-11-23T09:00:00Z": now.Add(-time.Hour).UnixMilli(),
		"1795433048237":        1795433048237,
	} {
		got, err := parseWhen(in, now)
		if err != nil || got != want {
			t.Errorf("parseWhen(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseWhen("yesterday", now); err == nil {
		t.Error("parseWhen must refuse words")
	}
}

func TestRunCommands(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, nil, &out, io.Discard); err != nil || !strings.HasPrefix(out.String(), "lapd ") {
		t.Errorf("version: %q %v", out.String(), err)
	}
	err := run(context.Background(), []string{"frobnicate"}, nil, io.Discard, io.Discard)
	var ue usageError
	if !errors.As(err, &ue) {
		t.Errorf("unknown command: %v", err)
	}
}

// lapd audit --nats reaches a cluster whose NATS wants a client certificate,
// as lapd serve does; the NATS flags without --nats are refused, not ignored.
func TestAuditNATSFlags(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	if err := run(context.Background(), []string{"audit", "--help"}, nil, &help, io.Discard, envMap(nil)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--nats-creds", "--nats-ca", "--nats-cert", "--nats-key"} {
		if !strings.Contains(help.String(), f) {
			t.Errorf("lapd audit --help lacks %s", f)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "--nats", "nats://127.0.0.1:1", "--nats-cert", "c.pem"}, "--nats-cert and --nats-key go together"},
		{[]string{"audit", "--nats-ca", "ca.pem"}, "need --nats"},
	} {
		err := run(context.Background(), tc.args, nil, io.Discard, io.Discard, envMap(nil))
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}

// lapd mcp run by hand (stdin a terminal) says what it is for; started by
// an MCP client (stdin a pipe) it writes nothing but MCP.
func TestMCPHintOnlyOnATerminal(t *testing.T) {
	t.Parallel()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if isTerminal(pr) {
		t.Error("a pipe (what MCP clients give lapd mcp) counts as a terminal")
	}
	if isTerminal(strings.NewReader("")) {
		t.Error("a reader that is not a file counts as a terminal")
	}
	tty, err := os.Open(os.DevNull) // a character device, as a terminal is
	if err != nil {
		t.Skip(err)
	}
	defer tty.Close()
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"mcp"}, tty, &stdout, &stderr, envMap(nil)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "an MCP client starts it") {
		t.Errorf("lapd mcp on a character device wrote %q to stderr; want the hint", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("the hint went to stdout, which carries only MCP: %q", stdout.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	ch chan struct{}
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	select {
	case l.ch <- struct{}{}:
	default:
	}
	return n, err
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeThenAudit runs `lapd serve` in-process on a free port, mints a
// token, shuts it down with the context (graceful), then reads the mint back
// with `lapd audit`.
func TestServeThenAudit(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &lockedBuffer{ch: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir, "--audit", "none,sqlite"}, nil, io.Discard, stderr, envMap(nil))
	}()
	re := regexp.MustCompile(`listening on (http://[0-9.:]+)`)
	var base string
	deadline := time.After(20 * time.Second)
	for base == "" {
		select {
		case <-stderr.ch:
			if m := re.FindStringSubmatch(stderr.String()); m != nil {
				base = m[1]
			}
		case err := <-done:
			t.Fatalf("serve exited early: %v\n%s", err, stderr.String())
		case <-deadline:
			t.Fatalf("serve did not listen:\n%s", stderr.String())
		}
	}
	resp, err := http.Post(base+"/agent/mint", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"token":"agt_`)) {
		t.Fatalf("mint: %d %s", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("graceful shutdown returned %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"audit", "--data-dir", dir, "--event", "mint", "--format", "json"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"event":"mint"`) {
		t.Errorf("audit output lacks the mint: %q", out.String())
	}
	// The globs --help shows select from the database too.
	out.Reset()
	if err := run(context.Background(), []string{"audit", "--data-dir", dir, "--event", "m*,confirm-*", "--format", "json"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"event":"mint"`) {
		t.Errorf("--event 'm*' output lacks the mint: %q", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"audit", "--data-dir", dir, "--event", "revoke"}, nil, &out, io.Discard); err != nil || out.Len() != 0 {
		t.Errorf("--event revoke: %v %q", err, out.String())
	}
	if strings.Contains(out.String(), "agt_") || strings.Contains(stderr.String(), "agt_") {
		t.Error("a token leaked into the audit output or the logs")
	}
}

// --admin-addr and --admin-token: off by default, a bare port is loopback,
// beyond loopback needs a token, never the public address; the env works
// (LAPD_ADMIN_TOKEN keeps the token out of ps); flags only map to Config.
func TestAdminFlags(t *testing.T) {
	c, err := parseServeFlags(nil, io.Discard, envMap(nil))
	if err != nil || c.AdminAddr != "" {
		t.Fatalf("default: %q %v", c.AdminAddr, err)
	}
	lc, _ := lapdConfig(c, io.Discard, nil)
	if lc.Admin.Enabled || lc.Admin.Token != "" {
		t.Errorf("admin on by default: %+v", lc.Admin)
	}
	const tok = "0123456789abcdef-tok"
	for _, tc := range []struct {
		args []string
		env  map[string]string
		addr string // "" = refused
	}{
		{[]string{"--admin-addr", ":9090"}, nil, "127.0.0.1:9090"},
		{[]string{"--admin-addr", "9090"}, nil, "127.0.0.1:9090"},
		{[]string{"--admin-addr", "[::1]:9090"}, nil, "[::1]:9090"},
		{[]string{"--admin-addr", "0.0.0.0:9090"}, nil, ""},
		{[]string{"--admin-addr", "0.0.0.0:9090", "--admin-token", tok}, nil, "0.0.0.0:9090"},
		{[]string{"--admin-addr", "0.0.0.0:9090"}, map[string]string{"LAPD_ADMIN_TOKEN": tok}, "0.0.0.0:9090"},
		{nil, map[string]string{"LAPD_ADMIN_ADDR": "127.0.0.1:9091"}, "127.0.0.1:9091"},
		{[]string{"--admin-addr", "127.0.0.1:8787"}, nil, ""},                  // the public --addr
		{[]string{"--addr", "0.0.0.0:9090", "--admin-addr", ":9090"}, nil, ""}, // overlaps it
		{[]string{"--admin-addr", ":9090", "--admin-token", "short"}, nil, ""},
		{[]string{"--admin-token", tok}, nil, ""}, // a token without a listener
		{[]string{"--admin-addr", "nonsense"}, nil, ""},
	} {
		c, err := parseServeFlags(tc.args, io.Discard, envMap(tc.env))
		if tc.addr == "" {
			var ue usageError
			if !errors.As(err, &ue) {
				t.Errorf("%v %v: want a usage error, got %v (addr %q)", tc.args, tc.env, err, c.AdminAddr)
			}
			continue
		}
		if err != nil || c.AdminAddr != tc.addr {
			t.Errorf("%v %v: addr %q err %v, want %q", tc.args, tc.env, c.AdminAddr, err, tc.addr)
			continue
		}
		lc, err := lapdConfig(c, io.Discard, nil)
		if err != nil || !lc.Admin.Enabled || lc.Admin.Token != c.AdminToken {
			t.Errorf("%v: Config.Admin %+v (%v)", tc.args, lc.Admin, err)
		}
	}
}

func TestParseRetention(t *testing.T) {
	tests := []struct {
		in      string
		age     time.Duration
		size    int64
		wantErr bool
	}{
		{"30d,1GiB", 30 * 24 * time.Hour, 1 << 30, false},
		{"12h", 12 * time.Hour, 0, false},
		{"500MB", 0, 500e6, false},
		{"64KiB, 7d", 7 * 24 * time.Hour, 64 << 10, false},
		{"off", 0, 0, false},
		{"30", 0, 0, true},
		{"1GiB,2GiB", 0, 0, true},
		{"-1h", 0, 0, true},
		{"3.5d", 0, 0, true},
		{"tenGB", 0, 0, true},
	}
	for _, tt := range tests {
		r, err := parseRetention(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && (r.MaxAge != tt.age || r.MaxBytes != tt.size)) {
			t.Errorf("parseRetention(%q) = %+v, %v", tt.in, r, err)
		}
	}
}

// --mcp-fast-path: on by default; false reaches lapd.Config.
func TestMCPFastPathFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		off  bool
	}{{nil, false}, {[]string{"--mcp-fast-path=false"}, true}, {[]string{"--mcp-fast-path"}, false}} {
		c, err := parseServeFlags(tc.args, io.Discard, envMap(nil))
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		lc, err := lapdConfig(c, io.Discard, nil)
		if err != nil || lc.MCPNoFastPath != tc.off {
			t.Errorf("%v: MCPNoFastPath %v (err %v), want %v", tc.args, lc.MCPNoFastPath, err, tc.off)
		}
	}
}

// --nats-replicas (or LAPD_NATS_REPLICAS) reaches lapd.Config; unset, it is
// 0: existing buckets keep their replicas.
func TestNATSReplicasFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{[]string{"--nats", "nats://127.0.0.1:4222"}, nil, 0},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-replicas", "3"}, nil, 3},
		{[]string{"--nats", "nats://127.0.0.1:4222"}, map[string]string{"LAPD_NATS_REPLICAS": "5"}, 5},
	} {
		c, err := parseServeFlags(tc.args, io.Discard, envMap(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		a, err := lapdConfig(c, io.Discard, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.NATSReplicas != tc.want {
			t.Errorf("%v %v: NATSReplicas %d, want %d", tc.args, tc.env, a.NATSReplicas, tc.want)
		}
	}
}

// --peer-listen and --peer-advertise (or their env) reach lapd.Config;
// the default is the loopback link.
func TestPeerLinkFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args                 []string
		env                  map[string]string
		listen, adverts, tls string
	}{
		{[]string{"--nats", "nats://127.0.0.1:4222"}, nil, "127.0.0.1:0", "", "auto"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--peer-listen", "off"}, nil, "off", "", "auto"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--peer-tls", "on"}, nil, "127.0.0.1:0", "", "on"},
		{[]string{"--nats", "nats://127.0.0.1:4222"}, map[string]string{"LAPD_PEER_LISTEN": ":7422", "LAPD_PEER_ADVERTISE": "10.0.0.5:7422", "LAPD_PEER_TLS": "off"}, ":7422", "10.0.0.5:7422", "off"},
	} {
		c, err := parseServeFlags(tc.args, io.Discard, envMap(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		a, err := lapdConfig(c, io.Discard, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.PeerListen != tc.listen || a.PeerAdvertise != tc.adverts || a.PeerTLS != tc.tls {
			t.Errorf("%v %v: PeerListen %q, PeerAdvertise %q, PeerTLS %q; want %q, %q, %q", tc.args, tc.env, a.PeerListen, a.PeerAdvertise, a.PeerTLS, tc.listen, tc.adverts, tc.tls)
		}
	}
	if _, err := parseServeFlags([]string{"--nats", "nats://127.0.0.1:4222", "--peer-tls", "yes"}, io.Discard, envMap(nil)); err == nil || !strings.Contains(err.Error(), "want auto, on or off") {
		t.Errorf("--peer-tls yes = %v, want a usage error naming the values", err)
	}
}

// A lapd.db that is not a database stopped lapd with SQLite's words only
// ("file is not a database (26)"); the error now says what to do.
func TestServeSaysWhatToDoWithADamagedDatabase(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lapd.db"), bytes.Repeat([]byte("junk"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, nil, io.Discard, io.Discard, envMap(nil))
	if err == nil || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("serve on a damaged lapd.db: %v; want the way out", err)
	}
}
