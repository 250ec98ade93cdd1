package main

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/lapd-dev/lapd/client"
	"github.com/lapd-dev/lapd/internal/app"
)

// mountExtras mounts the browser client, the demo app and /agent/mcp on the
// app's mux.
func mountExtras(a *app.App, c serveConfig, log *slog.Logger) error {
	ch := client.Handler()
	a.Mux.Handle("GET /agent/client.js", ch)
	a.Mux.Handle("GET /agent/client.d.ts", ch)
	return nil
}

func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) error {
	return errors.New("mcp: not wired yet")
}
