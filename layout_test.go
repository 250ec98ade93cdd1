package lapd_test

import (
	"go/build"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd"
)

// imports lists the lapd packages dir's non-test Go files import.
func imports(t *testing.T, dir string) []string {
	t.Helper()
	p, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	var out []string
	for _, imp := range p.Imports {
		if strings.HasPrefix(imp, lapd.ModulePath+"/") || imp == lapd.ModulePath {
			out = append(out, strings.TrimPrefix(imp, lapd.ModulePath+"/"))
		}
	}
	return out
}

// The layout DESIGN.md promises: internal/ holds leaves that import no lapd
// package, and cmd/lapd holds no wiring of its own (it reaches the parts
// only through lapd.New; lap, mcp and audit for the identity flags, the
// stdio bridge and reading audit).
func TestLayout(t *testing.T) {
	t.Parallel()
	dirs, _ := filepath.Glob("internal/*")
	if len(dirs) == 0 {
		t.Fatal("no internal packages found")
	}
	for _, dir := range dirs {
		if got := imports(t, dir); len(got) > 0 {
			t.Errorf("%s imports %v; internal/ holds leaves only", dir, got)
		}
	}
	allowed := []string{lapd.ModulePath, "lap", "mcp", "audit"}
	for _, imp := range imports(t, "cmd/lapd") {
		if !slices.Contains(allowed, imp) {
			t.Errorf("cmd/lapd imports %s: wiring belongs in lapd.New", imp)
		}
	}
}
