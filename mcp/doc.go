// Package mcp is lapd's MCP face: the tool catalogue of LAP v2
// (connect_session, observe, send_message, …) and an executor that runs it
// over a lap.Client, served over stdio (`lapd mcp`) or Streamable HTTP
// (/agent/mcp). It reaches lapd only through lap.Client.
//
// # Serving
//
// The stdio bridge talks to a remote lapd over HTTP:
//
//	err := mcp.ServeStdio(ctx, mcp.Config{Client: lap.NewHTTPClient(nil), Logger: stderrLogger}, os.Stdin, os.Stdout)
//
// It returns nil on EOF or when ctx is cancelled, and writes nothing but
// protocol messages to out. Inside `lapd serve` the endpoint uses the
// in-process client (no HTTP hop; LAP's gates and audit still apply, so tool
// calls are not audited twice):
//
//	h, err := mcp.NewHTTPHandler(mcp.HTTPConfig{Config: mcp.Config{Client: lapServer.Client()}, Audit: auditLog})
//	mux.Handle("/agent/mcp", h)
//	defer h.Close(ctx)
//
// NewServer returns the bare *server.MCPServer (mcp-go) and the Executor for
// other transports and for tests.
//
// # Tools
//
// Config.Tools picks the tools listed: ToolsCore (the default:
// connect_session, observe, send_message, get_confirm_result,
// wait_for_change, narrate — the whole connect → act → approve → narrate
// flow) or ToolsAll (16). Every definition a model is given costs it input
// on every turn, so descriptions are short, a property shared by every tool
// (session) is one line, and output schemas list names and types only.
// Tools are listed in workflow order with a title and all four annotations
// set on purpose (reads: read-only, idempotent, closed-world; send_message:
// destructive, not idempotent, open-world because app effects reach the
// app's backend — but safe to retry with its idempotencyKey; narrate:
// neither read-only nor destructive nor idempotent; connect/disconnect:
// idempotent). docs/TOOLS.md is generated from the catalogue and
// testdata/tools.golden.json snapshots every schema (`go test ./mcp -update`
// rewrites both).
//
// # Lean results
//
// Every byte a tool returns is read by the model on every later turn.
// connect_session's result is the first observation (no observe after it);
// its state is kept under 1 KiB by leaving out the largest top-level parts,
// named in stateOmitted. Action entries leave out null, empty and default
// fields and carry one payload signature built from the app's message
// schemas. Per binding the executor remembers the action list the model was
// last shown, and a dispatch returns actionsChanged only when it changed.
// send_message takes several actions as msgs, dispatched in order (each its
// own LAP call, idempotency key and audit entry), stopping at the first
// that is not dispatched, with one combined diff. An action that needs
// approval waits approvalTimeoutMs (default 20 s) for the human; a
// confirmed result's stateAfter is current. observe always returns the whole
// picture and verbose:true the LAP body as it came. lean.go has the rules;
// docs/TOOLS.md "The lean flow" says them for users.
//
// # Results and errors
//
// A success is a JSON object: structuredContent and, as text, the same
// compact bytes. On /agent/mcp they are encoded once: the executor hands
// mcp-go a placeholder and the response writer splices the bytes in
// (splice.go). A plain tools/call (JSON answer, no progress token, a
// session that was never sent a notification) does not go through mcp-go's
// JSON-RPC machinery at all: the endpoint's fast path (fastpath.go) checks
// what mcp-go checks, calls the same handler and writes the same bytes, and
// leaves every other request to mcp-go (HTTPConfig.DisableFastPath turns it
// off). A refusal by the app, its policy or the user (status
// rejected with reason human-only, invalid, schema-error, user-cancelled, …;
// pending-confirmation) is a result with isError false and a next hint. A
// failure of the tool itself is an isError result whose text starts with a
// code — a LAP code (auth-failed, revoked, paused, rate-limited, timeout,
// invalid, network, …) or one of ours (unbound, session-required,
// unknown-session, invalid-arguments, cancelled: the client cancelled the
// call) — followed by one sentence saying what
// to do; structuredContent.error repeats {code, detail, retryAfterMs,
// reconnect}.
//
// Within a call's budget (reads 20 s; send_message: the larger of timeoutMs
// and approvalTimeoutMs, + 2 s, per message; get_confirm_result and
// wait_for_change: their timeoutMs + 2 s) the executor retries a 503 paused
// with reconnect=pending (polling at least every 2 s: its Retry-After is
// what is left of the grace window), a 429 and a 503 unavailable (a store
// that did not answer) after Retry-After (send_message only within
// timeoutMs + 2 s), re-sending the same body, so every message keeps
// its idempotency key (one is generated when the model gives none, and
// returned when a call fails). While it waits it sends
// notifications/progress about once a second if the request carried a
// progress token; nothing depends on them arriving.
//
// # Sessions and handles
//
// connect_session returns a handle s_<16 base32> (80 random bits) naming a
// binding {base URL, token, app}. Over stdio the process is one caller; over
// HTTP a legacy client's bindings belong to its MCP session (DELETE drops
// them). A caller with exactly one binding may omit `session`; with several,
// the error lists them. A modern (2026-07-28) HTTP client has no MCP session,
// so it gets no default: it passes the handle, which is the capability.
// Bindings: 256 in all (a full table evicts the LRU binding of the token
// holding the most), 16 per caller scope (an MCP session or the stdio
// bridge; modern HTTP clients have none), 8 per token (LRU evicted), 30 min
// idle expiry; expiry is lazy, so the table starts no goroutines. Tokens are kept
// in memory only and never logged (logs name a token by a hash prefix). In
// a cluster a binding is also kept in the cluster's bucket, so its handle
// works on every node; while that bucket does not answer, connect_session
// and a call with a handle bound elsewhere wait 2 s and try again (as for a
// 503 unavailable, up to MaxRetries within the 20 s read budget), then fail
// with code unavailable ("temporary: retry in 2 s"), never unknown-session.
//
// # HTTP endpoint bounds (defaults, after the reference)
//
// mcp-go's Streamable HTTP server runs stateful (so DELETE ends a session and
// later requests get 404) with both protocol eras and its DNS-rebinding
// protection on. In front of it: a browser Origin not in AllowedOrigins (and
// not same-origin) gets 403 forbidden-origin; session creation is limited per
// client IP (1/s, burst 10 → 429 + Retry-After); at most 64 sessions (503
// session-capacity, Retry-After 30), 16 of them not yet connected (the least
// recently used of those is evicted), 8 per token (connecting a 9th evicts
// that token's oldest); sessions expire after 30 min idle, unconnected ones
// 30 min after creation. These keep an unauthenticated caller from holding
// memory, and keep one leaked token from crowding out everyone else.
// Refusals are audited (refused, rate-limited). Unlike the reference, a bearer
// on the initialize request is not verified there: tools need connect_session
// anyway, which verifies the token through LAP.
package mcp
