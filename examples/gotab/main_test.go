package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lapdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lines is an io.Writer that hands each "paired" line to a channel.
type lines struct {
	mu     sync.Mutex
	all    strings.Builder
	paired chan struct{}
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	if strings.Contains(string(p), "gotab: paired") {
		l.paired <- struct{}{}
	}
	return len(p), nil
}

func (l *lines) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.all.String() }

// Regression (#13): gotab exited on "server restarting" (1012). It must
// re-pair with the same token, as lapd.js does, and approve what lapd
// re-delivers.
func TestGotabSurvivesARestart(t *testing.T) {
	srv := lapdtest.NewServer(lapd.Config{DataDir: t.TempDir()})
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sess, err := srv.Mint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := &lines{paired: make(chan struct{}, 4)}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--url", srv.URL, "--token", sess.Token, "--tab-secret", sess.TabSecret, "--approve-after", "1ms"}, func(string) string { return "" }, out)
	}()
	waitPaired := func(what string) {
		t.Helper()
		select {
		case <-out.paired:
		case err := <-done:
			t.Fatalf("%s: gotab exited: %v\n%s", what, err, out)
		case <-ctx.Done():
			t.Fatalf("%s: gotab never paired\n%s", what, out)
		}
	}
	waitPaired("first pairing")
	lap := func(route, body string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", sess.LapURL+route, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+sess.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	if got := lap("/message", `{"msg":{"type":"inc"}}`); !strings.Contains(got, `"status":"dispatched"`) {
		t.Fatalf("inc: %s", got)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitPaired("after the restart")
	if got := lap("/state", `{"path":"/count"}`); got != `{"state":1}` {
		t.Errorf("state after the restart: %s", got)
	}
	if got := lap("/message", `{"msg":{"type":"clearAll"},"timeoutMs":10000}`); !strings.Contains(got, `"status":"confirmed"`) {
		t.Errorf("clearAll (gotab approves): %s", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("gotab after cancel: %v", err)
	}
}
