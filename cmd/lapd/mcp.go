package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/mcp"
)

// runMCP is `lapd mcp`: the stdio MCP bridge. stdout carries only MCP
// messages; logs go to stderr.
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) error {
	var url, level string
	var readBudget time.Duration
	fs := newFlagSet("lapd mcp", stdout, env)
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
	cfg := mcp.Config{
		Client:  lap.NewHTTPClient(&http.Client{}),
		Logger:  log,
		Name:    "lapd",
		Version: lapdVersion(),
	}
	cfg.Budgets.Read = readBudget
	if url != "" {
		u, err := neturl.Parse(url)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageError{"--url must be an http(s) URL such as http://127.0.0.1:8787/agent/lap/v1"}
		}
		cfg.DefaultURL = strings.TrimRight(url, "/")
	}
	log.Info("lapd mcp: serving MCP on stdio", "default_url", url)
	if err := mcp.ServeStdio(ctx, cfg, stdin, stdout); err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}
