// Command lapbench measures lapd as users run it: the real `lapd serve`
// binary (built without -race) in its own process, driven over loopback by
// agents speaking LAP over HTTP (and MCP over /agent/mcp) and by fake tabs
// that answer like client/lapd.js over a real WebSocket. Run it from the
// repository root:
//
//	go run ./cmd/lapbench                      # the default set, markdown table on stdout
//	go run ./cmd/lapbench -runs 3 -json out.json
//	go run ./cmd/lapbench -scenarios idle-1000,idle-10000 -configs default
//	go run ./cmd/lapbench -profile prof/       # CPU + allocs profile of each scenario
//	go run ./cmd/lapbench link-shapes          # two shapes of a link between nodes (linkshapes.go)
//
// Every scenario starts a fresh server per configuration, mints tokens,
// pairs one fake tab per agent (hello with the demo Taskboard's policy,
// {t:'ping'} heartbeats at hello-ack's interval, a log-append after every
// reply, 10 KiB of state), warms up, then measures for -d:
//
//	floor-1, floor-16      the floor: a minimal HTTP→WebSocket→tab→HTTP echo
//	                       server (this binary, `lapbench floor-server`) with
//	                       the same tab and payload, 1 and 16 agents
//	observe-1, observe-16  POST /agent/lap/v1/observe, 1 and 16 agents
//	message-16             POST /agent/lap/v1/message (addTask), 16 agents
//	mcp-1, mcp-8           the observe tool over /agent/mcp (mcp-go client)
//	mcpraw-1, mcpraw-8     the same call as one plain 2026-07-28 JSON-RPC POST
//	                       whose response is read, not decoded (as the LAP
//	                       scenarios read theirs): the server's MCP path
//	                       without mcp-go's client
//	idle-1000, idle-10000  N paired idle tabs: server RSS per tab
//	                       ((RSS paired − RSS after minting) / N), settled
//	                       (-settle) and again after a GC (started through
//	                       lapd's --pprof listener; the runtime runs one at
//	                       least every two minutes anyway)
//
// and reports requests per second, p50/p90/p99 latency, server CPU time per
// request (utime+stime from /proc/PID/stat over the measured window) and the
// server's RSS. Configurations (-configs):
//
//	default        `lapd serve` with no flags: SQLite token store, audit to
//	               stdout (read by lapbench, as a terminal would) and SQLite
//	memory-none    --store memory --audit none (the ceiling)
//	memory-file    --store memory --audit file:…
//	memory-stdout  --store memory
//	sqlite-none    --audit none
//	sqlite-sqlite  --audit sqlite
//	sqlite-file    --audit file:…
//	default-admin  --admin-addr 127.0.0.1:0; default-again: default, again
//	nats-local     three `lapd serve --nats` nodes (default flags otherwise)
//	               on a nats-server that lapbench starts (built from its Go
//	               module, or $LAPD_NATS_SERVER); tabs pair with node A and
//	               the agents call node A. Server CPU counts all three
//	               nodes and the nats-server (also shown by process).
//	nats-cross     the same, but the agents call node B, which forwards
//	               every call to A (on the peer link; NATS finds A)
//	nats-cross-tls nats-cross with --peer-tls on (the link as between
//	               machines)
//
// With nats-local and nats-cross in one invocation the report ends with
// issue #12's targets: cross ÷ local throughput and p50, per run (the two
// alternate) and their median, and an idle tab's RSS against default.
//
// Every configuration also gets --addr 127.0.0.1:0, a fresh --data-dir and
// --lap-rate/--mint-rate 1e9 (the rate limits would refuse a load test).
//
// Absolute figures drift with the machine and with other work on it;
// compare ratios taken in one run (lapd ÷ floor, default ÷ ceiling) and
// the CPU time per request, which drifts less.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "floor-server" {
		if err := floorServer(); err != nil {
			fmt.Fprintln(os.Stderr, "floor-server:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && (os.Args[1] == "link-shapes" || os.Args[1] == "link-shapes-server") {
		f := func() error { return linkShapes(os.Stdout) }
		if os.Args[1] == "link-shapes-server" {
			f = linkShapesServer
		}
		if err := f(); err != nil {
			fmt.Fprintln(os.Stderr, os.Args[1]+":", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lapbench:", err)
		os.Exit(1)
	}
}

// options are lapbench's flags.
type options struct {
	configs    []string
	scenarios  []string
	d, warm    time.Duration
	settle     time.Duration
	runs       int
	stateBytes int
	jsonOut    string
	lapd       string
	profileDir string
}

const defaultScenarios = "floor-1,floor-16,observe-1,observe-16,message-16,mcp-1,mcp-8,idle-1000"

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("lapbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgs := fs.String("configs", "default,memory-none", "comma-separated configurations: "+strings.Join(sortedKeys(configs), ", "))
	scs := fs.String("scenarios", defaultScenarios, "comma-separated scenarios (also idle-10000); \"all\" = every one")
	fs.DurationVar(&o.d, "d", 5*time.Second, "measured duration of each load scenario")
	fs.DurationVar(&o.warm, "warm", time.Second, "warm-up before measuring (not recorded)")
	fs.DurationVar(&o.settle, "settle", 5*time.Second, "idle scenarios: wait this long before reading RSS")
	fs.IntVar(&o.runs, "runs", 1, "repeat every scenario this many times, alternating configurations; the table shows medians")
	fs.IntVar(&o.stateBytes, "state", 10<<10, "bytes of app state in each observe reply")
	fs.StringVar(&o.jsonOut, "json", "", "also write every result as JSON to this file")
	fs.StringVar(&o.lapd, "lapd", "", "lapd binary to run (default: go build ./cmd/lapd into a temp dir)")
	fs.StringVar(&o.profileDir, "profile", "", "start lapd with --pprof and save a CPU and an allocs profile of each load scenario here (one per cluster node, suffixed -n<i>)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.configs = strings.Split(*cfgs, ",")
	for _, c := range o.configs {
		if _, ok := configs[c]; !ok {
			return o, fmt.Errorf("unknown configuration %q (want %s)", c, strings.Join(sortedKeys(configs), ", "))
		}
	}
	if *scs == "all" {
		*scs = defaultScenarios + ",idle-10000"
	}
	o.scenarios = strings.Split(*scs, ",")
	for _, s := range o.scenarios {
		if _, err := parseScenario(s); err != nil {
			return o, err
		}
	}
	if o.runs < 1 || o.d <= 0 {
		return o, errors.New("-runs and -d must be positive")
	}
	return o, nil
}

// scenario is a parsed scenario name.
type scenario struct {
	Name   string
	Kind   string // floor, observe, message, mcp, mcpraw, idle
	Agents int    // agents, or tabs for idle
}

func parseScenario(s string) (scenario, error) {
	kind, n, ok := strings.Cut(s, "-")
	v, err := strconv.Atoi(n)
	if !ok || err != nil || v <= 0 {
		return scenario{}, fmt.Errorf("bad scenario %q (want e.g. observe-16)", s)
	}
	switch kind {
	case "floor", "observe", "message", "mcp", "mcpraw", "idle":
		return scenario{Name: s, Kind: kind, Agents: v}, nil
	}
	return scenario{}, fmt.Errorf("unknown scenario %q (floor-N, observe-N, message-N, mcp-N, mcpraw-N, idle-N)", s)
}

// Result is one measured scenario × configuration × run.
type Result struct {
	Scenario string  `json:"scenario"`
	Config   string  `json:"config"`
	Run      int     `json:"run"`
	Agents   int     `json:"agents,omitempty"`
	Requests int     `json:"requests,omitempty"`
	Errors   int     `json:"errors"`
	FirstErr string  `json:"firstError,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
	ReqPerS  float64 `json:"reqPerSec,omitempty"`
	P50us    float64 `json:"p50us,omitempty"`
	P90us    float64 `json:"p90us,omitempty"`
	P99us    float64 `json:"p99us,omitempty"`
	CPUms    float64 `json:"serverCpuMsPerReq,omitempty"`
	// lapbench's own CPU per request (agents, fake tabs, MCP clients): with
	// the server's, what bounds req/s on a machine of N CPUs (N / sum).
	ClientCPUms float64 `json:"clientCpuMsPerReq,omitempty"`
	// A cluster's server CPU by process: node A (the tab's), B, C, then the
	// nats-server.
	CPUPartsMs []float64 `json:"serverCpuMsPerReqByProc,omitempty"`
	RSSMiB     float64   `json:"serverRssMiB"`
	// Audit lines the server wrote to stdout per request (default config).
	AuditPerReq float64 `json:"auditLinesPerReq,omitempty"`
	// Heap objects the server allocated per request (with -profile, which
	// starts the profiler listener that reports them).
	AllocsPerReq float64 `json:"serverAllocsPerReq,omitempty"`
	// idle scenarios
	Tabs         int     `json:"tabs,omitempty"`
	RSSMintMiB   float64 `json:"rssAfterMintMiB,omitempty"`
	RSSPairedMiB float64 `json:"rssPairedMiB,omitempty"`
	RSSPerTabKiB float64 `json:"rssPerTabKiB,omitempty"`
	// After a GC triggered through the profiler listener (the runtime runs
	// one at least every two minutes; until then freed stacks and garbage
	// of the pairing burst can stay resident).
	RSSPerTabGCKiB float64 `json:"rssPerTabAfterGcKiB,omitempty"`
	IdleCPUPerTab  float64 `json:"idleCpuUsPerTabPerSec,omitempty"`
}

// Report is the JSON file.
type Report struct {
	Started   time.Time `json:"started"`
	GoVersion string    `json:"goVersion"`
	CPUs      int       `json:"cpus"`
	CPUModel  string    `json:"cpuModel"`
	LoadAvg   string    `json:"loadAvgAtStart"`
	Args      []string  `json:"args"`
	StateB    int       `json:"stateBytes"`
	Results   []Result  `json:"results"`
	Medians   []Result  `json:"medians"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	bin := o.lapd
	if bin == "" {
		dir, err := os.MkdirTemp("", "lapbench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		fmt.Fprintln(stderr, "building lapd (without -race)…")
		if bin, err = buildLapd(dir); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	res := newResults(o.stateBytes)
	rep := Report{Started: time.Now(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), CPUModel: cpuModel(),
		LoadAvg: loadAvg(), Args: args, StateB: res.stateBytes}
	b := &bench{o: o, bin: bin, self: self, res: &res, log: stderr}
	defer func() {
		if b.nats != nil {
			b.nats.stop()
		}
	}()
	for r := 1; r <= o.runs; r++ {
		for _, name := range o.scenarios {
			sc, _ := parseScenario(name)
			cfgs := o.configs
			if sc.Kind == "floor" {
				cfgs = []string{"floor"}
			}
			if r%2 == 0 { // alternate the order of configurations between runs
				cfgs = slices.Clone(cfgs)
				slices.Reverse(cfgs)
			}
			for _, cn := range cfgs {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				fmt.Fprintf(stderr, "run %d/%d  %-11s %-14s ", r, o.runs, sc.Name, cn)
				out, err := b.scenario(ctx, sc, cn)
				out.Scenario, out.Config, out.Run = sc.Name, cn, r
				if err != nil {
					fmt.Fprintln(stderr, "FAILED:", err)
					out.FirstErr = err.Error()
					out.Errors++
				} else {
					fmt.Fprintln(stderr, brief(out))
				}
				rep.Results = append(rep.Results, out)
			}
		}
	}
	rep.Medians = medians(rep.Results)
	fmt.Fprint(stdout, markdown(rep))
	if o.jsonOut != "" {
		j, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonOut, j, 0o644); err != nil {
			return err
		}
	}
	for _, r := range rep.Results {
		if r.Errors > 0 {
			return fmt.Errorf("%s/%s had %d errors (first: %s)", r.Scenario, r.Config, r.Errors, r.FirstErr)
		}
	}
	return nil
}

func brief(r Result) string {
	if r.Tabs > 0 {
		return fmt.Sprintf("%d tabs: %.1f KiB RSS per tab (%.1f → %.1f MiB)", r.Tabs, r.RSSPerTabKiB, r.RSSMintMiB, r.RSSPairedMiB)
	}
	s := fmt.Sprintf("%8.0f req/s  p50 %6.0f µs  p99 %6.0f µs  cpu/req %.3f ms  rss %.0f MiB  audit/req %.2f  errors %d",
		r.ReqPerS, r.P50us, r.P99us, r.CPUms, r.RSSMiB, r.AuditPerReq, r.Errors)
	if r.AllocsPerReq > 0 {
		s += fmt.Sprintf("  allocs/req %.0f", r.AllocsPerReq)
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return ""
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
