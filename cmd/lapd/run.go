package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
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
                (the default: plain "lapd" is "lapd serve")
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
	var err error
	switch cmd {
	case "serve":
		err = runServe(ctx, args, stdout, stderr, getenv)
	case "mcp":
		err = runMCP(ctx, args, stdin, stdout, stderr, getenv)
	case "audit":
		err = runAudit(ctx, args, stdout, stderr, getenv)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "lapd", lapdVersion())
		return nil
	case "help", "--help", "-h", "-help":
		if len(args) > 0 && (args[0] == "serve" || args[0] == "mcp" || args[0] == "audit") {
			return run(ctx, []string{args[0], "--help"}, stdin, stdout, stderr, env...)
		}
		fmt.Fprint(stdout, usage)
		return nil
	default:
		msg := fmt.Sprintf("unknown command %q", cmd)
		if strings.HasPrefix(cmd, "-") {
			msg = fmt.Sprintf("%q before a command (flags come after it, as in lapd serve %s)", cmd, cmd)
		} else if s := suggestCommand(cmd); s != "" {
			msg += " (did you mean " + s + "?)"
		}
		return usageError{msg + "\nRun \"lapd help\" to see the commands."}
	}
	var ue usageError
	if errors.As(err, &ue) {
		return usageError{ue.msg + "\nRun \"lapd " + cmd + " --help\" to see every flag."}
	}
	return err
}

// suggestCommand names the command a mistyped one probably meant, or "".
func suggestCommand(s string) string {
	best, bestD := "", 3
	for _, c := range []string{"serve", "mcp", "audit", "version", "help"} {
		if d := editDistance(strings.ToLower(s), c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}
