package lap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lapd-dev/lapd/audit"
)

// MaxResponse caps a LAP response body read by the clients.
const MaxResponse = 16 << 20

// HTTPClient is a Client over HTTP (the stdio bridge uses it).
type HTTPClient struct {
	hc *http.Client
}

var _ Client = (*HTTPClient)(nil)

// NewHTTPClient returns a Client using hc (nil = http.DefaultClient). Budgets
// come from the ctx of each Call.
func NewHTTPClient(hc *http.Client) *HTTPClient {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &HTTPClient{hc: hc}
}

// Call implements Client.
func (c *HTTPClient) Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, &Error{Code: CodeInvalid, Detail: "encode body: " + err.Error()}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+route, rd)
	if err != nil {
		return nil, &Error{Code: "network", Detail: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if rid := audit.RequestID(ctx); rid != "" {
		req.Header.Set(HeaderRequestID, rid)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		detail := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			detail = "timed out: " + detail
		}
		return nil, &Error{Code: "network", Detail: detail}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return nil, &Error{Status: resp.StatusCode, Code: "network", Detail: "reading response: " + err.Error()}
	}
	if len(b) > MaxResponse {
		return nil, &Error{Status: resp.StatusCode, Code: "network", Detail: fmt.Sprintf("response over %d bytes", MaxResponse)}
	}
	return parseResponse(resp.StatusCode, resp.Header, b)
}

// parseResponse turns a LAP HTTP response into the body or a *Error.
func parseResponse(status int, h http.Header, b []byte) (json.RawMessage, error) {
	if status >= 200 && status < 300 {
		return json.RawMessage(b), nil
	}
	var env struct {
		Error struct {
			Code       string `json:"code"`
			Detail     string `json:"detail"`
			RetryAfter int64  `json:"retryAfterMs"`
			Reconnect  string `json:"reconnect"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &env)
	e := &Error{Status: status, Code: env.Error.Code, Detail: env.Error.Detail, Reconnect: env.Error.Reconnect}
	if e.Code == "" {
		e.Code = CodeInternal
		if e.Detail == "" {
			e.Detail = strings.TrimSpace(string(b[:min(len(b), 200)]))
		}
	}
	if v := h.Get("X-LLui-Reconnect"); v != "" {
		e.Reconnect = v
	}
	if env.Error.RetryAfter > 0 {
		e.RetryAfter = time.Duration(env.Error.RetryAfter) * time.Millisecond
	} else if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return nil, e
}
