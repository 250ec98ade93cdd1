package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
)

// version is set with -ldflags "-X main.version=…"; otherwise the module
// version from the build info.
var version = ""

func lapdVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}

const usage = `lapd lets an LLM drive a live web app, with the human in the loop.

Usage:
  lapd serve    run the LAP server, /agent/mcp, the browser client and the demo app
  lapd mcp      run the stdio MCP bridge (for Claude Desktop / Claude Code)
  lapd audit    print and filter audit entries
  lapd version  print the version

Run "lapd <command> --help" for a command's flags.
`

// run is the whole program; main only wires the process to it.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env ...func(string) string) error {
	getenv := osEnv
	if len(env) > 0 && env[0] != nil {
		getenv = env[0]
	}
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return runServe(ctx, args, stdout, stderr, getenv)
	case "mcp":
		return runMCP(ctx, args, stdin, stdout, stderr, getenv)
	case "audit":
		return runAudit(ctx, args, stdout, stderr, getenv)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "lapd", lapdVersion())
		return nil
	case "help", "--help", "-h", "-help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		return usageError{fmt.Sprintf("unknown command %q\n\n%s", cmd, usage)}
	}
}
