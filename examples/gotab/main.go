// Command gotab is a headless "browser tab" written in Go: it pairs with a
// lapd over the WebSocket using a minted token and answers LAP RPC frames for
// a tiny counter/todo app (lapdtest.DemoApp), the way client/lapd.js does in
// a real page. It exists so that the README's curl walk-through works
// without a browser (the whole block is in README.md, "Walk-through with
// curl"; e2e/readme_curl_test.go runs it):
//
//	go build -o bin/ ./cmd/lapd ./examples/gotab
//	bin/lapd serve --audit sqlite &
//	MINT=$(curl -sS -X POST http://127.0.0.1:8787/agent/mint)
//	TOKEN=$(echo "$MINT" | sed 's/.*"token":"\([^"]*\)".*/\1/')
//	bin/gotab --url http://127.0.0.1:8787 --token "$TOKEN" &
//
// Its actions: inc, addTodo {title}, clearAll (needs the human's approval:
// gotab approves every request after --approve-after, or never when 0) and
// reset (human-only: refused to the LLM).
//
// Like lapd.js it stays paired across server restarts: when the connection
// drops it reconnects with the same token after 1, 2, 4, 8, 16, then 30 s,
// keeping its state, and gives up after 5 minutes; a revoked or expired
// session ends it. All of that is lapdtest.Keep; this file is flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gotab:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// run is the whole command; it returns nil when ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("gotab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:8787", "lapd base URL")
	token := fs.String("token", getenv("LAPD_TOKEN"), "agent token from POST /agent/mint (env LAPD_TOKEN)")
	tabSecret := fs.String("tab-secret", getenv("LAPD_TAB_SECRET"), "the tabSecret of a mint with body {\"tab\":true} (env LAPD_TAB_SECRET); needed for such a session, whose socket opens only with it")
	approveAfter := fs.Duration("approve-after", 2*time.Second, "approve confirmation requests after this long (0 = leave them pending)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{err.Error()}
	}
	if !strings.HasPrefix(*token, "agt_") {
		return usageError{"--token must be an agt_… token from POST /agent/mint"}
	}
	u, err := url.Parse(*base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{"--url must be like http://127.0.0.1:8787"}
	}
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path = strings.TrimRight(u.Path, "/") + "/agent/ws"

	app := lapdtest.DemoApp()
	app.Name = "gotab"
	onTab := func(tab *lapdtest.Tab) {
		fmt.Fprintln(stderr, "gotab: paired; answering LAP calls (Ctrl-C to stop)")
		if *approveAfter > 0 {
			go approve(ctx, tab, *approveAfter, stderr)
		}
	}
	return lapdtest.Keep(ctx, u.String(), *token, onTab, lapdtest.WithApp(app), lapdtest.WithTabSecret(*tabSecret))
}

// approve approves each approval the tab is asked for, after d, as a
// patient human would, until the tab goes away.
func approve(ctx context.Context, tab *lapdtest.Tab, d time.Duration, stderr io.Writer) {
	for {
		id, err := tab.WaitConfirm(ctx)
		if err != nil {
			return
		}
		fmt.Fprintf(stderr, "gotab: approval %s requested; approving in %s\n", id, d)
		go func() {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				_ = tab.Approve(ctx, id)
			case <-tab.Done():
			case <-ctx.Done():
			}
		}()
	}
}
