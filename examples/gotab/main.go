// Command gotab is a headless "browser tab" written in Go: it pairs with a
// lapd over the WebSocket using a minted token and answers LAP RPC frames for
// a tiny counter/todo app, the way client/lapd.js does in a real page. It
// exists so that the README's curl walk-through works without a browser:
//
//	TOKEN=$(curl -s -X POST http://127.0.0.1:8787/agent/mint | sed 's/.*"token":"\([^"]*\)".*/\1/')
//	go run ./examples/gotab --token "$TOKEN" &
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8787/agent/lap/v1/observe
//
// Its actions: inc, addTodo {title}, clearAll (needs the human's approval:
// gotab approves every request after --approve-after, or never when 0) and
// reset (human-only: refused to the LLM).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:8787", "lapd base URL")
	token := flag.String("token", os.Getenv("LAPD_TOKEN"), "agent token from POST /agent/mint (env LAPD_TOKEN)")
	approveAfter := flag.Duration("approve-after", 2*time.Second, "approve confirmation requests after this long (0 = leave them pending)")
	flag.Parse()
	if !strings.HasPrefix(*token, "agt_") {
		fmt.Fprintln(os.Stderr, "gotab: --token must be an agt_… token from POST /agent/mint")
		os.Exit(2)
	}
	u, err := url.Parse(*base)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "gotab: --url must be like http://127.0.0.1:8787")
		os.Exit(2)
	}
	u.Scheme = map[string]string{"https": "wss"}[u.Scheme]
	if u.Scheme == "" {
		u.Scheme = "ws"
	}
	u.Path = "/agent/ws"

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tab, err := lapdtest.Dial(ctx, u.String(), *token,
		lapdtest.WithAppName("gotab"),
		lapdtest.WithActions(lapdtest.DemoActions()...),
		lapdtest.WithPolicy(lapdtest.DemoPolicy()),
		lapdtest.WithState(map[string]any{"count": 0, "todos": []any{}}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotab:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "gotab: paired; answering LAP calls (Ctrl-C to stop)")
	seen := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			tab.Close()
			return
		case <-tab.Done():
			fmt.Fprintln(os.Stderr, "gotab: connection closed:", tab.Err())
			os.Exit(1)
		case <-tick.C:
			if *approveAfter <= 0 {
				continue
			}
			for _, id := range tab.PendingConfirms() {
				if seen[id] {
					continue
				}
				seen[id] = true
				fmt.Fprintf(os.Stderr, "gotab: approval %s requested; approving in %s\n", id, *approveAfter)
				time.AfterFunc(*approveAfter, func() { tab.Approve(context.Background(), id) })
			}
		}
	}
}
