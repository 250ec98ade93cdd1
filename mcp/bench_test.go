package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

func benchObserve(b *testing.B, call func() (*mcpgo.CallToolResult, error)) {
	b.ReportAllocs()
	for b.Loop() {
		res, err := call()
		if err != nil || res.IsError {
			b.Fatalf("%v %v", err, res)
		}
	}
}

// BenchmarkObserveInProcess: observe through mcp-go's in-process client, fake LAP.
func BenchmarkObserveInProcess(b *testing.B) {
	h := newHarness(b, nil)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "connect_session"
	req.Params.Arguments = map[string]any{"url": base, "token": tokA}
	if _, err := h.c.CallTool(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	req.Params.Name, req.Params.Arguments = "observe", map[string]any{}
	benchObserve(b, func() (*mcpgo.CallToolResult, error) { return h.c.CallTool(context.Background(), req) })
}

// BenchmarkObserveHTTP: observe over real loopback Streamable HTTP (legacy era), fake LAP.
func BenchmarkObserveHTTP(b *testing.B) {
	hh := newHTTPHarness(b, nil)
	c := hh.client(true)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "connect_session"
	req.Params.Arguments = map[string]any{"token": tokA}
	if _, err := c.CallTool(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	req.Params.Name, req.Params.Arguments = "observe", map[string]any{}
	benchObserve(b, func() (*mcpgo.CallToolResult, error) { return c.CallTool(context.Background(), req) })
}

// BenchmarkObserveEndpoint: one 2026-07-28 observe tools/call handed to the
// /agent/mcp handler (no network, fake LAP answering 10 KiB of state), with
// the fast path and through mcp-go (DisableFastPath): the endpoint's own
// cost per call. The fake LAP client lends the body from a pool as the
// in-process client's CallLent does; fast-nolend has only Call, which
// hands over a new copy per call (what the executor got before it lent). The response goes to a writer that keeps one buffer, as
// net/http's does, so B/op is the endpoint's; on Linux cpu-ns/op is the CPU
// time of the calling thread (the call runs on it), which other processes
// on a shared machine inflate much less than ns/op.
func BenchmarkObserveEndpoint(b *testing.B) {
	for _, mode := range []struct {
		name          string
		disable, lend bool
	}{{"fast", false, true}, {"fast-nolend", false, false}, {"mcp-go", true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			rl := &rawObserveLAP{fakeLAP: newFakeLAP(), raw: json.RawMessage(`{"state":` + bigState() + `,"actions":` + twoActions + `,"description":{"name":"Todo","version":"1","schemaHash":"h1"},"context":null,"health":{"connected":true}}`)}
			var lc lap.Client = rl
			if mode.lend {
				lc = &lendingRawLAP{rl}
			}
			hh := newHTTPHarness(b, func(c *HTTPConfig) { c.DisableFastPath = mode.disable; c.Client = lc })
			post := func(body string) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/agent/mcp", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				r.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20260728)
				r.Header.Set("Mcp-Method", "tools/call")
				r.Header.Set("Mcp-Name", gjsonName(body))
				w := httptest.NewRecorder()
				hh.h.ServeHTTP(w, r)
				return w
			}
			w := post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"` + tokA + `"},` + modernMeta + `}}`)
			handle := regexp.MustCompile(`s_[a-z2-7]{16}`).FindString(w.Body.String())
			if handle == "" {
				b.Fatalf("connect_session: %s", w.Body)
			}
			body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"observe","arguments":{"session":"` + handle + `"},` + modernMeta + `}}`
			sink := &sinkWriter{h: http.Header{}}
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/agent/mcp", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				r.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20260728)
				r.Header.Set("Mcp-Method", "tools/call")
				r.Header.Set("Mcp-Name", "observe")
				sink.reset()
				hh.h.ServeHTTP(sink, r)
				if sink.code != http.StatusOK || bytes.Contains(sink.body, []byte(`"isError":true`)) || !bytes.Contains(sink.body, []byte(`"structuredContent"`)) {
					b.Fatalf("%d %s", sink.code, sink.body)
				}
			}
			if cpu := threadCPU() - cpu0; cpu0 >= 0 && b.N > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// sinkWriter is a ResponseWriter that keeps one body buffer.
type sinkWriter struct {
	h    http.Header
	code int
	body []byte
}

func (w *sinkWriter) reset() {
	clear(w.h)
	w.code, w.body = 0, w.body[:0]
}

func (w *sinkWriter) Header() http.Header { return w.h }

func (w *sinkWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *sinkWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, p...)
	return len(p), nil
}

func (w *sinkWriter) Flush() {}

// rawObserveLAP answers /observe with a copy of fixed bytes, as the
// in-process LAP client's Call hands over a tab's reply in a buffer of its
// own (the fake's re-encoding would dominate).
type rawObserveLAP struct {
	*fakeLAP
	raw json.RawMessage
}

func (l *rawObserveLAP) Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error) {
	if route == "/observe" {
		return bytes.Clone(l.raw), nil
	}
	return l.fakeLAP.Call(ctx, base, token, route, body)
}

// lendingRawLAP is rawObserveLAP with the in-process client's CallLent:
// the copy goes into a pooled buffer that Release puts back.
type lendingRawLAP struct{ *rawObserveLAP }

var benchBodies = sync.Pool{New: func() any { return new(benchBody) }}

type benchBody struct{ b []byte }

func (b *benchBody) Release() { benchBodies.Put(b) }

func (l *lendingRawLAP) CallLent(ctx context.Context, base, token, route string, body any) (json.RawMessage, lap.Lease, error) {
	if route != "/observe" {
		raw, err := l.Call(ctx, base, token, route, body)
		return raw, nil, err
	}
	bb := benchBodies.Get().(*benchBody)
	bb.b = append(bb.b[:0], l.raw...)
	return bb.b, bb, nil
}

// gjsonName is the tool name of a tools/call body (Mcp-Name).
func gjsonName(body string) string {
	var m struct {
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	_ = json.Unmarshal([]byte(body), &m)
	return m.Params.Name
}

// BenchmarkAppendJSONString: the text copy of a 10 KiB structuredContent
// (JSON: a quote every few bytes).
func BenchmarkAppendJSONString(b *testing.B) {
	sc := []byte(bigState())
	buf := make([]byte, 0, 3*len(sc))
	b.SetBytes(int64(len(sc)))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	for b.Loop() {
		buf = appendJSONString(buf[:0], sc)
	}
	if cpu := threadCPU() - cpu0; cpu0 >= 0 && b.N > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
