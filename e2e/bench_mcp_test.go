package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

// BenchmarkMCP measures one `observe` against a paired fake tab, three ways,
// in the same run against the same `lapd serve` (built without -race):
//
//	LAP    POST /agent/lap/v1/observe with lap.NewHTTPClient (the floor)
//	HTTP   the observe tool over /agent/mcp (Streamable HTTP, mcp-go client)
//	Stdio  the observe tool through a `lapd mcp` child process (stdio),
//	       which itself calls LAP over HTTP
//
// Each reports ns/op and p50-µs (median of per-op durations); the parent
// logs the MCP/LAP p50 ratios. Latency figures are steadier pinned to one
// CPU:
//
//	taskset -c 0 go test ./e2e -run '^$' -bench MCP -benchtime 2000x
//
// LAPD_BENCH_STORE=memory runs the server with the memory token store.
// The LAP client returns the body as raw bytes while mcp-go's client decodes
// the whole CallToolResult, so the MCP figures include that decoding too.
func BenchmarkMCP(b *testing.B) {
	bin := mcpBenchBinary(b)
	s := mcpBenchServer(b, bin)
	_, m := mcpTab(b, s)
	ctx := context.Background()
	p50 := map[string]float64{}

	b.Run("LAP", func(b *testing.B) {
		c := lap.NewHTTPClient(&http.Client{})
		p50["LAP"] = mcpMeasure(b, func() error {
			_, err := c.Call(ctx, m.LapURL, m.Token, "/observe", nil)
			return err
		})
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
		p50["HTTP"] = mcpMeasure(b, observe(c, h))
	})
	b.Run("Stdio", func(b *testing.B) {
		c := mcpDialStdioBin(b, bin, s)
		h, _ := mcpConnect(b, c, m)
		p50["Stdio"] = mcpMeasure(b, observe(c, h))
	})
	if p50["LAP"] > 0 {
		b.Logf("p50 µs: LAP %.0f, MCP HTTP %.0f (%.2f× LAP), MCP stdio %.0f (%.2f× LAP)",
			p50["LAP"], p50["HTTP"], p50["HTTP"]/p50["LAP"], p50["Stdio"], p50["Stdio"]/p50["LAP"])
	}
}

// mcpMeasure runs op b.N times, reports p50-µs and returns it.
func mcpMeasure(b *testing.B, op func() error) float64 {
	b.Helper()
	for range 50 { // warm connections, pools and the JIT-free caches
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	d := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(d)
	p := float64(d[len(d)/2].Nanoseconds()) / 1e3
	b.ReportMetric(p, "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1e3, "p99-µs")
	return p
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
