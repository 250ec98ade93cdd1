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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
