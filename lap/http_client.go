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

// NewHTTPClient returns a Client using hc (nil = a plain http.Client).
// Budgets come from the ctx of each Call. Redirects are not followed (a LAP
// server never redirects, and following one would carry the bearer to
// wherever it points), unless hc sets its own CheckRedirect.
func NewHTTPClient(hc *http.Client) *HTTPClient {
	c := http.Client{}
	if hc != nil {
		c = *hc
	}
	if c.CheckRedirect == nil {
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	return &HTTPClient{hc: &c}
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
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && !jsonBody(resp.Header, b) {
		return nil, &Error{Status: resp.StatusCode, Code: "network", Detail: notLAP(resp.StatusCode)}
	}
	return parseResponse(resp.StatusCode, resp.Header, b)
}

// jsonBody reports whether a response is JSON (as every LAP answer is).
func jsonBody(h http.Header, b []byte) bool {
	ct := strings.ToLower(h.Get("Content-Type"))
	return strings.HasPrefix(ct, "application/json") && json.Valid(b)
}

// notLAP says a response was not LAP, without repeating it: a URL that
// points elsewhere must not turn its body into text the model reads.
func notLAP(status int) string {
	return "HTTP " + strconv.Itoa(status) + " that is not a LAP response; is the url the app's LAP base (…/agent/lap/v1)?"
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
		// Not the LAP error envelope: say so, never repeat the body.
		e.Code, e.Detail = CodeInternal, notLAP(status)
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
