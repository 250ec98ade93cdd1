package sqlitedb

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// A damaged lapd.db stopped lapd with SQLite's words only; Advice says what
// to do, for a file that is not a database and for one damaged inside.
func TestAdviceForDamagedFile(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, bytes.Repeat([]byte("not a database "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(junk)
	if err == nil {
		t.Fatal("opened a file of junk")
	}
	if a := Advice(junk, err); !strings.Contains(a, "move it aside") {
		t.Errorf("Advice(%v) = %q, want how to start again", err, a)
	}

	damaged := filepath.Join(dir, "lapd.db")
	db, err := Open(damaged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE t (x TEXT); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 2000)
		INSERT INTO t SELECT hex(randomblob(100)) FROM n; PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	f, err := os.OpenFile(damaged, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	for off := int64(4096); off < st.Size(); off += 4096 { // every page but the header's
		f.WriteAt(bytes.Repeat([]byte{0xA5}, 256), off)
	}
	f.Close()
	db, err = Open(damaged)
	if err == nil {
		var n int
		err = db.QueryRow(`SELECT count(*) FROM t WHERE x != ''`).Scan(&n)
		db.Close()
	}
	if err == nil {
		t.Fatal("read a damaged database without an error")
	}
	if a := Advice(damaged, err); !strings.Contains(a, "move it aside") {
		t.Errorf("Advice(%v) = %q, want how to start again", err, a)
	}
	if a := Advice(damaged, errors.New("something else")); a != "" {
		t.Errorf("Advice for an unknown error = %q, want none", a)
	}
	if a := Advice(damaged, fmt.Errorf("tokens: read schema version: %w", codeErr(4874))); !strings.Contains(a, "is it full") {
		t.Errorf("Advice for SQLITE_IOERR_SHMSIZE (a full disk at start) = %q", a)
	}
	other := &fs.PathError{Op: "open", Path: filepath.Join(dir, "audit.jsonl"), Err: fs.ErrPermission}
	if a := Advice(damaged, other); a != "" {
		t.Errorf("Advice for another file's error = %q, want none", a)
	}
	mine := &fs.PathError{Op: "open", Path: damaged, Err: fs.ErrPermission}
	if a := Advice(damaged, mine); !strings.Contains(a, "read and write") {
		t.Errorf("Advice for %v = %q, want the permissions it needs", mine, a)
	}
}

// codeErr is an error with a SQLite result code, as the driver's.
type codeErr int

func (c codeErr) Error() string { return fmt.Sprintf("disk I/O error (%d)", int(c)) }
func (c codeErr) Code() int     { return int(c) }
