package audit

import (
	"github.com/lapd-dev/lapd/internal/sqlitedb"

	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver
)

// SQLiteSink stores entries in the table audit_entries of a SQLite database
// (usually lapd.db, shared with the token store) and can query them back.
// Safe for concurrent use.
type SQLiteSink struct {
	db     *sql.DB
	ownsDB bool
	insert *sql.Stmt
}

var (
	_ Sink    = (*SQLiteSink)(nil)
	_ Querier = (*SQLiteSink)(nil)
)

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS audit_entries (
	id     INTEGER PRIMARY KEY,
	at     INTEGER NOT NULL,
	tid    TEXT,
	uid    TEXT,
	event  TEXT    NOT NULL,
	detail TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS audit_entries_tid ON audit_entries (tid);
CREATE INDEX IF NOT EXISTS audit_entries_event ON audit_entries (event);
CREATE INDEX IF NOT EXISTS audit_entries_at ON audit_entries (at);
`

// NewSQLiteSink creates the audit_entries table in db (opened with the
// "sqlite" driver, preferably with a busy_timeout) if it is missing. db stays
// the caller's: Close does not close it.
func NewSQLiteSink(db *sql.DB) (*SQLiteSink, error) {
	if _, err := db.Exec(sqliteSchema); err != nil {
		return nil, fmt.Errorf("audit: create audit_entries table: %w", err)
	}
	ins, err := db.Prepare(`INSERT INTO audit_entries (at, tid, uid, event, detail) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		return nil, fmt.Errorf("audit: prepare insert: %w", err)
	}
	return &SQLiteSink{db: db, insert: ins}, nil
}

// OpenSQLiteSink opens (or creates) the SQLite file at path in WAL mode with a
// busy timeout and returns a sink whose Close closes the database.
func OpenSQLiteSink(path string) (*SQLiteSink, error) {
	db, err := sqlitedb.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	s, err := NewSQLiteSink(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Write inserts e.
func (s *SQLiteSink) Write(ctx context.Context, e Entry) error {
	detail := []byte("{}")
	if len(e.Detail) > 0 {
		b, err := json.Marshal(e.Detail)
		if err != nil {
			return fmt.Errorf("audit: encode %s detail: %w", e.Event, err)
		}
		detail = b
	}
	if _, err := s.insert.ExecContext(ctx, e.At, nullable(e.TID), nullable(e.UID), e.Event, string(detail)); err != nil {
		return fmt.Errorf("audit: insert %s entry: %w", e.Event, err)
	}
	return nil
}

// Query returns the entries that match f, oldest first (by at, then
// insertion order); with f.Limit, the newest f.Limit of them (after
// skipping the newest f.Offset).
func (s *SQLiteSink) Query(ctx context.Context, f Filter) ([]Entry, error) {
	var where []string
	var args []any
	if f.TID != "" {
		where, args = append(where, "tid = ?"), append(args, f.TID)
	}
	if f.Event != "" {
		where, args = append(where, "event = ?"), append(args, f.Event)
	}
	if len(f.Events) > 0 {
		where = append(where, "event IN (?"+strings.Repeat(", ?", len(f.Events)-1)+")")
		for _, ev := range f.Events {
			args = append(args, ev)
		}
	}
	if f.Since != 0 {
		where, args = append(where, "at >= ?"), append(args, f.Since)
	}
	if f.Until != 0 {
		where, args = append(where, "at < ?"), append(args, f.Until)
	}
	q := `SELECT at, tid, uid, event, detail FROM audit_entries`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Limit > 0 {
		q += " ORDER BY at DESC, id DESC LIMIT ? OFFSET ?"
		args = append(args, f.Limit, max(f.Offset, 0))
	} else {
		q += " ORDER BY at, id"
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var tid, uid sql.NullString
		var detail string
		if err := rows.Scan(&e.At, &tid, &uid, &e.Event, &detail); err != nil {
			return nil, fmt.Errorf("audit: query: %w", err)
		}
		e.TID, e.UID = tid.String, uid.String
		if err := json.Unmarshal([]byte(detail), &e.Detail); err != nil {
			e.Detail = map[string]any{"unreadable": detail}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: query: %w", err)
	}
	if f.Limit > 0 {
		slices.Reverse(out)
	}
	return out, nil
}

// Close releases the sink's statement, and the database if OpenSQLiteSink
// opened it.
func (s *SQLiteSink) Close() error {
	err := s.insert.Close()
	if s.ownsDB {
		err = errors.Join(err, s.db.Close())
	}
	return err
}
