package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestNode runs the JavaScript unit tests (client/test/*.test.mjs) under
// `node --test`. Without node the test is skipped, unless CI=true.
func TestNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is required when CI=true: ", err)
		}
		t.Skip("node not installed")
	}
	// Read the test files here so `go test`'s cache is invalidated when they
	// change (it only tracks files the Go process itself opens).
	entries, err := os.ReadDir("test")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, err := os.ReadFile(filepath.Join("test", e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), node, "--test", "test/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test test/: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
