// Package lapd is the front door for Go programs: it turns one Config into a
// running lapd (tokens, pairing, approvals, audit, LAP, the MCP endpoint and
// the browser client) that you mount in your own HTTP server. The lapd
// binary (cmd/lapd) is this package plus flags.
//
// # Mount it
//
//	srv, err := lapd.New(ctx, lapd.Config{Identity: myIdentity})
//	if err != nil { … }
//	mux.Handle("/agent/", srv.Handler()) // WebSocket, mint, LAP, /agent/mcp, /agent/client.js
//	…
//	srv.Shutdown(ctx) // before your http.Server's Shutdown
//
// Your page loads /agent/client.js and calls createAgent (client/README.md);
// an MCP client connects to /agent/mcp, or runs `lapd mcp` as a stdio bridge
// that talks LAP to /agent/lap/v1.
//
// # What each part owns
//
// Tokens (tokens.Manager) are minted at {Prefix}/mint for the human your
// Identity names, hashed at rest, and survive restarts with the sqlite store.
// The pairing registry holds each tab's WebSocket; the LAP server turns LAP
// calls into RPCs to the tab, gated by token, pairing, rate and size; the
// confirm manager keeps the approvals the human has not answered yet; every
// step and every refusal goes to the audit log. The accessors (Tokens,
// Registry, Confirm, Audit, LAP, MCP) return those parts, and Revoke ends a
// session from your own admin code.
//
// # Test it
//
// Package lapdtest starts a lapd on a loopback listener and pairs a headless
// tab that answers as client/lapd.js does, so your tests can drive your app's
// integration through LAP or MCP without a browser.
package lapd
