package lap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"sync"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// Wire error codes (LAP v2 plus lapd's additions).
const (
	CodeAuthFailed       = "auth-failed"
	CodeAuthRequired     = "auth-required"
	CodeRevoked          = "revoked"
	CodePaused           = "paused"
	CodeRateLimited      = "rate-limited"
	CodeInvalid          = "invalid"
	CodeSchemaError      = "schema-error"
	CodeTimeout          = "timeout"
	CodeInternal         = "internal"
	CodeMethodNotAllowed = "method-not-allowed"
	CodePayloadTooLarge  = "payload-too-large"
	CodeNotFound         = "not-found"
	CodeShuttingDown     = "shutting-down"
	CodeForbiddenOrigin  = "forbidden-origin"
	CodeConflict         = "conflict"
	CodeUnavailable      = "unavailable" // lapd's: a store (tokens, approvals) did not answer (503, Retry-After)
)

// storeErr answers a token-store failure: 503 unavailable with Retry-After
// when the store did not answer (storeerr.Unavailable: in a cluster, NATS
// electing a stream leader or unreachable) and the caller is still there,
// else 500 internal with what (and err as the cause lapd logs).
func storeErr(ctx context.Context, err error, what string) *apiError {
	if storeerr.Unavailable(err) && ctx.Err() == nil {
		return unavailable("the session store did not answer (in a cluster: NATS is electing a leader or cannot be reached); retry in a few seconds")
	}
	return &apiError{status: http.StatusInternalServerError, code: CodeInternal, detail: what, cause: err}
}

// unavailable is the 503 for a store that did not answer (token store,
// approvals store): retry in storeerr.RetryAfterMs.
func unavailable(detail string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: CodeUnavailable, retryAfter: storeerr.RetryAfterMs, detail: detail}
}

// apiError is an error response: status plus the envelope fields and headers.
type apiError struct {
	status      int
	code        string
	detail      string
	retryAfter  int64  // ms; >0 adds retryAfterMs and a Retry-After header (seconds, rounded up)
	reconnect   string // 503 paused only
	retryAfterS int    // explicit Retry-After seconds (paused); overrides retryAfter's header
	// invalidToken marks a 401 for a bearer that was presented but is not
	// valid (RFC 6750 error="invalid_token").
	invalidToken bool
	inDoubt      bool // the tab may have acted on the call (an rpc frame was sent): not on the wire
	// cause is the error behind a 500 (a store's own error: disk full,
	// read-only, corrupt): logged by logFailure, never sent.
	cause error
}

func errf(status int, code, detail string) *apiError {
	return &apiError{status: status, code: code, detail: detail}
}

// retrySeconds is a Retry-After in ms as the whole seconds the header says.
func retrySeconds(ms int64) int64 {
	if s := (ms + 999) / 1000; s > 1 {
		return s
	}
	return 1
}

// rateText says a rate limit in words: "30 calls a minute (bursts of 30)".
func rateText(l rate.Limit, burst int, what string) string {
	if l == rate.Inf || l <= 0 {
		return "a limited number of " + what
	}
	return strconv.FormatFloat(float64(l)*60, 'g', 3, 64) + " " + what + " a minute (bursts of " + strconv.Itoa(burst) + ")"
}

// sizeText says a byte limit: "1 MiB", "64 KiB", "100 bytes".
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// bodyReadError maps a failed request body read: the read deadline (the body
// trickled in too slowly, or the server is shutting down) is 408 timeout.
func bodyReadError(err error) *apiError {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errf(http.StatusRequestTimeout, CodeTimeout, "the request body did not arrive in time; send it in one go")
	}
	return errf(http.StatusBadRequest, CodeInvalid, "reading body: "+err.Error())
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuf() *bytes.Buffer {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

func putBuf(b *bytes.Buffer) {
	if b.Cap() > 1<<20 {
		return // do not keep huge buffers
	}
	bufPool.Put(b)
}

func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	type body struct {
		Code       string `json:"code"`
		Detail     string `json:"detail,omitempty"`
		RetryAfter int64  `json:"retryAfterMs,omitempty"`
		Reconnect  string `json:"reconnect,omitempty"`
	}
	if e.reconnect != "" {
		h.Set("X-LLui-Reconnect", e.reconnect)
	}
	if e.status == http.StatusUnauthorized { // RFC 7235 §3.1, RFC 6750 §3
		c := `Bearer realm="lapd"`
		if e.invalidToken {
			c += `, error="invalid_token"`
		}
		h.Set("WWW-Authenticate", c)
	}
	switch {
	case e.retryAfterS > 0:
		h.Set("Retry-After", strconv.Itoa(e.retryAfterS))
	case e.retryAfter > 0:
		h.Set("Retry-After", strconv.FormatInt((e.retryAfter+999)/1000, 10))
	}
	b, _ := json.Marshal(map[string]body{"error": {Code: e.code, Detail: e.detail, RetryAfter: e.retryAfter, Reconnect: e.reconnect}})
	w.WriteHeader(e.status)
	_, _ = w.Write(b)
}

// writeJSON writes a 200 with v (json.RawMessage and []byte pass through).
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	switch x := v.(type) {
	case json.RawMessage:
		w.Header().Set("Content-Length", strconv.Itoa(len(x)))
		_, _ = w.Write(x)
	case []byte:
		w.Header().Set("Content-Length", strconv.Itoa(len(x)))
		_, _ = w.Write(x)
	default:
		buf := getBuf()
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			putBuf(buf)
			writeError(w, errf(http.StatusInternalServerError, CodeInternal, "encode response: "+err.Error()))
			return
		}
		b := bytes.TrimRight(buf.Bytes(), "\n")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
		putBuf(buf)
	}
}
