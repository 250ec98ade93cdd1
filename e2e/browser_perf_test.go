package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
)

// TestBrowserPerf measures (it does not assert) what one send_message costs
// end to end — MCP call → lapd → WebSocket → lapd.js in Chromium → the app's
// handler and render → reply — and lapd.js's own share of it (agent.stats()).
// It uses a lapd built without -race so the figures mean something:
//
//	go test ./e2e -run TestBrowserPerf -v
func TestBrowserPerf(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	// Not parallel: while this top-level test runs, no parallel e2e test
	// does, so swapping the binary they start is safe.
	raceBin := lapdBin
	lapdBin = browserBuildPlain(t)
	t.Cleanup(func() { lapdBin = raceBin })

	srv := startServer(t, "", "--lap-rate", "100000", "--log-level", "info", "--tools", "all") // query_state
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)

	const n = 50
	tasks := 3
	type agentStats struct {
		RPCCount         int     `json:"rpcCount"`
		RPCHandleMsTotal float64 `json:"rpcHandleMsTotal"`
		RPCHandleMsP50   float64 `json:"rpcHandleMsP50"`
	}
	stats := func() agentStats {
		var s agentStats
		tab.eval(`window.__lapd.stats()`, &s)
		return s
	}
	batch := func(mc *mcpclient.Client, sess, label string, extra map[string]any) {
		t.Helper()
		for i := 0; i < 5; i++ { // warm up
			a := map[string]any{"session": sess, "msg": map[string]any{"type": "setFilter", "filter": "all"}}
			browserOK(t, mc, "send_message", a)
		}
		before := stats()
		d := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			a := map[string]any{"session": sess, "msg": map[string]any{"type": "addTask", "title": fmt.Sprintf("%s %d", label, i)}}
			for k, v := range extra {
				a[k] = v
			}
			start := time.Now()
			sc := browserOK(t, mc, "send_message", a)
			d = append(d, time.Since(start))
			if sc["status"] != "dispatched" {
				t.Fatalf("send_message: %s", browserJSON(sc))
			}
		}
		tasks += n
		tab.waitJS(fmt.Sprintf(`document.querySelectorAll('#board li.task').length === %d`, tasks), 5*time.Second)
		after := stats()
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		rpcs := after.RPCCount - before.RPCCount
		t.Logf("PERF %-34s send_message round trip over %d calls: p50 %v, p90 %v, min %v, max %v; lapd.js per rpc: mean %.3f ms over %d rpcs, p50 (last 1000) %.3f ms",
			label, n, d[n/2].Round(10*time.Microsecond), d[n*9/10].Round(10*time.Microsecond), d[0].Round(10*time.Microsecond), d[n-1].Round(10*time.Microsecond),
			(after.RPCHandleMsTotal-before.RPCHandleMsTotal)/float64(max(rpcs, 1)), rpcs, after.RPCHandleMsP50)
	}

	// A read for comparison: the same chain without a dispatch.
	reads := func(mc *mcpclient.Client, sess, label string) {
		t.Helper()
		d := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			start := time.Now()
			browserOK(t, mc, "query_state", map[string]any{"session": sess, "path": "/filter"})
			d = append(d, time.Since(start))
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		t.Logf("PERF %-34s query_state round trip over %d calls: p50 %v, p90 %v", label, n, d[n/2].Round(10*time.Microsecond), d[n*9/10].Round(10*time.Microsecond))
		// A send_message the server's policy refuses (human-only) never reaches the tab.
		d = d[:0]
		for i := 0; i < n; i++ {
			start := time.Now()
			r := browserCall(t, mc, "send_message", map[string]any{"session": sess, "msg": map[string]any{"type": "resetDemo"}})
			d = append(d, time.Since(start))
			if r.IsError || r.SC["reason"] != "human-only" {
				t.Fatalf("resetDemo: %s", r.Text)
			}
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		t.Logf("PERF %-34s refused send_message round trip over %d calls: p50 %v, p90 %v", label, n, d[n/2].Round(10*time.Microsecond), d[n*9/10].Round(10*time.Microsecond))
	}

	connect := func(mc *mcpclient.Client) string {
		sc := browserOK(t, mc, "connect_session", map[string]any{"line": line})
		s, _ := sc["session"].(string)
		if !strings.HasPrefix(s, "s_") {
			t.Fatalf("connect_session: %s", browserJSON(sc))
		}
		return s
	}
	httpMC := browserMCPHTTP(t, srv.URL)
	httpSess := connect(httpMC)
	tab.waitStatus("active", 10*time.Second)
	reads(httpMC, httpSess, "http, read")
	batch(httpMC, httpSess, "http, default drain (quiet 100 ms)", nil)
	batch(httpMC, httpSess, "http, drainQuietMs 0", map[string]any{"drainQuietMs": 0})
	batch(httpMC, httpSess, "http, waitFor idle", map[string]any{"waitFor": "idle"})

	stdioMC := browserMCPStdio(t, "--tools", "all")
	stdioSess := connect(stdioMC)
	reads(stdioMC, stdioSess, "stdio, read")
	batch(stdioMC, stdioSess, "stdio, default drain (quiet 100 ms)", nil)
	batch(stdioMC, stdioSess, "stdio, drainQuietMs 0", map[string]any{"drainQuietMs": 0})
	batch(stdioMC, stdioSess, "stdio, waitFor idle", map[string]any{"waitFor": "idle"})
}
