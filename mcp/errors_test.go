package mcp

import (
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

// LAP details that repeat the tool hint's advice are not shown twice; one
// that adds a fact (the body limit) is the hint.
func TestFromLAPDetailOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		le        lap.Error
		want, not string
	}{
		{lap.Error{Code: "auth-failed", Detail: "the token is unknown or expired; ask the user for a new connect line"}, "auth-failed: the connect token is invalid or expired", "(the token"},
		{lap.Error{Code: "rate-limited", Detail: "too many calls: this session may make 30 calls a minute; wait 2 s"}, "too many calls; wait", "(too many"},
		{lap.Error{Code: "timeout", Detail: "the app tab did not answer in time, and the action may have run"}, "call observe", "(the app tab"},
		{lap.Error{Code: "payload-too-large", Detail: "the request body is over lapd's 1 MiB limit for a LAP call; send a smaller body"}, "payload-too-large: the request body is over lapd's 1 MiB limit", "(the request"},
	} {
		s := fromLAP(&tc.le, "").result().Content[0].(mcpgo.TextContent).Text
		if !strings.Contains(s, tc.want) || strings.Contains(s, tc.not) {
			t.Errorf("%s: %q, want %q without %q", tc.le.Code, s, tc.want, tc.not)
		}
	}
}
