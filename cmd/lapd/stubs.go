package main

import (
	"context"
	"errors"
	"io"
)

// Temporary until the packages land.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) error {
	return errors.New("serve: not wired yet")
}
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) error {
	return errors.New("mcp: not wired yet")
}
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) error {
	return errors.New("audit: not wired yet")
}
