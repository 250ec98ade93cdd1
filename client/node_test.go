package client

import (
	"os"
	"os/exec"
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
	cmd := exec.CommandContext(t.Context(), node, "--test", "test/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test test/: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
