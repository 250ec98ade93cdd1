package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
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
		{nil, map[string]string{"LAPD_GRACE": "soon"}, "LAPD_GRACE"},
		{[]string{"extra"}, nil, "unexpected argument"},
		{[]string{"--nope"}, nil, "flag provided but not defined"},
	} {
		_, err := parseServeFlags(tc.args, io.Discard, envMap(tc.env))
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want a usage error containing %q", tc.args, tc.env, err, tc.want)
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

func TestAppConfig(t *testing.T) {
	t.Parallel()
	base, err := parseServeFlags(nil, io.Discard, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	c := base
	a, err := appConfig(c, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.AllowAnonymous || !a.AuditStdout || !a.AuditSQLite {
		t.Errorf("defaults on loopback: anonymous=%v stdout=%v sqlite=%v", a.AllowAnonymous, a.AuditStdout, a.AuditSQLite)
	}
	c.Addr = "0.0.0.0:8787"
	if a, _ := appConfig(c, io.Discard, nil); a.AllowAnonymous {
		t.Error("auto must refuse anonymous mint when listening beyond loopback")
	}
	c = base
	c.Audit = "stdout,carrier-pigeon"
	if _, err := appConfig(c, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Errorf("unknown audit sink: %v", err)
	}
	c = base
	c.IdentityCookie, c.IdentityCookieKey = "uid", "short"
	if _, err := appConfig(c, io.Discard, nil); err == nil {
		t.Error("a short identity cookie key must be refused")
	}
	c = base
	c.Store, c.Audit = "memory", "sqlite"
	if _, err := appConfig(c, io.Discard, nil); err == nil {
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
	if strings.Contains(out.String(), "agt_") || strings.Contains(stderr.String(), "agt_") {
		t.Error("a token leaked into the audit output or the logs")
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
