package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// Encoding a result once.
//
// A tool result carries its JSON twice, as structuredContent and as the
// text copy. Left to mcp-go, the Streamable HTTP endpoint encodes it three
// times over: CallToolResult.MarshalJSON builds a map and marshals it
// (escaping the text, compacting structuredContent), then the response
// encoder compacts that output again. The executor already holds the
// result's bytes, so on /agent/mcp it hands mcp-go a placeholder result
// whose only text is a marker, and the response writer puts the real
// content in the marker's place as mcp-go writes the response: the
// structuredContent bytes as they are, and their text copy escaped once.
// mcp-go still does everything else (JSON-RPC framing, sessions, both
// protocol eras, the 2026-07-28 result metadata, SSE when progress was
// sent). This is a hook in this repo's use of mcp-go, not a fork: if a
// future mcp-go encodes the placeholder differently, NewHTTPHandler's
// self-check turns splicing off and results are encoded the ordinary way.

// spliceKey is the context key of the request's splicer.
type spliceKey struct{}

// splicePrefix is unguessable per process, so no content can forge a marker.
var splicePrefix = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "lapd-splice-" + hex.EncodeToString(b[:]) + "-"
}()

var spliceSeq atomic.Uint64

// splicer holds the encoded content of the results of one HTTP request,
// under the markers their placeholders carry.
type splicer struct {
	mu    sync.Mutex
	parts map[string][]byte // `"…marker…"` → `[{"type":"text","text":…}],"structuredContent":…`
}

// placeholderPattern is how mcp-go encodes a placeholder's content array
// around the quoted marker.
const (
	placeholderHead = `"content":[{"type":"text","text":`
	placeholderTail = `}]`
)

// spliceable reports whether mcp-go encodes a placeholder result as this
// file expects (checked once per handler).
func spliceable() bool {
	m := splicePrefix + "0"
	b, err := json.Marshal(mcpgo.JSONRPCResponse{JSONRPC: "2.0", ID: mcpgo.NewRequestId(1), Result: placeholder(m)})
	return err == nil && bytes.Contains(b, []byte(placeholderHead+strconv.Quote(m)+placeholderTail))
}

func placeholder(marker string) *mcpgo.CallToolResult {
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(marker)}}
}

// put keeps sc (a result's structuredContent, also its text) and returns the
// placeholder result to give mcp-go instead.
func (s *splicer) put(sc []byte) *mcpgo.CallToolResult {
	marker := splicePrefix + strconv.FormatUint(spliceSeq.Add(1), 10)
	enc := make([]byte, 0, 2*len(sc)+64)
	enc = append(enc, `[{"type":"text","text":`...)
	enc = appendJSONString(enc, sc)
	enc = append(enc, `}],"structuredContent":`...)
	enc = append(enc, sc...)
	s.mu.Lock()
	if s.parts == nil {
		s.parts = map[string][]byte{}
	}
	s.parts[strconv.Quote(marker)] = enc
	s.mu.Unlock()
	return placeholder(marker)
}

// apply replaces every placeholder content in p; ok is false when p has none.
func (s *splicer) apply(p []byte) ([]byte, bool) {
	if !bytes.Contains(p, []byte(splicePrefix)) {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	rest := p
	for {
		i := bytes.Index(rest, []byte(placeholderHead+`"`+splicePrefix))
		if i < 0 {
			break
		}
		q := i + len(placeholderHead)
		end := bytes.IndexByte(rest[q+1:], '"')
		if end < 0 {
			break
		}
		quoted := string(rest[q : q+end+2])
		enc, ok := s.parts[quoted]
		if !ok || !bytes.HasPrefix(rest[q+end+2:], []byte(placeholderTail)) {
			break
		}
		delete(s.parts, quoted)
		if out == nil {
			out = make([]byte, 0, len(p)+len(enc))
		}
		out = append(out, rest[:i]...)
		out = append(out, `"content":`...)
		out = append(out, enc...)
		rest = rest[q+end+2+len(placeholderTail):]
	}
	if out == nil {
		return nil, false
	}
	return append(out, rest...), true
}

// spliceWriter is the ResponseWriter mcp-go writes a request's response to.
// mcp-go writes each JSON-RPC message (a JSON body, or one SSE event) with
// one Write, so a placeholder never straddles two.
type spliceWriter struct {
	http.ResponseWriter
	sp *splicer
}

func (w *spliceWriter) Write(p []byte) (int, error) {
	if out, ok := w.sp.apply(p); ok {
		if _, err := w.ResponseWriter.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps SSE streaming (mcp-go checks for http.Flusher).
func (w *spliceWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *spliceWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func withSplicer(ctx context.Context, sp *splicer) context.Context {
	return context.WithValue(ctx, spliceKey{}, sp)
}

func splicerFrom(ctx context.Context) *splicer {
	sp, _ := ctx.Value(spliceKey{}).(*splicer)
	return sp
}

// renderBuf returns an empty buffer with room for n bytes, to render a
// result into. On the fast path the result only lives until the response is
// written (run copies it out), so the buffer comes from a pool and goes back
// after; elsewhere (mcp-go keeps the result) it is a new one.
func renderBuf(ctx context.Context, n int) []byte {
	fr := fastResultFrom(ctx)
	if fr == nil {
		return make([]byte, 0, n)
	}
	if fr.scratch == nil {
		fr.scratch = getRespBuf()
	}
	fr.scratch.b = slices.Grow(fr.scratch.b[:0], n)
	return fr.scratch.b
}

// finish completes a successful result: the text copy of its
// structuredContent, or, on /agent/mcp, a placeholder for the splicer or
// the fast path.
func finish(ctx context.Context, res *mcpgo.CallToolResult) *mcpgo.CallToolResult {
	sc, ok := res.StructuredContent.(json.RawMessage)
	if !ok || res.IsError || len(res.Content) > 0 {
		return res
	}
	if fr := fastResultFrom(ctx); fr != nil { // the fast path writes it (fastpath.go)
		fr.sc = sc
		return &fr.res
	}
	if sp := splicerFrom(ctx); sp != nil {
		return sp.put(sc)
	}
	res.Content = []mcpgo.Content{mcpgo.NewTextContent(string(sc))}
	return res
}
