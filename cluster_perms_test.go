package lapd_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
)

// nodePermissions are the NATS permissions docs/CLUSTER.md gives a lapd
// node of cluster p (its --cluster-name): nothing more.
func nodePermissions(p string) *server.Permissions {
	pub := []string{
		p + ".tab.>", p + ".takeover", // forwarding between nodes
		"_INBOX.>",     // answers to other nodes' requests
		p + ".audit.>", // the audit stream's entries
		"$JS.API.INFO", // JetStream account info (creating a bucket)
	}
	// The token and approval buckets: kept in memory on every node from a
	// watch (an ordered consumer), read by key when not there yet, deletes
	// purged hourly.
	for _, b := range []string{p + "_tokens", p + "_confirm"} {
		pub = append(pub, "$KV."+b+".>",
			"$JS.API.STREAM.INFO.KV_"+b, "$JS.API.STREAM.CREATE.KV_"+b, "$JS.API.STREAM.UPDATE.KV_"+b,
			"$JS.API.STREAM.PURGE.KV_"+b, "$JS.API.DIRECT.GET.KV_"+b+".>",
			"$JS.API.CONSUMER.CREATE.KV_"+b+".>", "$JS.API.CONSUMER.DELETE.KV_"+b+".>")
	}
	// The MCP bindings bucket: read and written by key.
	b := p + "_mcp"
	pub = append(pub, "$KV."+b+".>",
		"$JS.API.STREAM.INFO.KV_"+b, "$JS.API.STREAM.CREATE.KV_"+b, "$JS.API.STREAM.UPDATE.KV_"+b,
		"$JS.API.DIRECT.GET.KV_"+b+".>")
	// The audit stream.
	s := p + "_audit"
	pub = append(pub, "$JS.API.STREAM.INFO."+s, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.UPDATE."+s)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{p + ".tab.>", p + ".takeover", "_INBOX.>"}},
	}
}

// A node whose NATS user has exactly the documented permissions works:
// mint and claim (the token bucket), a call forwarded between nodes, an
// approval (the confirm bucket), the audit stream.
func TestClusterLockedDownNATSUser(t *testing.T) {
	t.Parallel()
	const p = "locked"
	ns := natstest.StartWith(t, func(o *server.Options) {
		// LAPD_NATS_TRACE=1 logs every subject the nodes use (to stderr).
		o.Trace = os.Getenv("LAPD_NATS_TRACE") != ""
		o.NoLog = !o.Trace
		o.Users = []*server.User{{Username: "node", Password: "pw", Permissions: nodePermissions(p)}}
	})
	var nodes [2]*lapdtest.Server
	for i := range nodes {
		nodes[i] = lapdtest.NewServer(lapd.Config{NATSURL: ns.URL(), NATSOptions: []nats.Option{nats.UserInfo("node", "pw")},
			ClusterName: p, NodeID: string(rune('a' + i)), AuditNATS: true})
		t.Cleanup(nodes[i].Close)
	}
	a, b := nodes[0], nodes[1]
	tab, sess, err := a.Pair(ctxT(t), lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 200 || body["state"] == nil {
		t.Fatalf("observe via B = %d %v", st, body)
	}
	if st, _, body := post(t, b.LAPURL()+"/message", sess.Token, `{"msg":{"type":"clearAll"},"approvalTimeoutMs":0}`); st != 200 || body["status"] != "pending-confirmation" {
		t.Fatalf("message needing approval via B = %d %v", st, body)
	}
	if n := b.Lapd.Confirm().Stats().Pending; n != 1 {
		t.Fatalf("B sees %d pending approvals, want the one in the shared bucket", n)
	}
	// An MCP handle made on A works on B (the bindings bucket).
	res := mcpCallTool(t, mcpModern(t, a.MCPURL()), "connect_session", map[string]any{"line": sess.ConnectLine()})
	handle, _ := res["session"].(string)
	if obs := mcpCallTool(t, mcpModern(t, b.MCPURL()), "observe", map[string]any{"session": handle}); obs["state"] == nil {
		t.Fatalf("observe on B with A's handle %q: %v", handle, obs)
	}
}

// A node whose NATS user lacks one of those permissions does not start: New
// fails with an error that says what NATS refused, instead of the node
// failing later, on the first tab that pairs with it or the first call it
// forwards.
func TestClusterNATSUserMissingAPermission(t *testing.T) {
	t.Parallel()
	const p = "short"
	without := func(list []string, drop string) []string {
		var out []string
		for _, s := range list {
			if s != drop {
				out = append(out, s)
			}
		}
		if len(out) == len(list) {
			t.Fatalf("%s is not in the list", drop)
		}
		return out
	}
	full := nodePermissions(p)
	cases := map[string]*server.Permissions{
		"sub tab subjects": {Publish: full.Publish, Subscribe: &server.SubjectPermission{Allow: without(full.Subscribe.Allow, p+".tab.>")}},
		"pub tab subjects": {Publish: &server.SubjectPermission{Allow: without(full.Publish.Allow, p+".tab.>")}, Subscribe: full.Subscribe},
		"pub replies":      {Publish: &server.SubjectPermission{Allow: without(full.Publish.Allow, "_INBOX.>")}, Subscribe: full.Subscribe},
		"sub takeover":     {Publish: full.Publish, Subscribe: &server.SubjectPermission{Allow: without(full.Subscribe.Allow, p+".takeover")}},
		"pub audit":        {Publish: &server.SubjectPermission{Allow: without(full.Publish.Allow, p+".audit.>")}, Subscribe: full.Subscribe},
		"create bucket":    {Publish: &server.SubjectPermission{Allow: without(full.Publish.Allow, "$JS.API.STREAM.CREATE.KV_"+p+"_tokens")}, Subscribe: full.Subscribe},
	}
	for name, perms := range cases {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			t.Parallel()
			ns := natstest.StartWith(t, func(o *server.Options) {
				o.Users = []*server.User{{Username: name, Password: "pw", Permissions: perms}}
			})
			ctx, cancel := context.WithTimeout(ctxT(t), 3*time.Second) // a refused JetStream request only times out
			defer cancel()
			s, err := lapd.New(ctx, lapd.Config{NATSURL: ns.URL(), NATSOptions: []nats.Option{nats.UserInfo(name, "pw")},
				ClusterName: p, NodeID: "n", AuditNATS: true})
			if err == nil {
				s.Shutdown(context.Background())
				t.Fatal("the node started")
			}
			if !strings.Contains(err.Error(), "Permissions Violation") || !strings.Contains(err.Error(), "docs/CLUSTER.md") {
				t.Fatalf("startup error %q does not say what NATS refused", err)
			}
			t.Logf("%v", err)
		})
	}
}
