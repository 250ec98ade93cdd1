package lap_test

import (
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lapdtest"
)

// One exact-key decode decides the variant: a msg that also carries a
// case-variant of "type" is refused before anything reaches the tab, is not
// proposed for approval, and is not audited under the other name. (Before,
// {"type":"clearAll","Type":"reset"} was proposed as clearAll, audited and
// stored as reset, and re-delivered after a reload as the human-only reset.)
func TestCaseVariantDiscriminantRefused(t *testing.T) {
	t.Parallel()
	for _, withPolicy := range []bool{false, true} {
		e := newEnv(t)
		var opts []lapdtest.Option
		if withPolicy {
			opts = append(opts, lapdtest.WithPolicy(lapdtest.DemoPolicy()))
		}
		token, tid, tab := e.paired(opts...)
		for _, body := range []string{
			`{"msg":{"type":"clearAll","Type":"reset"}}`,
			`{"msg":{"Type":"reset","type":"clearAll"}}`,
			`{"msg":{"type":"addTodo","title":"x","TYPE":"x"}}`,
			`{"msg":{"type":"inc","type":"reset"}}`,
		} {
			for _, route := range []string{"/message", "/would-dispatch"} {
				r := e.lapCall(token, route, body)
				if r.status != 400 || r.code() != "invalid" {
					t.Errorf("policy=%v %s %s: %d %s, want 400 invalid", withPolicy, route, body, r.status, r.body)
				}
			}
		}
		if n := tab.RPCCount("send_message") + tab.RPCCount("would_dispatch"); n != 0 {
			t.Errorf("policy=%v: %d rpc frames reached the tab", withPolicy, n)
		}
		if p := e.cm.PendingFor(tid); len(p) != 0 {
			t.Errorf("policy=%v: approvals recorded: %+v", withPolicy, p)
		}
		for _, ev := range []string{audit.EventConfirmProposed, audit.EventMsgDispatched} {
			if es := e.sink.events(ev); len(es) != 0 {
				t.Errorf("policy=%v: %s audited: %+v", withPolicy, ev, es)
			}
		}
		// A proposal is stored with the exact variant and a payload without it.
		r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll","note":"n"},"timeoutMs":0}`)
		if r.status != 200 {
			t.Fatalf("clearAll: %d %s", r.status, r.body)
		}
		p := e.cm.PendingFor(tid)
		if len(p) != 1 || p[0].Variant != "clearAll" || string(p[0].Payload) != `{"note":"n"}` {
			t.Errorf("policy=%v: stored approval %+v, want clearAll {\"note\":\"n\"}", withPolicy, p)
		}
	}
}

// Invalid UTF-8 in a LAP body used to be forwarded raw to the tab (msg
// values pass through undecoded), and a browser then failed the socket and
// reconnect-looped. It is refused with 400 invalid before anything is sent.
func TestInvalidUTF8Refused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired()
	for _, route := range []string{"/message", "/would-dispatch", "/narrate", "/state"} {
		body := "{\"msg\":{\"type\":\"addTodo\",\"title\":\"\xff\xfe\"},\"text\":\"\xc3\x28\",\"path\":\"/\xff\"}"
		r := e.lapCall(token, route, body)
		if r.status != 400 || r.code() != "invalid" || !strings.Contains(string(r.body), "UTF-8") {
			t.Errorf("%s: %d %s, want 400 invalid (UTF-8)", route, r.status, r.body)
		}
	}
	if n := tab.Count("rpc") + tab.Count("log-push"); n != 0 {
		t.Errorf("%d frames reached the tab", n)
	}
}
