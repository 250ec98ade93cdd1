package lap

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
)

// InProcessClient is a Client that runs the Server's own handler on an
// in-memory request: no network hop, but every gate applies exactly as over
// HTTP (the bearer goes in the Authorization header). base is ignored.
type InProcessClient struct {
	s *Server
}

var _ Client = (*InProcessClient)(nil)

// Client returns an in-process Client for s.
func (s *Server) Client() *InProcessClient { return &InProcessClient{s: s} }

// Call implements Client.
func (c *InProcessClient) Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Code: "network", Detail: "cancelled: " + err.Error()}
	}
	var rd io.Reader = http.NoBody
	var n int64
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, &Error{Code: CodeInvalid, Detail: "encode body: " + err.Error()}
		}
		rd, n = bytes.NewReader(b), int64(len(b))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://lapd.in-process"+c.s.cfg.BasePath+route, rd)
	if err != nil {
		return nil, &Error{Code: "network", Detail: err.Error()}
	}
	req.ContentLength = n
	req.RemoteAddr = "in-process:0"
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	rec := &memWriter{h: http.Header{}, status: http.StatusOK}
	c.s.handler.ServeHTTP(rec, req)
	if err := ctx.Err(); err != nil && rec.status >= 300 {
		return nil, &Error{Code: "network", Detail: "cancelled: " + err.Error()}
	}
	return parseResponse(rec.status, rec.h, rec.buf.Bytes())
}

// memWriter is a minimal in-memory http.ResponseWriter.
type memWriter struct {
	h      http.Header
	status int
	wrote  bool
	buf    bytes.Buffer
}

func (m *memWriter) Header() http.Header { return m.h }

func (m *memWriter) WriteHeader(code int) {
	if !m.wrote {
		m.status, m.wrote = code, true
	}
}

func (m *memWriter) Write(b []byte) (int, error) {
	m.wrote = true
	return m.buf.Write(b)
}
