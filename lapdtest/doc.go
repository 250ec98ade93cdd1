// Package lapdtest is lapd's test double, as net/http/httptest is beside
// net/http: an in-process lapd on a loopback listener, and a headless tab
// that speaks the tab side of LAP v2 over a real WebSocket the way
// client/lapd.js does in a page. Use it to test your app's integration with
// lapd without a browser.
//
// # A server, a session, a tab
//
//	srv := lapdtest.NewServer(lapd.Config{})       // anonymous mint, memory stores
//	defer srv.Close()
//	tab, sess, err := srv.Pair(ctx, lapdtest.WithApp(myApp))
//	defer tab.Close()
//	// drive it: LAP at sess.LapURL with sess.Token, or MCP at srv.MCPURL()
//	// with sess.ConnectLine()
//
// Against a lapd mounted in your own server, mint and dial yourself:
//
//	sess, err := lapdtest.Mint(ctx, client, appURL+"/agent/mint") // client carries your login cookie
//	tab, err := sess.Pair(ctx, lapdtest.WithApp(myApp))
//
// Server also keeps every audit entry (AuditEntries, WaitAudit: a signal to
// wait on, not a poll) and can Restart on the same address, as a deploy
// would.
//
// # The app a tab plays
//
// An App names the state and the actions, each with an intent, a JSON
// Schema for its payload, requires-confirm or human-only, and an Apply
// function. The tab sends it in hello (msgSchema and policy, so lapd
// enforces the same policy as for the real page) and answers every rpc
// frame from it: get_state, query_state, list_actions, observe,
// describe_context, query_dom, describe_visible_content, would_dispatch and
// send_message (gated in the tab as well: unknown variant, human-only,
// schema). A send_message carrying an idempotencyKey runs once per key on
// one Tab; a repeat gets the first result, as in lapd.js. Without WithApp
// the tab plays DemoApp's counter and todo list without sending a policy.
// WithHandler overrides one tool (handlers may block: each rpc runs on its
// own goroutine).
//
// As lapd.js does, the tab sends a log-append after every rpc reply and
// echoes each log-push back as a log-append; WithoutLogAppend turns the
// former off (for a floor benchmark).
//
// # Approvals, watches and frames
//
// An action that requires confirm answers pending-confirmation and waits
// for the human, played by the test: WaitConfirm returns the next proposal,
// Server.Approve or Server.Reject answers it once lapd has recorded it (or
// Tab.Approve/Reject directly, e.g. after send_message returned
// pending-confirmation). Approve applies the msg and sends confirm-resolved
// {outcome:"confirmed", stateAfter}; Reject sends {outcome:
// "user-cancelled"}. Approvals lapd re-delivers (confirm-sync: after a
// reconnect, or after a /message retried with its idempotencyKey) are
// adopted as lapd.js does; one this tab answered already is answered
// again, not shown again. SetState changes the state as the human
// would, answering open watches with state-update frames. Every frame the
// server sent is recorded: Next, WaitFor, Frames and Count read them, Done
// and CloseStatus tell how the connection ended. Abort and Kill drop the
// connection without a close handshake (a crashed tab).
//
// A refused dial returns a *DialError with the HTTP status and body (lapd
// refuses a bad token before the upgrade); a refused mint a *MintError.
//
// Like lapd.js, Mint asks for a tab secret ({"tab":true}) and Session.Pair
// presents it: such a session's socket opens only with it, so a test that
// plays the LLM side with sess.Token alone (Dial without WithTabSecret) is
// refused, as the real LLM side is. The token and the secret go in
// Sec-WebSocket-Protocol entries; WithTokenInQuery dials as the reference
// client does (?token=, no tab secret).
//
// # Staying connected
//
// Dial connects once. Keep keeps a session's tab paired the way lapd.js
// does (pass WithTabSecret(sess.TabSecret) among its options): it reconnects after a server restart or a dropped connection with
// lapd.js's backoff (Backoff: 1, 2, 4, 8, 16, then 30 s; GiveUp after 5
// minutes), carries the app's state over, and stops with an *EndedError
// when the session is revoked, superseded or refused. examples/gotab is a
// command around it.
package lapdtest
