package main

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/lapd-dev/lapd/internal/app"
)

// mountExtras mounts /agent/mcp, /agent/client.js and the demo app. Filled in
// as those packages land.
func mountExtras(a *app.App, c serveConfig, log *slog.Logger) error { return nil }

func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) error {
	return errors.New("mcp: not wired yet")
}
