package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// embedGoDir is the separate Go module of the "lapd inside your own Go
// server" example.
const embedGoDir = "../examples/embed-go"

// goCmd runs the go tool in the example module as an app author would:
// outside this module (no workspace), go.sum as committed (-mod=readonly:
// a missing checksum fails instead of being added), resolving lapd through
// the module's replace and everything else from the module cache (or the
// Go proxy when the cache is cold).
func goCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = embedGoDir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	return cmd
}

// TestEmbedGoModule builds examples/embed-go from outside this module, runs
// it, and checks that the app's own routes and lapd's live side by side:
// the page, the client, a mint only for a logged-in user, a tab paired over
// the app's own /agent/ws, LAP through it, and a graceful stop. Then it
// runs the module's own tests (a lapdtest tab driven through MCP).
func TestEmbedGoModule(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 4*time.Minute)
	bin := filepath.Join(t.TempDir(), "embed-go")
	if out, err := goCmd(ctx, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build in %s: %v\n%s\n(if lapd's go.mod changed: cd %s && GOWORK=off go mod tidy)", embedGoDir, err, out, embedGoDir)
	}

	cmd := exec.Command(bin, "--addr", "127.0.0.1:0", "--data-dir", t.TempDir())
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urlc := make(chan string, 1)
	logs := &syncBuffer{}
	go func() {
		re := regexp.MustCompile(`listening on (http://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	var base string
	select {
	case base = <-urlc:
	case err := <-exited:
		t.Fatalf("embed-go exited: %v\n%s", err, logs)
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("embed-go did not listen\n%s", logs)
	}
	defer cmd.Process.Kill()

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	get := func(path string) (int, string) {
		t.Helper()
		res, err := browser.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if st, body := get("/"); st != 200 || !strings.Contains(body, "Log in") {
		t.Errorf("GET / before login: %d %.200s", st, body)
	}
	if _, err := lapdtest.Mint(ctx, browser, base+"/agent/mint"); err == nil {
		t.Error("mint before login succeeded")
	}
	if st, body := get("/login?user=alice"); st != 200 || !strings.Contains(body, "alice's todos") || !strings.Contains(body, `from '/agent/client.js'`) {
		t.Errorf("the app's page after login: %d %.300s", st, body)
	}
	if st, body := get("/agent/client.js"); st != 200 || !strings.Contains(body, "createAgent") {
		t.Errorf("GET /agent/client.js: %d", st)
	}
	sess, err := lapdtest.Mint(ctx, browser, base+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sess.WSURL, "ws"+strings.TrimPrefix(base, "http")+"/agent/ws") {
		t.Errorf("mint's wsUrl %q is not the app's own /agent/ws", sess.WSURL)
	}
	tab, err := sess.Pair(ctx, lapdtest.WithApp(lapdtest.App{Name: "Todos", State: map[string]any{"todos": []any{}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Abort()
	req, _ := http.NewRequest("POST", sess.LapURL+"/describe", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+sess.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var desc struct{ Name string }
	_ = json.NewDecoder(res.Body).Decode(&desc)
	res.Body.Close()
	if res.StatusCode != 200 || desc.Name != "Todos" {
		t.Errorf("LAP describe through the app: %d %+v", res.StatusCode, desc)
	}

	// Graceful stop: the tab is told to reconnect (1012), the process exits 0.
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("embed-go exit: %v\n%s", err, logs)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("embed-go did not stop\n%s", logs)
	}
	<-tab.Done()
	if got := tab.CloseStatus(); got != 1012 {
		t.Errorf("tab closed with %d, want 1012", got)
	}

	// The module's own tests.
	if out, err := goCmd(ctx, "test", "-race", "-count=1", "./...").CombinedOutput(); err != nil {
		t.Fatalf("go test in %s: %v\n%s", embedGoDir, err, out)
	}
}
