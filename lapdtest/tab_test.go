package lapdtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/lapdtest"
)

// server is a minimal tab-facing peer: it acks hello, then hands the
// connection to the test.
func server(t *testing.T, conns chan<- *websocket.Conn) *httptest.Server {
	t.Helper()
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Sec-WebSocket-Protocol"), "lapd.token.agt_ok") {
			http.Error(w, `{"error":{"code":"auth-failed"}}`, http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		_, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		var h lapdtest.Hello
		if json.Unmarshal(b, &h) != nil || h.T != "hello" {
			c.Close(websocket.StatusPolicyViolation, "want hello")
			return
		}
		_ = c.Write(r.Context(), websocket.MessageText, []byte(`{"t":"hello-ack","lapVersion":2,"minClientVersion":2}`))
		conns <- c
		<-stop
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	return srv
}

func read(t *testing.T, ctx context.Context, c *websocket.Conn) map[string]any {
	t.Helper()
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRPCAndLogAppend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conns := make(chan *websocket.Conn, 1)
	srv := server(t, conns)
	tab, err := lapdtest.Dial(ctx, srv.URL, "agt_ok")
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	c := <-conns
	defer c.CloseNow()

	tests := []struct {
		tool, args, want string
	}{
		{"get_state", `{"path":"/count"}`, `{"state":0}`},
		{"query_state", `{"path":"/nope"}`, `{"detail":"no value at /nope","found":false}`},
		{"send_message", `{"msg":{"type":"inc"}}`, `dispatched`},
		{"send_message", `{"msg":{"type":"reset"}}`, `human-only`},
		{"send_message", `{"msg":{"type":"clearAll"}}`, `pending-confirmation`},
		{"bogus", `{}`, `unknown tool: bogus`},
	}
	for i, tc := range tests {
		frame := map[string]any{"t": "rpc", "id": "r" + string(rune('0'+i)), "tool": tc.tool, "args": json.RawMessage(tc.args)}
		b, _ := json.Marshal(frame)
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		reply := read(t, ctx, c)
		if reply["id"] != frame["id"] {
			t.Fatalf("%s: reply id %v", tc.tool, reply["id"])
		}
		got, _ := json.Marshal(reply)
		if !json.Valid(got) || !contains(string(got), tc.want) {
			t.Errorf("%s: got %s, want it to contain %s", tc.tool, got, tc.want)
		}
		la := read(t, ctx, c)
		if la["t"] != "log-append" {
			t.Errorf("%s: after the reply got %v, want log-append", tc.tool, la["t"])
		}
	}
	if got := tab.State().(map[string]any)["count"]; got != float64(1) {
		t.Errorf("count = %v, want 1", got)
	}
	ids := tab.PendingConfirms()
	if len(ids) != 1 {
		t.Fatalf("pending = %v", ids)
	}
	if err := tab.Approve(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if m := read(t, ctx, c); m["t"] != "confirm-resolved" || m["outcome"] != "confirmed" {
		t.Errorf("approve sent %v", m)
	}
}

func TestWatchAndRecording(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conns := make(chan *websocket.Conn, 1)
	srv := server(t, conns)
	tab, err := lapdtest.Dial(ctx, srv.URL, "agt_ok")
	if err != nil {
		t.Fatal(err)
	}
	c := <-conns
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"t":"watch","id":"w1","path":"/count"}`))
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"t":"active"}`))
	if _, err := tab.WaitFor(ctx, "active"); err != nil {
		t.Fatal(err)
	}
	if tab.Watches() != 1 {
		t.Fatal("watch not recorded")
	}
	_ = tab.SetState(map[string]any{"count": 1})
	if m := read(t, ctx, c); m["t"] != "state-update" || m["id"] != "w1" {
		t.Errorf("got %v", m)
	}
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"t":"log-push","entry":{"id":"n1","kind":"narrate"}}`))
	if m := read(t, ctx, c); m["t"] != "log-append" {
		t.Errorf("log-push not echoed: %v", m)
	}
	c.Close(4001, "revoked")
	<-tab.Done()
	if tab.CloseStatus() != 4001 {
		t.Errorf("close status %v", tab.CloseStatus())
	}
	tab.Close()
}

func TestDialRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := server(t, make(chan *websocket.Conn, 1))
	_, err := lapdtest.Dial(ctx, srv.URL, "agt_bad")
	de, ok := err.(*lapdtest.DialError)
	if !ok || de.Status != 401 || !contains(string(de.Body), "auth-failed") {
		t.Fatalf("err = %#v", err)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0))
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// The tab gates a msg itself, as lapd.js does, whatever the server checked.
func TestTabGatesLikeLapdJS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conns := make(chan *websocket.Conn, 1)
	srv := server(t, conns)
	tab, err := lapdtest.Dial(ctx, srv.URL, "agt_ok", lapdtest.WithApp(todoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	c := <-conns
	defer c.CloseNow()
	for i, tc := range []struct{ tool, args, want string }{
		{"send_message", `{"msg":{"type":"add"}}`, `"reason":"invalid"`},
		{"send_message", `{"msg":{"type":"add","title":"x","extra":1}}`, `'extra' not allowed`},
		{"would_dispatch", `{"msg":{"type":"add"}}`, `"reason":"schema-mismatch"`},
		{"send_message", `{"msg":{"type":"admin"}}`, `can only be done by the user`},
		{"send_message", `{"msg":{"type":""}}`, `msg.type must be a non-empty string`},
		{"would_dispatch", `{"msg":{"type":"add","title":"x"}}`, `"status":"predicted"`},
	} {
		b, _ := json.Marshal(map[string]any{"t": "rpc", "id": fmt.Sprint("g", i), "tool": tc.tool, "args": json.RawMessage(tc.args)})
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(read(t, ctx, c))
		if !strings.Contains(string(got), tc.want) {
			t.Errorf("%s %s: got %s, want %s", tc.tool, tc.args, got, tc.want)
		}
		read(t, ctx, c) // log-append
	}
	if n := len(tab.State().(map[string]any)["todos"].([]any)); n != 0 {
		t.Errorf("a gated msg changed the state: %d todos", n)
	}
}
