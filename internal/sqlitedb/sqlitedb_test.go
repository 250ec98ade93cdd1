package sqlitedb

import (
	"os"
	"path/filepath"
	"testing"
)

// lapd.db (and its -wal and -shm) were created 0644 under the usual umask
// while the audit file was 0600: every file holds secrets' hashes or the
// audit trail, so every one is 0600, also one left 0644 by an older lapd.
func TestFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "lapd.db")
	for round := range 2 {
		db, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t (x INTEGER); INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if m := st.Mode().Perm(); m != 0o600 {
				t.Errorf("round %d: %s has mode %o, want 600", round, filepath.Base(p), m)
			}
		}
		db.Close()
		if round == 0 { // an older lapd left them world-readable
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				_ = os.Chmod(p, 0o644)
			}
		}
	}
}
