// Package sqlitedb opens lapd's SQLite database file the one way every store
// expects: the pure-Go modernc.org/sqlite driver (no cgo, so `go run` works on
// a fresh machine), WAL journal (readers never block the writer), a busy
// timeout (concurrent writers wait instead of failing) and synchronous=NORMAL
// (durable across process crashes; the last transactions may be lost only on
// power loss, which a grace-window token store can afford), and a WAL file
// truncated back to JournalSizeLimit after each checkpoint.
//
// The database holds token hashes, pending approvals and the audit trail, so
// it is private to its owner: Open creates the file with mode 0600 before
// SQLite touches it (SQLite gives its -wal and -shm files the database
// file's mode) and narrows an existing file and its -wal/-shm to 0600.
//
// The pool keeps MaxConns connections open and idle: opening a SQLite
// connection (file open, pragmas, a fresh page cache) costs far more than a
// query, and database/sql keeps only 2 idle connections by default, so
// under concurrency every burst opened and closed connections. SQLite has
// one writer at a time anyway; a few connections serve the readers.
package sqlitedb

import (
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// Pool and journal settings.
const (
	MaxConns         = 4
	JournalSizeLimit = 64 << 20
	// CacheKiB is each connection's page cache (SQLite's default is 2 MiB):
	// token reads are served from memory (tokens.CachedStore) and audit
	// writes append, so a small cache costs no speed and keeps the
	// process's memory flat as tabs pair.
	CacheKiB = 256
)

// Open opens (or creates) the database at path and checks that it answers.
func Open(path string) (*sql.DB, error) {
	if err := private(path); err != nil {
		return nil, err // an *fs.PathError, which names path already
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", JournalSizeLimit))
	q.Add("_pragma", fmt.Sprintf("cache_size(-%d)", CacheKiB))
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(MaxConns)
	db.SetMaxIdleConns(MaxConns)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// private creates path with mode 0600 if it is missing and sets 0600 on it
// and on its -wal and -shm files if they exist.
func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
