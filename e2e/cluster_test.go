package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestCluster is the multi-process cluster: a real nats-server (built from
// its Go module, or $LAPD_NATS_SERVER, e.g. Debian's /usr/bin/nats-server),
// three `lapd serve --nats` processes and a small round-robin reverse proxy
// (WebSocket pass-through) as the load balancer. The demo runs in real
// headless Chromium through the proxy; mcp-go's client drives it through a
// node that does not hold the tab. Then the tab's node is killed (-9): the
// tab re-pairs elsewhere, the pending approval is still there and is
// answered in the panel; then every node is restarted in turn under light
// load, and nothing acknowledged is lost or done twice.
//
//	go test ./e2e -run TestCluster -v
func TestCluster(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	natsURL := startNATS(t)
	var ns [3]*server
	addrs := [3]string{browserFreeAddr(t), browserFreeAddr(t), browserFreeAddr(t)}
	dirs := [3]string{t.TempDir(), t.TempDir(), t.TempDir()}
	start := func(i int) {
		ns[i] = startServer(t, dirs[i], "--addr", addrs[i], "--nats", natsURL, "--node-id", fmt.Sprint("n", i),
			"--lap-rate", "6000", "--grace", "60s", "--log-level", "info")
	}
	for i := range ns {
		start(i)
	}
	lb := newBalancer(t, addrs[:])

	// 1. The human opens the app through the load balancer and connects.
	tab := browserOpen(t, lb.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)
	if !strings.Contains(line, "url="+lb.URL+"/agent/lap/v1 token=agt_") {
		t.Fatalf("connect line %q does not name the load balancer", line)
	}
	owner := lb.wsBackend()
	mcpNode := (owner + 1) % 3
	t.Logf("tab on node %d, MCP client on node %d", owner, mcpNode)

	// 2. The model, on another node, connects and works.
	mc := browserMCPHTTP(t, ns[mcpNode].URL)
	conn := browserOK(t, mc, "connect_session", map[string]any{"line": line})
	sess, _ := conn["session"].(string)
	args := func(kv ...any) map[string]any {
		m := map[string]any{"session": sess}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tab.waitStatus("active", 10*time.Second)
	sent := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Across nodes"}))
	if sent["status"] != "dispatched" || !browserHasDiff(sent["stateDiff"], "/tasks/3", "Across nodes") {
		t.Fatalf("send_message across nodes: %s", browserJSON(sent))
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 4`, 5*time.Second)
	browserOK(t, mc, "narrate", args("text", "Hello from another node"))
	tab.waitJS(browserTestID("feed")+`.textContent.includes('Hello from another node')`, 10*time.Second)

	// wait_for_change: the human ticks a box until the long poll returns.
	wres := waitWhileTicking(t, tab, mc, args("path", "/tasks", "timeoutMs", 15000))
	if wres.IsError || wres.SC["status"] != "changed" {
		t.Fatalf("wait_for_change: %v %s", wres.IsError, wres.Text)
	}

	// Approval clicked in the panel, answer read on the model's node.
	pend := browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "addTask", "title": "Keep"}))
	_ = pend
	pend = browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "approvalTimeoutMs", 0))
	cid, _ := pend["confirmId"].(string)
	if pend["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("clearAll: %s", browserJSON(pend))
	}
	tab.waitJS(`!!`+browserTestID("reject-"+cid), 10*time.Second)
	tab.click(browserTestID("reject-" + cid))
	r := browserCall(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if r.IsError || r.SC["status"] != "rejected" {
		t.Fatalf("get_confirm_result after reject in the panel: %v %s", r.IsError, r.Text)
	}

	// 3. A pending approval, then kill -9 of the tab's node.
	pend = browserOK(t, mc, "send_message", args("msg", map[string]any{"type": "clearAll"}, "approvalTimeoutMs", 0))
	cid, _ = pend["confirmId"].(string)
	tab.waitJS(`!!`+browserTestID("approve-"+cid), 10*time.Second)
	if err := ns[owner].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-ns[owner].done
	killed := time.Now()
	lb.setDown(owner, true)
	// The tab reconnects through the balancer to a live node, within the grace.
	waitCond(t, "the tab to re-pair with another node", 30*time.Second, func() bool {
		b := lb.wsBackend()
		return b != owner && lb.wsUpgrades() >= 2
	})
	tab.waitStatus("active", 30*time.Second)
	t.Logf("tab re-paired with node %d %v after the kill", lb.wsBackend(), time.Since(killed).Round(time.Millisecond))
	// The approval is still there (re-delivered by the new node); the human approves it.
	tab.waitJS(`!!`+browserTestID("approve-"+cid), 15*time.Second)
	tab.click(browserTestID("approve-" + cid))
	got := browserOK(t, mc, "get_confirm_result", args("confirmId", cid, "timeoutMs", 10000))
	if got["status"] != "confirmed" {
		t.Fatalf("get_confirm_result after the kill: %s", browserJSON(got))
	}
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	// Bring the killed node back (a new process on the same port).
	start(owner)
	lb.setDown(owner, false)

	// 4. Rolling restart of all three nodes under light load, over LAP
	// through the balancer with idempotency keys, as a careful client does.
	var tid string
	tab.eval(`window.__lapd.session.tid`, &tid)
	token := strings.TrimSpace(line[strings.Index(line, "token=")+len("token="):])
	load := newLoad(lb.URL, token)
	stopLoad := load.run()
	for i := range ns {
		ns[i].stop(t)
		start(i)
		waitCond(t, "the load to go on", 30*time.Second, func() bool { return load.acked.Load() > int64(3*(i+1)) })
	}
	acked, unknown := stopLoad()
	if len(acked) == 0 {
		t.Fatal("no call succeeded during the rolling restart")
	}
	tab.waitStatus("active", 30*time.Second)
	var titles []string
	tab.eval(`[...document.querySelectorAll('#board li.task .title')].map((e) => e.textContent)`, &titles)
	count := map[string]int{}
	for _, ti := range titles {
		count[ti]++
	}
	for _, k := range acked {
		if count[k] != 1 {
			t.Errorf("acknowledged task %q is on the board %d times, want 1", k, count[k])
		}
	}
	for _, k := range unknown {
		if count[k] > 1 {
			t.Errorf("task %q (outcome unknown to the client) is on the board %d times", k, count[k])
		}
	}
	for ti, n := range count {
		if n > 1 {
			t.Errorf("task %q dispatched %d times", ti, n)
		}
	}
	t.Logf("rolling restart: %d calls acknowledged, %d in doubt, %d retries; board has %d tasks", len(acked), len(unknown), load.retries.Load(), len(titles))

	// 5. One audit trail for the cluster: lapd audit --nats reads what
	// every node recorded for the session (the killed node's entries up to
	// the kill included).
	out, err := exec.Command(lapdBin, "audit", "--nats", natsURL, "--tid", tid, "--limit", "0", "--format", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("lapd audit --nats: %v\n%s", err, out)
	}
	events := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var e struct{ Event string }
		if json.Unmarshal([]byte(l), &e) == nil {
			events[e.Event]++
		}
	}
	for _, ev := range []string{"mint", "confirm-proposed", "confirm-approved", "confirm-rejected", "msg-dispatched", "disconnect"} {
		if events[ev] == 0 {
			t.Errorf("lapd audit --nats has no %s entry for the session: %v", ev, events)
		}
	}
	if events["msg-dispatched"] < len(acked) {
		t.Errorf("lapd audit --nats: %d msg-dispatched entries, want at least the %d acknowledged", events["msg-dispatched"], len(acked))
	}
}

// waitCond polls cond (state in other processes: no signal to await).
func waitCond(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// natsServerBin is $LAPD_NATS_SERVER, or nats-server built from the Go
// module lapd's tests already depend on (so CI needs no package for it).
func natsServerBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LAPD_NATS_SERVER"); p != "" {
		needTool(t, "nats-server", p)
		return p
	}
	natsOnce.Do(func() {
		natsPath = filepath.Join(filepath.Dir(lapdBin), "nats-server") // removed with lapd's build dir
		b := exec.Command("go", "build", "-o", natsPath, "github.com/nats-io/nats-server/v2")
		var out bytes.Buffer
		b.Stdout, b.Stderr = &out, &out
		if err := b.Run(); err != nil {
			natsErr = fmt.Errorf("building nats-server: %v\n%s", err, out.String())
		}
	})
	if natsErr != nil {
		t.Fatal(natsErr)
	}
	return natsPath
}

var (
	natsOnce sync.Once
	natsPath string
	natsErr  error
)

// startNATS runs a real nats-server with JetStream on a free port.
func startNATS(t *testing.T) string {
	t.Helper()
	addr := browserFreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	return runNATS(t, addr, "-a", "127.0.0.1", "-p", port, "-js", "-sd", t.TempDir())
}

// runNATS runs nats-server with args, waits until it accepts connections on
// addr and stops it on cleanup; it returns its nats:// URL.
func runNATS(t *testing.T, addr string, args ...string) string {
	t.Helper()
	cmd := exec.Command(natsServerBin(t), args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	waitCond(t, "nats-server to listen on "+addr, 20*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		select {
		case <-done:
			t.Fatalf("nats-server exited:\n%s", out.String())
		default:
		}
		return false
	})
	return "nats://" + addr
}

// balancer is the test's load balancer: round-robin over the backends that
// are up, WebSocket upgrades passed through (httputil.ReverseProxy), the
// Host header kept (lapd builds the URLs it hands out from it).
type balancer struct {
	*httptest.Server
	backends []*url.URL
	next     atomic.Uint64
	mu       sync.Mutex
	down     map[int]bool
	ws       int // backend of the latest WebSocket upgrade
	upgrades int
}

func newBalancer(t *testing.T, addrs []string) *balancer {
	lb := &balancer{down: map[int]bool{}, ws: -1}
	for _, a := range addrs {
		lb.backends = append(lb.backends, &url.URL{Scheme: "http", Host: a})
	}
	lb.Server = httptest.NewServer(http.HandlerFunc(lb.serve))
	t.Cleanup(lb.Close)
	return lb
}

func (lb *balancer) setDown(i int, down bool) {
	lb.mu.Lock()
	lb.down[i] = down
	lb.mu.Unlock()
}

func (lb *balancer) wsBackend() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.ws
}

func (lb *balancer) wsUpgrades() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.upgrades
}

// pick returns the next backend that accepts a connection (a health check
// as a real balancer makes), or -1.
func (lb *balancer) pick() int {
	n := len(lb.backends)
	for range n {
		i := int(lb.next.Add(1) % uint64(n))
		lb.mu.Lock()
		down := lb.down[i]
		lb.mu.Unlock()
		if down {
			continue
		}
		c, err := net.DialTimeout("tcp", lb.backends[i].Host, 200*time.Millisecond)
		if err != nil {
			continue
		}
		c.Close()
		return i
	}
	return -1
}

func (lb *balancer) serve(w http.ResponseWriter, r *http.Request) {
	i := lb.pick()
	if i < 0 {
		http.Error(w, "no backend", http.StatusBadGateway)
		return
	}
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(lb.backends[i])
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if upgrade && res.StatusCode == http.StatusSwitchingProtocols {
				lb.mu.Lock()
				lb.ws = i
				lb.upgrades++
				lb.mu.Unlock()
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "backend: "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// load sends addTask over LAP through the balancer, one call at a time,
// each with its own idempotency key, retrying a key (with the same key)
// until it gets an answer, as the stdio bridge does.
type load struct {
	base, token string
	acked       atomic.Int64
	retries     atomic.Int64
	mu          sync.Mutex
	ok, doubt   []string
}

func newLoad(base, token string) *load { return &load{base: base + "/agent/lap/v1", token: token} }

func (l *load) run() (stop func() (acked, unknown []string)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ctx.Err() == nil; n++ {
			title := fmt.Sprint("load-", n)
			switch l.send(ctx, title) {
			case "ok":
				l.mu.Lock()
				l.ok = append(l.ok, title)
				l.mu.Unlock()
				l.acked.Add(1)
			default:
				l.mu.Lock()
				l.doubt = append(l.doubt, title)
				l.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond): // light load: about 15 calls a second
			}
		}
	}()
	return func() ([]string, []string) {
		cancel()
		<-done
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.ok, l.doubt
	}
}

// send dispatches one task and returns "ok", or "unknown" when the client
// cannot tell (409 outcome-unknown, or it gave up).
func (l *load) send(ctx context.Context, title string) string {
	body, _ := json.Marshal(map[string]any{"msg": map[string]any{"type": "addTask", "title": title}, "idempotencyKey": "k-" + title})
	for attempt := 0; attempt < 200; attempt++ {
		if attempt > 0 {
			l.retries.Add(1)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				// Finish this key: the caller stops only between keys.
				if attempt > 100 {
					return "unknown"
				}
			}
		}
		req, _ := http.NewRequest("POST", l.base+"/message", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+l.token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(bufio.NewReader(res.Body))
		res.Body.Close()
		switch {
		case res.StatusCode == 200 && bytes.Contains(b, []byte(`"dispatched"`)):
			return "ok"
		case res.StatusCode == 409:
			return "unknown"
		}
	}
	return "unknown"
}
