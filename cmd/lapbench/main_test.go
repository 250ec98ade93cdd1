package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the floor server, as lapbench
// re-executes itself for it.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "floor-server" {
		if err := floorServer(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "link-shapes-server" {
		if err := linkShapesServer(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// link-shapes measures both shapes of a link at 1 and 16 callers, twice.
func TestLinkShapes(t *testing.T) {
	var out strings.Builder
	if err := linkShapesFor(&out, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Split(l, "|")
		if len(f) != 7 || (strings.TrimSpace(f[1]) != "per-conn" && strings.TrimSpace(f[1]) != "mux") {
			continue
		}
		rows++
		if rt, err := strconv.ParseFloat(strings.TrimSpace(f[3]), 64); err != nil || rt <= 0 {
			t.Errorf("no round trips in %q", l)
		}
	}
	if rows != 8 {
		t.Fatalf("%d rows, want 8:\n%s", rows, out.String())
	}
}

// TestLapbenchRuns runs every kind of scenario briefly against the real
// binary (built here without -race) in two configurations, and checks that
// each produced a figure, no request failed, one audit line was written per
// LAP call in the default configuration, and the report parses.
func TestLapbenchRuns(t *testing.T) {
	rep, stdout := runLapbench(t, "-scenarios", "floor-1,observe-2,message-2,mcp-1,mcpraw-1,idle-20", "-configs", "default,memory-none")
	seen := map[string]bool{}
	for _, r := range rep.Medians {
		seen[r.Scenario+"/"+r.Config] = true
		if r.Errors != 0 {
			t.Errorf("%s/%s: %d errors (%s)", r.Scenario, r.Config, r.Errors, r.FirstErr)
		}
		if r.Tabs == 0 && (r.Requests == 0 || r.ReqPerS <= 0 || r.P50us <= 0) {
			t.Errorf("%s/%s: no figures: %+v", r.Scenario, r.Config, r)
		}
		if r.Tabs > 0 && r.RSSPairedMiB <= 0 {
			t.Errorf("%s/%s: no RSS: %+v", r.Scenario, r.Config, r)
		}
		if r.Config == "default" && (r.Scenario == "observe-2" || r.Scenario == "message-2") && (r.AuditPerReq < 0.8 || r.AuditPerReq > 1.2) {
			t.Errorf("%s/default: %.2f audit lines per call, want one", r.Scenario, r.AuditPerReq)
		}
	}
	for _, k := range []string{"floor-1/floor", "observe-2/default", "observe-2/memory-none", "message-2/default", "mcp-1/default", "mcpraw-1/default", "idle-20/default"} {
		if !seen[k] {
			t.Errorf("no result for %s", k)
		}
	}
	if !strings.Contains(stdout, "| observe-2 | default |") || !strings.Contains(stdout, "Reference server") {
		t.Errorf("markdown:\n%s", stdout)
	}
}

// TestLapbenchCluster runs the cluster configurations briefly: a
// nats-server (built from its Go module, or $LAPD_NATS_SERVER), three
// nodes, the agents on node A and on node B (with the peer link in plain
// TCP and in TLS); figures, no errors, and the audit line of each call
// counted whichever node wrote it.
func TestLapbenchCluster(t *testing.T) {
	rep, _ := runLapbench(t, "-scenarios", "observe-2,idle-20", "-configs", "nats-local,nats-cross,nats-cross-tls")
	seen := map[string]bool{}
	for _, r := range rep.Medians {
		seen[r.Scenario+"/"+r.Config] = true
		if r.Errors != 0 {
			t.Errorf("%s/%s: %d errors (%s)", r.Scenario, r.Config, r.Errors, r.FirstErr)
		}
		if r.Tabs == 0 && (r.Requests == 0 || r.P50us <= 0 || r.AuditPerReq < 0.8 || r.AuditPerReq > 1.2) {
			t.Errorf("%s/%s: figures %+v (want one audit line per call)", r.Scenario, r.Config, r)
		}
	}
	for _, k := range []string{"observe-2/nats-local", "observe-2/nats-cross", "observe-2/nats-cross-tls", "idle-20/nats-local"} {
		if !seen[k] {
			t.Errorf("no result for %s", k)
		}
	}
}

// runLapbench builds lapd (from the repository root, without -race) and
// runs lapbench with args over short windows, long enough that a loaded CI
// machine still completes requests in them; it returns the report and the
// markdown lapbench printed.
func runLapbench(t *testing.T, args ...string) (Report, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs lapd; not in -short")
	}
	wd, _ := os.Getwd()
	if err := os.Chdir(filepath.Join(wd, "..", "..")); err != nil { // buildLapd runs from the repository root
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chdir(wd) })
	bin, err := buildLapd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.json")
	var stdout bytes.Buffer
	err = run(context.Background(), append([]string{"-lapd", bin, "-d", "3s", "-warm", "500ms", "-settle", "300ms", "-json", out}, args...), &stdout, io.Discard)
	if err != nil {
		t.Fatalf("lapbench: %v\n%s", err, stdout.String())
	}
	var rep Report
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, stdout.String()
}

// clusterTargets pairs each run's nats-local and nats-cross and judges the
// median and every run.
func TestClusterTargets(t *testing.T) {
	res := func(sc, cfg string, run int, rps, p50 float64) Result {
		return Result{Scenario: sc, Config: cfg, Run: run, ReqPerS: rps, P50us: p50}
	}
	rep := Report{Results: []Result{
		res("observe-16", "nats-local", 1, 1000, 700), res("observe-16", "nats-cross", 1, 690, 1200),
		res("observe-16", "nats-local", 2, 1000, 700), res("observe-16", "nats-cross", 2, 720, 1200),
		res("observe-16", "nats-local", 3, 1000, 700), res("observe-16", "nats-cross", 3, 710, 1200),
		res("observe-1", "nats-local", 1, 4000, 220), res("observe-1", "nats-cross", 1, 2000, 400),
		res("observe-1", "nats-local", 2, 4000, 220), res("observe-1", "nats-cross", 2, 2000, 300),
		res("observe-1", "nats-local", 3, 4000, 220), res("observe-1", "nats-cross", 3, 2000, 410),
	}}
	rep.Medians = []Result{
		{Scenario: "idle-1000", Config: "default", Tabs: 1000, RSSPerTabKiB: 4.5, RSSPerTabGCKiB: 6.5},
		{Scenario: "idle-1000", Config: "nats-local", Tabs: 1000, RSSPerTabKiB: 5.0, RSSPerTabGCKiB: 7.0},
	}
	out := clusterTargets(rep)
	for _, want := range []string{
		"| observe-16: cross-node req/s ≥ 0.7× nats-local | 0.710× (0.690, 0.720, 0.710) | met by the median, not by every run |",
		"| observe-1: cross-node req/s ≥ 0.7× nats-local | 0.500× (0.500, 0.500, 0.500) | **not met** |",
		"| observe-1: cross-node p50 ≤ +150 µs | +180 µs (+180, +80, +190) | **not met** |",
		"| idle-1000 nats-local: idle tab ≤ +2 KiB RSS against default (settled / after a GC) | +0.5 / +0.5 KiB | met |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("clusterTargets lacks %q:\n%s", want, out)
		}
	}
	if clusterTargets(Report{Results: []Result{res("observe-16", "default", 1, 1000, 700)}}) != "" {
		t.Error("a run without the cluster configurations got cluster targets")
	}
}
