package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// TestClusterSeparateHosts runs the cluster as on three machines: each
// `lapd serve --nats` in a Linux network namespace of its own (its own
// loopback, interfaces and ports), joined by veth pairs to a bridge in the
// test's namespace, where nats-server and the tab are. Hosts 0 and 1 listen
// for the peer link on their addresses, so it speaks TLS (its "auto"
// default), as between machines; host 2 keeps the default, its own
// loopback, which the others must not dial (their 127.0.0.1 is their own):
// its tab's calls go by NATS, without a warning. Then the tab's host is cut off the network
// without a reset (its link set down: a machine that lost power, a cable
// pulled), which loopback cannot show:
//
//   - a long poll forwarded to it from another host ends within seconds
//     (TCP keep-alive and TCP_USER_TIMEOUT on the link): 503 paused, where
//     it used to wait out its timeout, a minute;
//   - a new call says the tab's node did not answer (not "not connected",
//     which would have the model ask the user to open an open tab);
//   - the tab connects again to another host (as lapd.js does through a
//     load balancer), and calls from the third host reach it;
//   - the cut-off host notices it lost NATS (its pings);
//
// then the link comes back: the cut-off host closes its stale socket (4002)
// and forwards its calls to the tab's new host.
//
// It needs root (network namespaces) and iproute2's ip; under CI (root)
// both must be there.
func TestClusterSeparateHosts(t *testing.T) {
	hn := newHostNet(t, 3)
	natsURL := startNATSOn(t, hn.gw)
	var hosts [3]*server
	for i := range hosts {
		dir := t.TempDir()
		args := []string{"netns", "exec", hn.ns[i], lapdBin, "serve",
			"--addr", hn.ip[i] + ":8780", "--data-dir", dir, "--nats", natsURL, "--node-id", fmt.Sprint("h", i),
			"--allow-anonymous", "true", "--lap-rate", "6000", "--log-level", "info"}
		if i < 2 { // host 2 keeps the default: a loopback link, which only NATS can reach from elsewhere
			args = append(args, "--peer-listen", hn.ip[i]+":7422")
		}
		hosts[i] = launchCmd(t, exec.Command("ip", args...), dir)
	}
	for i, h := range hosts {
		h.awaitListening(t)
		waitCond(t, "the peer link's start line", 10*time.Second, func() bool { return strings.Contains(h.stderr.String(), "cluster peer link") })
		if want := i < 2; strings.Contains(h.stderr.String(), "tls=true") != want {
			t.Fatalf("host %d: the peer link's TLS is not %v (on between hosts, off on loopback):\n%s", i, want, h.stderr.String())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// A tab on host 2, whose link listens on its own loopback: host 0 does
	// not dial "127.0.0.1:…" (that is its own loopback), it goes by NATS.
	other, err := lapdtest.Mint(ctx, nil, hosts[2].URL+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	otherTab, err := other.Pair(ctx, lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer otherTab.Close()
	for range 3 {
		if st, b, err := hostsPost(ctx, hosts[0].URL+"/agent/lap/v1/observe", other.Token, map[string]any{}); err != nil || st != 200 {
			t.Fatalf("/observe via host 0 for the tab on host 2 = %d %s %v", st, b, err)
		}
	}
	if log := hosts[0].stderr.String(); strings.Contains(log, "cannot reach a node directly") || !strings.Contains(log, "listens on loopback on another machine") {
		t.Fatalf("host 0 tried host 2's loopback link, or did not say why it does not:\n%s", log)
	}

	// A tab on host 0; calls through hosts 1 and 2 reach it over TLS.
	sess, err := lapdtest.Mint(ctx, nil, hosts[0].URL+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := sess.Pair(ctx, lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	lap := func(h int, route string, body any) (int, []byte) {
		st, b, err := hostsPost(ctx, hosts[h].URL+"/agent/lap/v1"+route, sess.Token, body)
		if err != nil {
			t.Fatalf("%s via host %d: %v", route, h, err)
		}
		return st, b
	}
	for _, h := range []int{1, 2} {
		if st, b := lap(h, "/observe", map[string]any{}); st != 200 {
			t.Fatalf("/observe via host %d = %d %s", h, st, b)
		}
	}

	// A long poll from host 1, forwarded to host 0; then host 0's link
	// goes down.
	type answer struct {
		st  int
		b   []byte
		err error
	}
	polled := make(chan answer, 1)
	go func() {
		st, b, err := hostsPost(ctx, hosts[1].URL+"/agent/lap/v1/wait", sess.Token, map[string]any{"path": "/todos", "timeoutMs": 60000})
		polled <- answer{st, b, err}
	}()
	if st, b := lap(2, "/observe", map[string]any{}); st != 200 { // (the poll is on its way meanwhile)
		t.Fatalf("/observe via host 2 = %d %s", st, b)
	}
	cut := time.Now()
	hn.link(0, false)
	select {
	case a := <-polled:
		if a.err != nil {
			t.Fatalf("/wait via host 1: %v", a.err)
		}
		if a.st != 503 || hostsCode(a.b) != "paused" || !strings.Contains(string(a.b), "did not answer") {
			t.Fatalf("the long poll forwarded to the lost host = %d %s, want 503 paused saying its node did not answer", a.st, a.b)
		}
		t.Logf("the long poll forwarded to the lost host ended %v after the cut: %d %s", time.Since(cut).Round(time.Millisecond), a.st, a.b)
	case <-time.After(40 * time.Second): // its own timeout is 60 s
		t.Fatal("the long poll forwarded to the lost host is still waiting 40 s after the cut")
	}

	// A new call through host 2: the tab's node did not answer.
	st, b := lap(2, "/observe", map[string]any{})
	if st != 503 || hostsCode(b) != "paused" || !strings.Contains(string(b), "did not answer") {
		t.Fatalf("/observe via host 2 with the tab's host cut off = %d %s, want 503 paused saying its node did not answer", st, b)
	}

	// The tab connects again, to host 1 (lapd.js through a balancer).
	wsURL := strings.Replace(sess.WSURL, hn.ip[0], hn.ip[1], 1)
	tab2, err := lapdtest.Dial(ctx, wsURL, sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatalf("the tab reconnecting to host 1 with host 0 cut off: %v", err)
	}
	defer tab2.Close()
	waitCond(t, "a call via host 2 to reach the tab on host 1", 30*time.Second, func() bool {
		st, _ := lap(2, "/observe", map[string]any{})
		return st == 200
	})
	st, b = lap(2, "/message", map[string]any{"msg": map[string]any{"type": "addTodo", "title": "after the cut"}})
	if st != 200 || !strings.Contains(string(b), `"dispatched"`) {
		t.Fatalf("/message via host 2 to the tab on host 1 = %d %s", st, b)
	}

	// Host 0 notices it lost NATS (pings every 5 s; nats.go's default
	// would take up to 6 minutes).
	waitCond(t, "host 0 to notice it lost NATS", 60*time.Second, func() bool {
		return strings.Contains(hosts[0].stderr.String(), "nats: disconnected")
	})

	// The link comes back: host 0 lets go of its stale socket, and its
	// calls reach the tab on host 1.
	hn.link(0, true)
	select {
	case <-tab.Done():
		// 4002 superseded when host 0 learns of the takeover; 4408 if its
		// heartbeats gave up on the socket first (a long cut).
		if c := tab.CloseStatus(); c != 4002 && c != 4408 {
			t.Fatalf("host 0 closed the stale socket with %d, want 4002 superseded (or 4408)", c)
		}
		t.Logf("host 0 closed the stale socket with %d", tab.CloseStatus())
	case <-time.After(90 * time.Second): // (the close frame waits for TCP's next retransmission after the cut: its backoff reaches tens of seconds)
		t.Fatal("host 0 still holds the stale socket 90 s after the link came back")
	}
	waitCond(t, "a call via host 0 to reach the tab on host 1", 30*time.Second, func() bool {
		st, _ := lap(0, "/observe", map[string]any{})
		return st == 200
	})
	if st, b := lap(0, "/state", map[string]any{"path": "/todos"}); st != 200 || !strings.Contains(string(b), "after the cut") {
		t.Fatalf("/state /todos via host 0 = %d %s, want the todo added while it was cut off", st, b)
	}
	select {
	case <-tab2.Done():
		t.Fatalf("the tab's socket on host 1 was closed (%d) after host 0 came back", tab2.CloseStatus())
	default:
	}
}

func hostsPost(ctx context.Context, url, token string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	rb, err := io.ReadAll(res.Body)
	return res.StatusCode, rb, err
}

func hostsCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

// hostNet is n network namespaces ("hosts"), each with one veth into a
// bridge in the test's namespace; gw is the bridge's address.
type hostNet struct {
	t      *testing.T
	bridge string
	gw     string
	ns     []string
	veth   []string // the bridge's end of each host's link
	ip     []string
}

func newHostNet(t *testing.T, n int) *hostNet {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("network namespaces are Linux's")
	}
	ipBin, _ := exec.LookPath("ip")
	needTool(t, "ip (iproute2)", ipBin)
	if os.Geteuid() != 0 {
		if inCI() {
			t.Fatal("this test makes network namespaces: run CI as root (it is on the CI machines)")
		}
		t.Skip("making network namespaces needs root")
	}
	id := os.Getpid() % 100000
	sub := fmt.Sprintf("10.%d.%d", 200+id%50, id/50%250)
	hn := &hostNet{t: t, bridge: fmt.Sprintf("lpb%d", id), gw: sub + ".1"}
	t.Cleanup(hn.teardown) // registered first: runs after the processes in it stopped
	hn.ip_("link", "add", hn.bridge, "type", "bridge")
	hn.ip_("addr", "add", hn.gw+"/24", "dev", hn.bridge)
	hn.ip_("link", "set", hn.bridge, "up")
	for i := range n {
		ns, veth, ip := fmt.Sprintf("lapd-e2e-%d-h%d", id, i), fmt.Sprintf("lpv%dh%d", id, i), fmt.Sprintf("%s.%d", sub, 11+i)
		hn.ns, hn.veth, hn.ip = append(hn.ns, ns), append(hn.veth, veth), append(hn.ip, ip)
		hn.ip_("netns", "add", ns)
		hn.ip_("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		hn.ip_("link", "set", veth, "master", hn.bridge, "up")
		hn.ip_("-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		hn.ip_("-n", ns, "link", "set", "eth0", "up")
		hn.ip_("-n", ns, "link", "set", "lo", "up")
	}
	return hn
}

// link sets host i's link to the bridge up or down (down: its packets are
// dropped, nothing is reset).
func (hn *hostNet) link(i int, up bool) {
	state := "down"
	if up {
		state = "up"
	}
	hn.ip_("link", "set", hn.veth[i], state)
}

func (hn *hostNet) ip_(args ...string) {
	hn.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		if !inCI() && strings.Contains(string(out), "Operation not permitted") {
			hn.t.Skipf("ip %s: %s (no network namespaces here)", strings.Join(args, " "), out)
		}
		hn.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (hn *hostNet) teardown() {
	for i := range hn.ns {
		_ = exec.Command("ip", "netns", "del", hn.ns[i]).Run()
		_ = exec.Command("ip", "link", "del", hn.veth[i]).Run()
	}
	_ = exec.Command("ip", "link", "del", hn.bridge).Run()
}

// startNATSOn runs nats-server with JetStream on addr (the bridge), pinging
// its clients every 2 s so that a host cut off is dropped in seconds (its
// queue subscriptions would otherwise take requests for minutes; docs/
// CLUSTER.md gives operators the same advice).
func startNATSOn(t *testing.T, addr string) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(browserFreeAddr(t))
	hostport := net.JoinHostPort(addr, port)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	body := fmt.Sprintf("listen: %q\njetstream { store_dir: %q }\nping_interval: \"2s\"\nping_max: 2\n", hostport, t.TempDir())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return runNATS(t, hostport, "-c", conf)
}
