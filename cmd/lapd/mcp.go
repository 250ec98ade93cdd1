package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/mcp"
)

// runMCP is `lapd mcp`: the stdio MCP bridge. stdout carries only MCP
// messages; logs go to stderr.
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) error {
	var url, level, toolSet string
	var readBudget time.Duration
	fs := newFlagSet("lapd mcp", stdout, env)
	fs.String(&toolSet, "tools", "core", "MCP tools listed: core (connect_session, observe, send_message, get_confirm_result, wait_for_change, narrate) or all (16); every tool answers when called by name")
	fs.String(&url, "url", "", "default LAP base URL for connect_session when the model passes only a token (e.g. http://127.0.0.1:8787/agent/lap/v1)")
	fs.String(&level, "log-level", "warn", "debug, info, warn, error (logs go to stderr)")
	fs.Duration(&readBudget, "read-budget", 20*time.Second, "time budget of a read tool call")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := newLogger(stderr, level, "text")
	if err != nil {
		return err
	}
	if readBudget <= 0 {
		return usageError{"--read-budget must be positive"}
	}
	tools, err := mcp.ParseToolSet(toolSet)
	if err != nil {
		return usageError{"--" + err.Error()}
	}
	cfg := mcp.Config{
		Client:  lap.NewHTTPClient(&http.Client{}),
		Tools:   tools,
		Logger:  log,
		Name:    "lapd",
		Version: lapdVersion(),
	}
	cfg.Budgets.Read = readBudget
	if url != "" {
		base, err := mcp.LAPBase(url)
		if err != nil {
			return usageError{"--url: " + err.Error()}
		}
		cfg.DefaultURL = base
	}
	if isTerminal(stdin) {
		// Someone typed "lapd mcp" to try it: without a word it just waits.
		fmt.Fprintln(stderr, "lapd mcp speaks MCP (JSON-RPC) on stdin and stdout: an MCP client starts it, nobody types to it.\n"+
			"Add it to Claude Desktop or Claude Code as the README's \"Try it\" says, or use lapd serve's /agent/mcp. Ctrl-C stops it.")
	}
	log.Info("lapd mcp: serving MCP on stdio", "default_url", url)
	if err := mcp.ServeStdio(ctx, cfg, stdin, stdout); err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

// isTerminal reports whether r is a terminal (a character device), as stdin
// is when a person runs the command by hand; MCP clients give it a pipe.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
