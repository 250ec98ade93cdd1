// Package lapd is the front door for Go programs: it turns one Config into a
// running lapd (tokens, pairing, approvals, audit, LAP, the MCP endpoint and
// the browser client) that you mount in your own HTTP server. The lapd
// binary (cmd/lapd) is this package plus flags.
//
// # First: New, Handler, Shutdown
//
//	agent, err := lapd.New(ctx, lapd.Config{
//		DataDir:  "lapd-data", // SQLite: tokens and approvals survive restarts
//		Identity: lap.IdentityFunc(func(r *http.Request) (string, error) { return currentUser(r), nil }),
//	})
//	if err != nil { … }
//	mux.Handle("/agent/", agent.Handler())
//	…
//	agent.Shutdown(ctx) // then your http.Server's Shutdown
//
// Handler serves, under Config.Prefix ("/agent"): the tab's WebSocket
// (/agent/ws), the meta routes a page calls (/agent/mint, /agent/revoke,
// /agent/resume/…, /agent/sessions), LAP v2 for an MCP bridge
// (/agent/lap/v1/…), the MCP Streamable HTTP endpoint (/agent/mcp) and the
// browser client (/agent/client.js, /agent/client.d.ts); and GET /healthz.
// Your page imports /agent/client.js and calls createAgent
// (client/README.md); a model connects to /agent/mcp, or runs `lapd mcp` as
// a stdio bridge to /agent/lap/v1.
//
// The zero Config is a working lapd: memory stores, MCP on, the parts'
// defaults, and no anonymous mint, since lapd cannot know who your users are
// until Identity tells it. Shutdown closes MCP sessions, lets calls in
// flight finish, tells every tab to reconnect (close 1012: the next process
// picks them up with the same token inside Grace), and flushes audit.
//
// # Your implementations
//
// Identity reads your own session; TokenStore and ConfirmStore replace the
// built-in SQLite or memory stores (keep them passing tokens/storetest and
// confirm/storetest); AuditSinks receive every audit entry. lapd closes the
// sinks on Shutdown, never your stores.
//
// # What each part owns
//
// The accessors return the parts for your own code: Tokens (mint, verify,
// list and revoke token records; only hashes are stored), Registry (the
// live tabs: RPC, watches, the activity log), Confirm (the approvals a
// human has not answered yet), Audit (every step and every refusal), LAP
// (the HTTP routes and an in-process lap.Client) and MCP (the endpoint's
// sessions). Revoke ends a session from your admin code: its token stops
// working and its tab is closed.
//
// # Operating it
//
// AdminHandler serves what the people who run lapd need, on a listener of
// its own: Prometheus metrics (/metrics), Go's profiler, health checks and
// the admin console (/admin/: sessions with revoke, the audit trail, a live
// chart). Turn it on with Config.Admin (Enabled, Token); /healthz and
// /readyz are in Handler too. Every meta and LAP call gets a request id
// (X-Request-Id) that its audit entries and the rpc frame to the tab carry.
// docs/OPERATING.md lists the metrics and sample alert rules.
//
// # Testing
//
// Package lapdtest starts a lapd on a loopback listener and pairs a
// headless tab that answers as client/lapd.js does, so your tests drive
// your integration through LAP or MCP without a browser;
// examples/embed-go is a complete app module with such a test.
package lapd
