package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeCurlWalkthrough runs the README's "Walk-through with curl" block
// as a new user pastes it: one bash script, unchanged except for the port
// (a free one instead of 8787, through LAPD_ADDR and the URLs), the data dir
// (LAPD_DATA_DIR) and where bin/ is (a temp dir), so that it can run beside
// other tests. It checks that every "# {…}" line under a command is what the
// command printed, each answer on its own line, and that `lapd audit` shows
// the session.
func TestReadmeCurlWalkthrough(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		needTool(t, "bash", "")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		needTool(t, "curl", "")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## Walk-through with curl\n.*?```sh\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no sh block under \"Walk-through with curl\"")
	}
	block := string(m[1])
	addr := browserFreeAddr(t)
	tmp := t.TempDir()
	script := strings.ReplaceAll(block, "http://127.0.0.1:8787", "http://"+addr)
	script = regexp.MustCompile(`(^|[\s(])bin/`).ReplaceAllString(script, "${1}"+filepath.Join(tmp, "bin")+"/")
	if strings.Contains(script, "8787") {
		t.Fatalf("the block names port 8787 outside a URL the test can move:\n%s", script)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-c", script)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "LAPD_ADDR="+addr, "LAPD_DATA_DIR="+filepath.Join(tmp, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README block failed: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	t.Logf("stdout:\n%s", out)

	// Each "# {…}" comment shows what the command above it printed, on a
	// line of its own: its pieces between "..." appear in that order in one
	// output line, the first at its start (unless the comment starts with
	// "...") and the last at its end (unless it ends with "...").
	lines := strings.Split(out, "\n")
	for _, c := range regexp.MustCompile(`(?m)^# (\{.*\})`).FindAllStringSubmatch(block, -1) {
		if !matchesShown(c[1], lines) {
			t.Errorf("no output line looks like the README's %q", c[1])
		}
	}
	if !regexp.MustCompile(`(?m)^\{.*"token":"agt_.*\}$`).MatchString(out) {
		t.Error("the mint response is not printed on a line of its own")
	}
	if !regexp.MustCompile(`(?m)^\{.*"state":\{.*\}$`).MatchString(out) {
		t.Error("the observe answer is not on a line of its own")
	}
	for _, ev := range []string{"mint", "claim", "msg-dispatched", "msg-blocked", "confirm-approved", "revoke"} {
		if !regexp.MustCompile(`(?m)\s` + regexp.QuoteMeta(ev) + `\s`).MatchString(out) {
			t.Errorf("lapd audit does not show a %s entry", ev)
		}
	}
	if strings.Contains(stderr.String(), "curl: (") {
		t.Errorf("curl reported an error:\n%s", stderr.String())
	}
}

// matchesShown reports whether one of lines is what shown (a README output
// comment with "..." for the parts left out) describes.
func matchesShown(shown string, lines []string) bool {
	parts := strings.Split(shown, "...")
	for _, l := range lines {
		rest, ok := l, true
		for i, p := range parts {
			p = strings.Trim(p, ",")
			if p == "" {
				continue
			}
			j := strings.Index(rest, p)
			if j < 0 || (i == 0 && j != 0) {
				ok = false
				break
			}
			rest = rest[j+len(p):]
		}
		if ok && (strings.HasSuffix(shown, "...}") || rest == "" || strings.HasSuffix(shown, "...")) {
			return true
		}
	}
	return false
}
