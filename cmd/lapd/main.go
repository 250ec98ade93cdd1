// Command lapd is the lapd server and its tools.
//
//	lapd serve   run the LAP server, the /agent/mcp endpoint, the browser client and the demo app
//	lapd mcp     run the stdio MCP bridge (for Claude Desktop / Claude Code) against a lapd
//	lapd audit   print and filter audit entries
//	lapd version print the version
//
// Every flag can also be set with an environment variable: --data-dir is
// LAPD_DATA_DIR, and so on. Flags win over the environment.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// stopSignals end `lapd serve` gracefully; a second one stops it at once.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

func main() {
	// SIGHUP too: a terminal closed under `lapd serve` (an ssh session
	// that ends) killed it at once by Go's default, losing the queued audit
	// entries and cutting in-flight calls; it now stops as gracefully as
	// SIGTERM.
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// The library's errors start with "lapd: " too: say it once.
		msg := strings.TrimPrefix(err.Error(), "lapd: ")
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "lapd:", msg)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "lapd:", msg)
		os.Exit(1)
	}
}
