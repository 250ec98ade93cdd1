package mcp

import (
	"errors"
	"fmt"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/internal/storeerr"
	"github.com/lapd-dev/lapd/lap"
)

// Codes the tool layer adds to the LAP wire codes. They appear first in the
// text of an isError result and as error.code in its structuredContent.
const (
	CodeUnbound          = "unbound"           // nothing connected in this caller's scope
	CodeSessionRequired  = "session-required"  // several bindings, or a modern client without a session
	CodeUnknownSession   = "unknown-session"   // the handle is not (or no longer) bound
	CodeInvalidArguments = "invalid-arguments" // the tool arguments are wrong
	CodeNetwork          = "network"           // lapd unreachable or the call's budget ran out
	CodeCancelled        = "cancelled"         // the MCP client cancelled the call
)

// errCancelled answers a call its MCP client cancelled. The client
// discards it (it asked for the cancel), but logs, metrics and a client that
// reads it anyway see what happened rather than "network".
var errCancelled = &toolError{Code: CodeCancelled, Hint: "the client cancelled this call before it finished; call observe to see whether it took effect before repeating it."}

// toolError is a failure the model can act on: a code, one sentence of what
// to do, and the facts behind it.
type toolError struct {
	Code       string
	Hint       string // one sentence: what to do next
	Detail     string
	RetryAfter time.Duration
	Reconnect  string
	Extra      map[string]any // merged into structuredContent (e.g. the LAP body of a rejected dispatch)

	detailInHint bool // Hint already says Detail: the text does not repeat it
}

func (e *toolError) Error() string { return e.Code + ": " + e.Hint }

// result renders e as an isError tool result: text "<code>: <hint>[ (detail)]"
// plus structuredContent {error:{code, detail?, retryAfterMs?, reconnect?}, …Extra}.
func (e *toolError) result() *mcpgo.CallToolResult {
	text := e.Code + ": " + e.Hint
	if e.Detail != "" && !e.detailInHint {
		text += " (" + e.Detail + ")"
	}
	eb := map[string]any{"code": e.Code}
	if e.Detail != "" {
		eb["detail"] = e.Detail
	}
	if e.RetryAfter > 0 {
		eb["retryAfterMs"] = e.RetryAfter.Milliseconds()
	}
	if e.Reconnect != "" {
		eb["reconnect"] = e.Reconnect
	}
	sc := map[string]any{}
	for k, v := range e.Extra {
		sc[k] = v
	}
	sc["error"] = eb
	res := mcpgo.NewToolResultStructured(sc, text)
	res.IsError = true
	return res
}

func seconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

const askForLine = "ask the user for a new connect line from the app's \"Connect an AI\" panel and call connect_session with it"

// fromLAP maps a LAP error (after the executor's retries) to what the model
// should do. base names the endpoint for network errors ("" = in-process).
func fromLAP(err error, base string) *toolError {
	var te *toolError
	if errors.As(err, &te) {
		return te
	}
	var le *lap.Error
	if !errors.As(err, &le) {
		le = &lap.Error{Code: CodeNetwork, Detail: err.Error()}
	}
	e := &toolError{Code: le.Code, Detail: le.Detail, RetryAfter: le.RetryAfter, Reconnect: le.Reconnect}
	switch le.Code {
	case "paused", "revoked", "auth-failed", "rate-limited", "timeout":
		// LAP's detail for these is the same advice in words for bridges
		// that show only code and detail; the hint below says it already.
		e.Detail = ""
	}
	switch le.Code {
	case "auth-failed":
		e.Hint = "the connect token is invalid or expired; " + askForLine + "."
	case "revoked":
		e.Hint = "the user revoked this session in the app; " + askForLine + " if they want to continue."
	case "paused":
		switch le.Reconnect {
		case "expired":
			e.Hint = "the app session expired while the tab was away; " + askForLine + "."
		case "revoked", "unknown":
			e.Hint = "this app session no longer exists; " + askForLine + "."
		default:
			e.Hint = fmt.Sprintf("the app tab is reconnecting; retry in %d s (if it keeps failing, ask the user to reopen the app tab).", seconds(le.RetryAfter))
		}
	case "rate-limited":
		e.Hint = fmt.Sprintf("too many calls; wait %d s before the next one.", seconds(le.RetryAfter))
	case lap.CodeUnavailable:
		e.Hint = unavailableHint(le.RetryAfter)
	case "timeout":
		e.Hint = "the app did not answer in time; call observe to see the current state before trying again."
	case "schema-error":
		e.Hint = "the request was rejected as invalid; fix the arguments (call observe for the valid actions and their payloads)."
	case "invalid":
		// LAP's detail names what is wrong (and, for an unknown confirmId,
		// what to do): it is the sentence, in the text once.
		e.Hint = "the request was rejected as invalid; fix the arguments."
		if le.Detail != "" {
			e.Hint, e.detailInHint = "the request was rejected: "+strings.TrimSuffix(le.Detail, ".")+".", true
		}
	case lap.CodeOutcomeUnknown:
		e.Hint = "an earlier call with this idempotencyKey reached the app, but its outcome is unknown; call observe to see whether it took effect before sending it again (with a new idempotencyKey)."
	case lap.CodeConflict:
		e.Hint = "the app reused the id of an approval that is still waiting; ask the user to answer it in the app (or reload the app), then try again."
	case "payload-too-large":
		e.Hint = "the request is too large; send a smaller payload."
		if le.Detail != "" { // LAP's names the limit
			e.Hint, e.detailInHint = strings.TrimSuffix(le.Detail, ".")+".", true
		}
	case CodeNetwork:
		where := "lapd"
		if base != "" {
			where = "lapd at " + base
		}
		e.Hint = where + " is unreachable or did not answer in time; check that lapd and the app are running, then retry (calls with the same idempotencyKey are safe to repeat)."
	default:
		e.Hint = "lapd or the app failed; call observe and retry once, then tell the user what failed."
	}
	return e
}

// storeUnavailable says why a call waits or failed when one of lapd's
// stores (tokens, approvals, MCP session bindings) did not answer.
const storeUnavailable = "lapd's session store did not answer"

// unavailableHint is the hint of an unavailable error (LAP 503, or the
// bindings store): temporary, retry after d.
func unavailableHint(d time.Duration) string {
	return fmt.Sprintf("%s (a cluster electing a leader, or NATS unreachable); this is temporary: retry in %d s.", storeUnavailable, seconds(d))
}

// bindingError maps a Bindings lookup failure.
func bindingError(err error, handle string, visible []BindingSummary) *toolError {
	switch {
	case errors.Is(err, ErrBindingsUnavailable):
		// The same code and shape as LAP's 503 unavailable (fromLAP).
		d := storeerr.RetryAfterMs * time.Millisecond
		return &toolError{Code: lap.CodeUnavailable, Hint: unavailableHint(d), RetryAfter: d}
	case errors.Is(err, ErrUnbound):
		return &toolError{Code: CodeUnbound, Hint: "no app is connected; call connect_session with the line the user copied from the app's \"Connect an AI\" panel (ask them for it if you do not have it)."}
	case errors.Is(err, ErrAmbiguous):
		parts := make([]string, len(visible))
		for i, v := range visible {
			parts[i] = v.Session
			if v.AppName != "" {
				parts[i] += " (" + v.AppName + ")"
			}
		}
		return &toolError{Code: CodeSessionRequired,
			Hint:  "several apps are connected (" + strings.Join(parts, ", ") + "); pass session with one of these handles.",
			Extra: map[string]any{"sessions": visible}}
	case errors.Is(err, ErrSessionRequired):
		return &toolError{Code: CodeSessionRequired, Hint: "pass the session handle that connect_session returned (this MCP client keeps no session, so lapd cannot pick one for you); if you have none, call connect_session first."}
	default:
		return &toolError{Code: CodeUnknownSession, Hint: "session " + handle + " is unknown or expired; call connect_session again with the user's connect line."}
	}
}

func invalidArgs(format string, a ...any) *toolError {
	return &toolError{Code: CodeInvalidArguments, Hint: fmt.Sprintf(format, a...) + "."}
}
