package pairing

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestReplyInReadBuffer: a large rpc-reply result reaches CallReply in the
// read buffer and survives until Release; Call's copy stays valid after the
// buffer is reused by later frames.
func TestReplyInReadBuffer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	big := func(c byte) string { return `{"blob":"` + strings.Repeat(string(c), 2*handoffSize) + `"}` }
	answer := func(result string) {
		f := tb.expect("rpc")
		tb.send([]byte(`{"t":"rpc-reply","id":"` + f["id"].(string) + `","result":` + result + `}`))
	}

	done := make(chan Reply, 1)
	go func() {
		r, err := e.reg.CallReply(context.Background(), tid, "observe", nil, 0)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	answer(big('a'))
	r := recv(t, done)
	if string(r.Data) != big('a') {
		t.Fatalf("CallReply data %.40s…", r.Data)
	}
	if r.buf == nil {
		t.Error("a large result was copied instead of handed over")
	}

	copied := make(chan []byte, 1)
	go func() {
		b, err := e.reg.Call(context.Background(), tid, "observe", nil, 0)
		if err != nil {
			t.Error(err)
		}
		copied <- b
	}()
	answer(big('b'))
	b := recv(t, copied)
	r.Release()
	// More frames through the (reused) buffers.
	for range 3 {
		go func() { _, _ = e.reg.Call(context.Background(), tid, "observe", nil, 0); copied <- nil }()
		answer(big('c'))
		recv(t, copied)
	}
	if !bytes.Equal(b, []byte(big('b'))) {
		t.Fatalf("Call's result changed after later frames: %.40s…", b)
	}
}

// TestRPCFrameToolEncoding: rpcFrame writes the tool name exactly as
// json.Marshal does, whether it takes the plain-string shortcut or not.
func TestRPCFrameToolEncoding(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"observe", "send_message", "a-b.c/d 1", "", "<b>", "a&b", `q"uote`, `back\slash`, "tab\there", "é", "\u2028", "\x7f"} {
		b, err := rpcFrame("id1", tool, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(tool)
		if !bytes.Contains(b, []byte(`"tool":`+string(want)+`,`)) {
			t.Errorf("tool %q: frame %s, want the tool written as %s", tool, b, want)
		}
		var f struct{ Tool string }
		if err := json.Unmarshal(b, &f); err != nil || f.Tool != tool {
			t.Errorf("tool %q: frame %s decodes to %q (%v)", tool, b, f.Tool, err)
		}
	}
}
