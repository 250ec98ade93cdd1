package pairing

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// transcript records the frames of a session as the tab sees them, with
// volatile fields (ids, times) normalized.
type transcript struct {
	buf bytes.Buffer
	ids map[string]string
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`)

func (tr *transcript) add(dir string, frame any) {
	b, err := json.Marshal(frame)
	if err != nil {
		panic(err)
	}
	var v any
	_ = json.Unmarshal(b, &v)
	if m, ok := v.(map[string]any); ok {
		if _, has := m["at"]; has {
			m["at"] = "<ms>"
		}
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out) // map keys sorted
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	b = bytes.TrimSpace(out.Bytes())
	b = uuidRE.ReplaceAllFunc(b, func(id []byte) []byte {
		if tr.ids == nil {
			tr.ids = map[string]string{}
		}
		n, ok := tr.ids[string(id)]
		if !ok {
			n = fmt.Sprintf("<id%d>", len(tr.ids)+1)
			tr.ids[string(id)] = n
		}
		return []byte(n)
	})
	fmt.Fprintf(&tr.buf, "%s %s\n", dir, b)
}

func (tr *transcript) check(t *testing.T, name string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, tr.buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(want, tr.buf.Bytes()) {
		t.Errorf("transcript differs from %s (go test -update rewrites it)\n--- got\n%s--- want\n%s", path, tr.buf.Bytes(), want)
	}
}

// recTab wraps a tab so every frame in both directions lands in tr.
type recTab struct {
	*tab
	tr *transcript
}

func (r recTab) send(v any) { r.tr.add("tab→", v); r.tab.send(v) }
func (r recTab) expect(typ string) map[string]any {
	m := r.tab.expect(typ)
	r.tr.add("←srv", m)
	return m
}

func TestGoldenSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tr := &transcript{}
	tb := recTab{e.dial(tok, dialOpts{}), tr}
	ctx := context.Background()

	tb.send(map[string]any{"t": "hello", "appName": "todo", "appVersion": "1.0.0", "schemaHash": "h1", "lapVersion": 2, "visible": true,
		"msgSchema": map[string]any{"discriminant": "type", "variants": map[string]any{"inc": map[string]any{}}}})
	tb.expect("hello-ack")
	recv(t, e.paired)

	// rpc → rpc-reply, then the tab's log-append.
	res := make(chan string, 1)
	go func() {
		r, err := e.reg.Call(ctx, tid, "get_state", map[string]any{"path": "/count"}, 0)
		res <- fmt.Sprint(string(r), err)
	}()
	f := tb.expect("rpc")
	tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": map[string]any{"state": 1}})
	if got := recv(t, res); got != `{"state":1}<nil>` {
		t.Fatalf("Call: %s", got)
	}
	tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": f["id"], "at": 1, "kind": "read", "intent": "get_state"}})
	recv(t, e.logs)

	// rpc → rpc-error.
	go func() {
		_, err := e.reg.Call(ctx, tid, "nope", nil, 0)
		res <- fmt.Sprint(err)
	}()
	f = tb.expect("rpc")
	tb.send(map[string]any{"t": "rpc-error", "id": f["id"], "code": "invalid", "detail": "unknown tool: nope"})
	recv(t, res)

	// watch → state-update → unwatch.
	go func() {
		st, err := e.reg.Watch(ctx, tid, "/count")
		res <- fmt.Sprint(string(st), err)
	}()
	w := tb.expect("watch")
	tb.send(map[string]any{"t": "state-update", "id": w["id"], "path": "/count", "stateAfter": 2})
	tb.expect("unwatch")
	if got := recv(t, res); got != `2<nil>` {
		t.Fatalf("Watch: %s", got)
	}

	// log-push (narration) echoed back as log-append; ping → pong; visibility.
	entry := map[string]any{"id": "narrate-1-abcdef01", "at": 5, "kind": "narrate", "intent": "Agent narrated", "detail": "hi"}
	if err := e.reg.Push(tid, map[string]any{"t": "log-push", "entry": entry}); err != nil {
		t.Fatal(err)
	}
	tb.expect("log-push")
	tb.send(map[string]any{"t": "log-append", "entry": entry})
	recv(t, e.logs)
	tb.send(map[string]any{"t": "visibility", "visible": false})
	tb.send(map[string]any{"t": "ping"})
	tb.expect("pong")

	tr.check(t, "session")
}
