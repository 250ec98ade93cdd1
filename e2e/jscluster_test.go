package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/lapdtest"
)

// TestClusterJetStreamReplicas runs lapd on a real JetStream cluster: three
// nats-server processes on loopback (one cluster, JetStream on each) and
// three `lapd serve --nats-replicas 3` nodes started together, node i
// connected to server i. Every bucket and the audit stream have three
// replicas. The test moves the
// leadership of all four to server s0, pairs a tab with node n0 (the node on
// s0), works through the other nodes (calls forwarded to n0, a message, an
// approval left pending), then kills s0 with SIGKILL: the tab's node loses
// its server and every stream loses its leader at once. The two survivors
// are a quorum: the streams elect new leaders, n0 reconnects to a survivor,
// and the cluster goes on (a new session minted, paired and used; a node
// restarted; a revocation on one node seen on another) with nothing
// acknowledged before the kill lost (the first session's token, its tab,
// the pending approval), and every audit entry a node wrote, during the
// election too, in the cluster's stream.
//
//	go test ./e2e -run TestClusterJetStreamReplicas -v
func TestClusterJetStreamReplicas(t *testing.T) {
	srv := startJSCluster(t, 3)
	ctx := ctxT(t, 90*time.Second)
	nc, err := nats.Connect(srv[1].url+","+srv[2].url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	waitJetStream(t, js, len(srv))

	// The three nodes start together, as a shell loop starts them: each
	// creates the buckets and the stream, and all must come up.
	var ns [3]*server
	for i := range ns {
		dir := t.TempDir()
		ns[i] = launchServer(t, lapdBin, dir, "--addr", "127.0.0.1:0", "--data-dir", dir, "--nats", srv[i].url,
			"--nats-replicas", "3", "--node-id", fmt.Sprint("n", i), "--log-level", "info")
	}
	for _, s := range ns {
		s.awaitListening(t)
	}
	logs := append([]*server(nil), ns[:]...) // every node's log is printed if the test fails
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range logs {
				t.Logf("lapd %s:\n%s", s.URL, s.stderr.String())
			}
		}
	})
	streams := []string{"KV_lapd_tokens", "KV_lapd_confirm", "KV_lapd_mcp", "lapd_audit"}
	for _, name := range streams {
		info := streamInfo(t, js, name)
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s: %d replicas configured, cluster %+v; want 3 (a leader and 2 followers)", name, info.Config.Replicas, info.Cluster)
		}
	}
	// The worst server to lose: make s0 lead every stream.
	for _, name := range streams {
		moveLeader(t, nc, js, name, srv[0].name)
	}

	// Work before the kill: mint on n1, pair with n0, call through n1 and n2.
	sess, err := lapdtest.Mint(ctx, nil, ns[1].URL+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := lapdtest.Dial(ctx, ns[0].URL+"/agent/ws", sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	for _, s := range ns[1:] {
		if st, out := lapJS(t, s, sess.Token, "/observe", map[string]any{}); st != 200 {
			t.Fatalf("observe through %s (tab on n0) = %d %v", s.URL, st, out)
		}
	}
	if st, out := lapJS(t, ns[2], sess.Token, "/message", map[string]any{"msg": map[string]any{"type": "addTodo", "title": "before"}}); st != 200 || out["status"] != "dispatched" {
		t.Fatalf("message through n2 = %d %v", st, out)
	}
	st, out := lapJS(t, ns[1], sess.Token, "/message", map[string]any{"msg": map[string]any{"type": "clearAll"}, "approvalTimeoutMs": 0})
	cid, _ := out["confirmId"].(string)
	if st != 200 || out["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("clearAll through n1 = %d %v", st, out)
	}
	// The audit entries are published asynchronously: wait until the
	// stream has them, so that they were acknowledged before the kill.
	waitCond(t, "the audit stream to hold the session's entries", 20*time.Second, func() bool {
		trail, _ := clusterAudit(t, srv[1].url, sess.TID)
		var events []string
		for k := range trail {
			events = append(events, k.Event)
		}
		return hasEvents(events, "mint", "msg-dispatched", "confirm-proposed")
	})

	// Kill s0: n0's server and every stream's leader.
	if err := srv[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-srv[0].done
	killed := time.Now()
	// Calls right after the kill, while no stream has a leader (an election
	// takes seconds): whatever they answer, the node that answers audits
	// them, and those entries too must reach the cluster's trail.
	for _, s := range ns[1:] {
		st, _ := lapJS(t, s, sess.Token, "/observe", map[string]any{})
		t.Logf("observe through %s right after the kill: %d", s.URL, st)
	}

	// A new session: minted on n2 once the token bucket has a leader again
	// (until the survivors have elected one, the write fails).
	var sess2 lapdtest.Session
	var refused error
	waitCond(t, "a mint to succeed after the kill", 30*time.Second, func() bool {
		sess2, err = lapdtest.Mint(ctx, nil, ns[2].URL+"/agent/mint")
		if err != nil && refused == nil {
			refused = err
			t.Logf("a mint during the election: %v", err)
		}
		// A refusal while there is no leader says "retry" (503
		// unavailable, Retry-After), not "lapd failed" (500).
		if err != nil && !strings.Contains(err.Error(), "status 503") {
			t.Errorf("a mint during the election: %v, want 503 unavailable", err)
		}
		return err == nil
	})
	elected := time.Now()
	t.Logf("first mint after the kill of s0 (%v after it)", elected.Sub(killed).Round(time.Millisecond))
	// n0 reconnected to a surviving server: a call through n2 reaches its tab.
	waitCond(t, "a call forwarded to n0 to succeed", 30*time.Second, func() bool {
		st, _ := lapJS(t, ns[2], sess.Token, "/observe", map[string]any{})
		return st == 200
	})
	t.Logf("first forwarded call after the kill (%v after it)", time.Since(killed).Round(time.Millisecond))
	for _, name := range streams {
		var info *jetstream.StreamInfo
		waitCond(t, "a new leader for "+name, 30*time.Second, func() bool {
			info = streamInfo(t, js, name)
			return info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != srv[0].name
		})
		offline := 0
		for _, p := range info.Cluster.Replicas {
			if p.Offline || !p.Current {
				offline++
			}
		}
		if info.Config.Replicas != 3 || offline != 1 {
			t.Fatalf("stream %s after the kill: %d replicas, leader %s, peers %+v; want 3 with one offline", name, info.Config.Replicas, info.Cluster.Leader, info.Cluster.Replicas)
		}
		t.Logf("%s: leader %s after the kill", name, info.Cluster.Leader)
	}

	// A node restarted while s0 is down starts (its buckets and stream
	// are bound with three replicas while only two servers answer).
	ns[2].stop(t)
	ns[2] = startServer(t, "", "--nats", srv[2].url, "--nats-replicas", "3", "--node-id", "n2", "--log-level", "info")
	logs = append(logs, ns[2])

	// Nothing acknowledged was lost: the first session's token verifies on
	// every node (n2, restarted, read it from the two surviving servers),
	// and its pending approval, answered now in the tab on n0, is read as
	// confirmed on n2.
	for _, s := range ns {
		if st, out := lapJS(t, s, sess.Token, "/state", map[string]any{}); st != 200 {
			t.Fatalf("the first session's token on %s after the kill = %d %v", s.URL, st, out)
		}
	}
	if err := tab.Approve(ctx, cid); err != nil {
		t.Fatal(err)
	}
	st, out = lapJS(t, ns[2], sess.Token, "/confirm-result", map[string]any{"confirmId": cid, "timeoutMs": 10000})
	if st != 200 || out["status"] != "confirmed" {
		t.Fatalf("confirm-result through n2 for the approval proposed before the kill = %d %v", st, out)
	}

	// The new session works on the two-server cluster: paired with n1,
	// called through n0, then revoked on n2 and refused on n0 (the token
	// bucket's watch on n0 came through the loss of its server).
	tab2, err := lapdtest.Dial(ctx, ns[1].URL+"/agent/ws", sess2.Token, lapdtest.WithTabSecret(sess2.TabSecret))
	if err != nil {
		t.Fatal(err)
	}
	defer tab2.Close()
	if st, out := lapJS(t, ns[0], sess2.Token, "/message", map[string]any{"msg": map[string]any{"type": "inc"}}); st != 200 || out["status"] != "dispatched" {
		t.Fatalf("message through n0 to the new tab on n1 = %d %v", st, out)
	}
	var rv map[string]any
	if st := ns[2].postJSON(t, "/agent/revoke", "", map[string]any{"tid": sess2.TID, "tabSecret": sess2.TabSecret}, &rv); st != 200 {
		t.Fatalf("revoke on n2 = %d %v", st, rv)
	}
	select {
	case <-tab2.Done():
	case <-ctx.Done():
		t.Fatal("the new tab on n1 was not dropped after the revocation on n2")
	}
	waitCond(t, "n0 to refuse the revoked token", 10*time.Second, func() bool {
		st, _ := lapJS(t, ns[0], sess2.Token, "/state", map[string]any{})
		return st == 403
	})

	// The cluster's audit trail has the first session's entries from
	// before the kill and the approval after it; and every entry any node
	// wrote to its own sink (stdout) for either session, during the
	// election too, is in it.
	for _, sn := range []lapdtest.Session{sess, sess2} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) { // polls the stream
			trail, ok := clusterAudit(t, srv[2].url, sn.TID)
			var lost []auditKey
			for k, n := range nodeAudit(logs, sn.TID) {
				if trail[k] < n {
					lost = append(lost, k)
				}
			}
			if ok && len(lost) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s: entries the nodes wrote to stdout that are not in the cluster's trail (30 s on): %v", sn.TID, lost)
			}
		}
	}
	trail, _ := clusterAudit(t, srv[2].url, sess.TID)
	var events []string
	during := 0
	for k := range trail {
		events = append(events, k.Event)
		if k.At >= killed.UnixMilli() && k.At <= elected.UnixMilli() {
			during++
		}
	}
	if !hasEvents(events, "mint", "msg-dispatched", "confirm-proposed", "confirm-approved") || during == 0 {
		t.Fatalf("the cluster's trail for the first session: %v, %d written between the kill and the first mint after it; want mint, msg-dispatched, confirm-proposed, confirm-approved, and at least one written during the election", events, during)
	}
	t.Logf("cluster trail of the first session: %d entries, %d written between the kill and the first mint after it", len(trail), during)
}

// jsServer is one nats-server of a JetStream cluster started by the test.
type jsServer struct {
	name, url string
	cmd       *exec.Cmd
	out       *syncBuffer
	done      chan struct{}
}

// startJSCluster runs n nats-servers on loopback forming one JetStream
// cluster ("lapdjs"; servers s0…s{n-1}), each routed to all the others,
// and waits until every one accepts clients.
func startJSCluster(t *testing.T, n int) []*jsServer {
	t.Helper()
	bin := natsServerBin(t)
	client, route := make([]string, n), make([]string, n)
	for i := range n {
		client[i], route[i] = browserFreeAddr(t), browserFreeAddr(t)
	}
	srv := make([]*jsServer, n)
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, "nats://"+route[j])
			}
		}
		host, port, _ := net.SplitHostPort(client[i])
		s := &jsServer{name: fmt.Sprint("s", i), url: "nats://" + client[i], out: &syncBuffer{}, done: make(chan struct{})}
		s.cmd = exec.Command(bin, "-a", host, "-p", port, "-n", s.name, "-js", "-sd", t.TempDir(),
			"--cluster_name", "lapdjs", "--cluster", "nats://"+route[i], "--routes", strings.Join(routes, ","))
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { s.cmd.Wait(); close(s.done) }()
		t.Cleanup(func() {
			s.cmd.Process.Signal(os.Interrupt)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				s.cmd.Process.Kill()
				<-s.done
			}
		})
		srv[i] = s
	}
	for i, s := range srv {
		waitCond(t, s.name+" to listen", 20*time.Second, func() bool {
			c, err := net.DialTimeout("tcp", client[i], 200*time.Millisecond)
			if err == nil {
				c.Close()
				return true
			}
			select {
			case <-s.done:
				t.Fatalf("nats-server %s exited:\n%s", s.name, s.out.String())
			default:
			}
			return false
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range srv {
				t.Logf("nats-server %s:\n%s", s.name, s.out.String())
			}
		}
	})
	return srv
}

// waitJetStream waits until the cluster can place a stream with replicas
// copies: the meta leader is elected and enough servers have joined. It
// creates a throwaway stream to find out, and deletes it.
func waitJetStream(t *testing.T, js jetstream.JetStream, replicas int) {
	t.Helper()
	var err error
	waitCond(t, "the JetStream cluster to place a stream", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "probe", Subjects: []string{"probe"}, Storage: jetstream.MemoryStorage, Replicas: replicas})
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
}

// streamInfo asks the cluster for a stream's current info (a failed
// request, e.g. during an election, is reported as an empty info).
func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Logf("stream %s: %v", name, err)
		return &jetstream.StreamInfo{}
	}
	return st.CachedInfo()
}

// moveLeader makes server want the leader of stream name (a leader
// stepdown with a preferred placement), and waits until it is.
func moveLeader(t *testing.T, nc *nats.Conn, js jetstream.JetStream, name, want string) {
	t.Helper()
	leader := func() string {
		if c := streamInfo(t, js, name).Cluster; c != nil {
			return c.Leader
		}
		return ""
	}
	for attempt := 0; ; attempt++ {
		var cur string
		waitCond(t, "a leader for "+name, 20*time.Second, func() bool { cur = leader(); return cur != "" })
		if cur == want {
			return
		}
		if attempt == 3 {
			t.Fatalf("stream %s: leader %s, could not move it to %s", name, cur, want)
		}
		msg, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, []byte(`{"placement":{"preferred":"`+want+`"}}`), 5*time.Second)
		if err != nil {
			t.Fatalf("stepdown of %s: %v", name, err)
		}
		var res struct {
			Success bool
			Error   *struct{ Description string }
		}
		if err := json.Unmarshal(msg.Data, &res); err != nil || !res.Success {
			t.Fatalf("stepdown of %s to %s: %s", name, want, msg.Data)
		}
		waitCond(t, "the leader of "+name+" to change", 20*time.Second, func() bool { l := leader(); return l != "" && l != cur })
	}
}

// lapJS POSTs a LAP route on node s with token and decodes the answer.
func lapJS(t *testing.T, s *server, token, route string, body any) (int, map[string]any) {
	t.Helper()
	var out map[string]any
	st := s.postJSON(t, "/agent/lap/v1"+route, token, body, &out)
	return st, out
}

// auditKey names one audit entry of a session.
type auditKey struct {
	Event string
	At    int64
}

// clusterAudit is what `lapd audit --nats` lists for tid, counted by
// entry; false when the stream cannot be read yet.
func clusterAudit(t *testing.T, natsURL, tid string) (map[auditKey]int, bool) {
	t.Helper()
	cmd := exec.Command(lapdBin, "audit", "--nats", natsURL, "--tid", tid, "--limit", "0", "--format", "json")
	out, err := cmd.Output()
	if err != nil {
		t.Logf("lapd audit --nats: %v", err)
		return nil, false
	}
	return auditEntries(string(out), tid), true
}

// nodeAudit is what the nodes wrote to their own sink (stdout) for tid.
func nodeAudit(nodes []*server, tid string) map[auditKey]int {
	all := map[auditKey]int{}
	for _, s := range nodes {
		for k, n := range auditEntries(s.audit.String(), tid) {
			all[k] += n
		}
	}
	return all
}

func auditEntries(jsonl, tid string) map[auditKey]int {
	m := map[auditKey]int{}
	for _, l := range strings.Split(jsonl, "\n") {
		var e struct {
			At    int64
			TID   string
			Event string
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.TID == tid {
			m[auditKey{e.Event, e.At}]++
		}
	}
	return m
}

func hasEvents(got []string, want ...string) bool {
	have := map[string]bool{}
	for _, e := range got {
		have[e] = true
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}
