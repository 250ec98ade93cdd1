package tokens_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/lapd-dev/lapd/tokens"
)

// A tab is paired in three steps: the app mints a token, the tab opens its
// WebSocket with it (Accept), and the LLM's first LAP call activates it.
func ExampleManager() {
	ctx := context.Background()
	m, err := tokens.NewManager(tokens.Config{Store: tokens.NewMemoryStore()})
	if err != nil {
		panic(err)
	}

	// POST /agent/mint: the token is shown once; only its hash is stored.
	token, rec, err := m.Mint(ctx, "alice", "https://app.example", "")
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.HasPrefix(token, tokens.Prefix), len(token), rec.Status)

	// GET /agent/ws?token=…: checked before the upgrade.
	rec, repair, err := m.Accept(ctx, token)
	fmt.Println(rec.Status, repair, err)

	// The first LAP call: verify the bearer, then activate.
	rec, err = m.Verify(ctx, token)
	fmt.Println(rec.Status, err)
	rec, changed, err := m.Activate(ctx, rec.TID)
	fmt.Println(rec.Status, rec.Label, changed, err)

	// Output:
	// true 47 awaiting-ws
	// awaiting-claude false <nil>
	// awaiting-claude <nil>
	// active alice true <nil>
}
