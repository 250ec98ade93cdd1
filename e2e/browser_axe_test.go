package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The accessibility audit runs axe-core (npm package axe-core, pinned below)
// inside the page. .ci/run installs it under .ci/.cache/axe, as it does the
// MCP conformance suite; when it is missing there the test setup installs it
// the same way (npm install --prefix .ci/.cache/axe), and LAPD_AXE may name
// another axe.min.js. Without it (and without npm) the audit skips, or fails
// when CI=true.
const axeVersion = "4.14.1"

var (
	axeOnce sync.Once
	axePath string
	axeLog  string
)

// browserAxeSource returns axe.min.js, installing it on first use.
func browserAxeSource(t *testing.T) string {
	t.Helper()
	axeOnce.Do(func() {
		if p := os.Getenv("LAPD_AXE"); p != "" {
			axePath = p
			return
		}
		dir, err := filepath.Abs(filepath.Join("..", ".ci", ".cache", "axe"))
		if err != nil {
			axeLog = err.Error()
			return
		}
		axePath = filepath.Join(dir, "node_modules", "axe-core", "axe.min.js")
		if _, err := os.Stat(axePath); err == nil {
			return
		}
		npm, err := exec.LookPath("npm")
		if err != nil {
			axeLog = "npm not found"
			return
		}
		cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", dir, "axe-core@"+axeVersion)
		out, err := cmd.CombinedOutput()
		if err != nil {
			axeLog = fmt.Sprintf("npm install axe-core@%s: %v\n%s", axeVersion, err, out)
		}
	})
	if axeLog != "" {
		t.Log(axeLog)
	}
	needTool(t, "axe-core (npm; .ci/run installs it under .ci/.cache/axe, or set LAPD_AXE)", axePath)
	src, err := os.ReadFile(axePath)
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// axeViolation is one failed axe rule.
type axeViolation struct {
	ID     string   `json:"id"`
	Impact string   `json:"impact"`
	Help   string   `json:"help"`
	Nodes  []string `json:"nodes"`
}

// axe audits the page as it is now (the lapd panel's shadow DOM included)
// and fails on any serious or critical violation; lesser ones are logged.
func (b *browserTab) axe(when string) {
	b.t.Helper()
	src := browserAxeSource(b.t)
	if !strings.Contains(b.evalString(`typeof window.axe`), "object") {
		browserRun(b.t, b.ctx, 20*time.Second, chromedp.Evaluate[bool](src+"\n;true"))
	}
	vs := browserRun(b.t, b.ctx, 60*time.Second, chromedp.Evaluate[[]axeViolation](`axe.run(document, {resultTypes: ['violations']}).then((r) =>
	  r.violations.map((v) => ({id: v.id, impact: v.impact || '', help: v.help, nodes: v.nodes.slice(0, 5).map((n) => JSON.stringify(n.target))})))`,
		chromedp.EvalAwaitPromise))
	var bad []string
	for _, v := range vs {
		line := fmt.Sprintf("%s (%s): %s at %s", v.ID, v.Impact, v.Help, strings.Join(v.Nodes, ", "))
		if v.Impact == "serious" || v.Impact == "critical" {
			bad = append(bad, line)
		} else {
			b.t.Logf("axe %s: %s", when, line)
		}
	}
	if len(bad) > 0 {
		b.t.Errorf("axe %s: %d serious or critical violations:\n  %s", when, len(bad), strings.Join(bad, "\n  "))
		return
	}
	b.t.Logf("axe %s: %d violations, none serious or critical", when, len(vs))
}
