package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
)

// BenchmarkMCP measures one `observe` against a paired fake tab, three ways,
// in the same run against the same `lapd serve` (built without -race):
//
//	LAP    POST /agent/lap/v1/observe with lap.NewHTTPClient (the floor)
//	HTTP   the observe tool over /agent/mcp (Streamable HTTP, mcp-go client)
//	HTTPRaw the same call as one plain JSON-RPC POST whose response is read
//	       as bytes, as the LAP client reads its: the server's share alone
//	Stdio  the observe tool through a `lapd mcp` child process (stdio),
//	       which itself calls LAP over HTTP
//
// Each reports ns/op and p50-µs (median of per-op durations); the parent
// logs the MCP/LAP p50 ratios. Latency figures are steadier pinned to one
// CPU:
//
//	taskset -c 0 go test ./e2e -run '^$' -bench MCP -benchtime 2000x
//
// It runs twice: with the fake tab's demo state (a ~1.5 KB observation)
// and with 10 KiB of state (the load tool's size).
// LAPD_BENCH_STORE=memory runs the server with the memory token store.
// The LAP client returns the body as raw bytes while mcp-go's client decodes
// the whole CallToolResult, so the HTTP and Stdio figures include that
// decoding too; HTTPRaw does not.
func BenchmarkMCP(b *testing.B) {
	bin := mcpBenchBinary(b)
	s := mcpBenchServer(b, bin)
	b.Run("demo", func(b *testing.B) { mcpBenchObserve(b, bin, s) })
	b.Run("10KiB", func(b *testing.B) { mcpBenchObserve(b, bin, s, lapdtest.WithState(mcpBenchState(10<<10))) })
}

// mcpBenchState is a task-board state of about n bytes of JSON.
func mcpBenchState(n int) map[string]any {
	var tasks []any
	size := 60
	for i := 1; size < n; i++ {
		t := map[string]any{"id": float64(i), "title": "Task number " + strconv.Itoa(i) + ": write the quarterly report draft", "column": "todo", "done": false}
		raw, _ := json.Marshal(t)
		size += len(raw) + 1
		tasks = append(tasks, t)
	}
	return map[string]any{"count": 0.0, "todos": tasks}
}

func mcpBenchObserve(b *testing.B, bin string, s *server, opts ...lapdtest.Option) {
	_, m := mcpTab(b, s, opts...)
	ctx := context.Background()
	p50 := map[string]float64{}

	b.Run("LAP", func(b *testing.B) {
		c := lap.NewHTTPClient(&http.Client{})
		p50["LAP"] = mcpMeasure(b, func() error {
			_, err := c.Call(ctx, m.LapURL, m.Token, "/observe", nil)
			return err
		}, s)
	})
	observe := func(c *client.Client, h string) func() error {
		req := mcpgo.CallToolRequest{}
		req.Params.Name = "observe"
		req.Params.Arguments = map[string]any{"session": h}
		return func() error {
			res, err := c.CallTool(ctx, req)
			if err == nil && res.IsError {
				b.Fatalf("observe: %+v", res.Content)
			}
			return err
		}
	}
	b.Run("HTTP", func(b *testing.B) {
		c := mcpDialHTTP(b, s, false)
		h, _ := mcpConnect(b, c, m)
		p50["HTTP"] = mcpMeasure(b, observe(c, h), s)
	})
	b.Run("HTTPRaw", func(b *testing.B) {
		c := mcpDialHTTP(b, s, true) // legacy: the MCP session id is all a raw call needs
		h, _ := mcpConnect(b, c, m)
		p50["HTTPRaw"] = mcpMeasure(b, mcpRawCall(b, s.URL+"/agent/mcp", c.GetSessionId(), `{"name":"observe","arguments":{"session":"`+h+`"}}`), s)
	})
	b.Run("Stdio", func(b *testing.B) {
		c := mcpDialStdioBin(b, bin, s)
		h, _ := mcpConnect(b, c, m)
		p50["Stdio"] = mcpMeasure(b, observe(c, h), s)
	})
	if p50["LAP"] > 0 {
		b.Logf("p50 µs: LAP %.0f, MCP HTTP %.0f (%.2f× LAP), raw %.0f (%.2f× LAP), MCP stdio %.0f (%.2f× LAP)",
			p50["LAP"], p50["HTTP"], p50["HTTP"]/p50["LAP"], p50["HTTPRaw"], p50["HTTPRaw"]/p50["LAP"], p50["Stdio"], p50["Stdio"]/p50["LAP"])
	}
}

// mcpRawCall returns an op that POSTs one tools/call (params as given) on a
// legacy MCP session and reads the response as bytes, checking only that it
// is a result and not an error.
func mcpRawCall(b *testing.B, url, session, params string) func() error {
	hc := &http.Client{}
	var id int
	return func() error {
		id++
		body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":` + params + `}`
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20251125)
		req.Header.Set("Mcp-Session-Id", session)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !bytes.Contains(raw, []byte(`"result":`)) || bytes.Contains(raw, []byte(`"isError":true`)) {
			b.Fatalf("raw tools/call: %d %.300s", resp.StatusCode, raw)
		}
		return nil
	}
}

// mcpMeasure runs op b.N times, reports p50-µs and returns it.
// With s set it also reports the CPU time `lapd serve` spent per op
// (utime+stime from /proc, so other load on the machine does not count).
func mcpMeasure(b *testing.B, op func() error, s ...*server) float64 {
	b.Helper()
	for range 50 { // warm connections, pools and the JIT-free caches
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	d := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	var cpu0 time.Duration
	if len(s) > 0 {
		cpu0 = procCPU(b, s[0].cmd.Process.Pid)
	}
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.StopTimer()
	if len(s) > 0 {
		b.ReportMetric(float64((procCPU(b, s[0].cmd.Process.Pid)-cpu0).Nanoseconds())/1e3/float64(b.N), "server-cpu-µs/op")
	}
	slices.Sort(d)
	p := float64(d[len(d)/2].Nanoseconds()) / 1e3
	b.ReportMetric(p, "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1e3, "p99-µs")
	return p
}

// procCPU is the user+system CPU time of process pid so far (Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatalf("reading the server's CPU time: %v", err)
	}
	// fields after the ")" that ends the command name: state is field 3,
	// utime 14 and stime 15 (in clock ticks, 100 per second on Linux)
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// mcpBenchStore is LAPD_BENCH_STORE (sqlite or memory), default sqlite,
// so the token store's share of a call can be told apart.
func mcpBenchStore() string {
	if s := os.Getenv("LAPD_BENCH_STORE"); s != "" {
		return s
	}
	return "sqlite"
}

var (
	benchBinOnce sync.Once
	benchBin     string
	benchBinErr  error
)

// mcpBenchBinary builds lapd without -race once, next to the race binary
// (TestMain removes that directory).
func mcpBenchBinary(b *testing.B) string {
	b.Helper()
	benchBinOnce.Do(func() {
		benchBin = filepath.Join(filepath.Dir(lapdBin), "lapd-bench")
		out, err := exec.Command("go", "build", "-o", benchBin, "../cmd/lapd").CombinedOutput()
		if err != nil {
			benchBinErr = err
			b.Logf("%s", out)
		}
	})
	if benchBinErr != nil {
		b.Fatalf("building lapd without -race: %v", benchBinErr)
	}
	return benchBin
}

// mcpBenchServer runs `lapd serve` from bin (no rate limit, no audit sinks,
// info logs, which name the port) like startServer does for the race binary.
func mcpBenchServer(b *testing.B, bin string) *server {
	b.Helper()
	dataDir := b.TempDir()
	return runServer(b, bin, dataDir, "--addr", "127.0.0.1:0", "--data-dir", dataDir,
		"--log-level", "info", "--audit", "none", "--lap-rate", "1000000000", "--demo=false", "--store", mcpBenchStore())
}
