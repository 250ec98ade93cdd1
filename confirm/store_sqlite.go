package confirm

import (
	"github.com/lapd-dev/lapd/internal/sqlitedb"

	"context"
	"database/sql"
	"fmt"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// SQLiteStore is a Store in a SQLite table, confirm_pending, so pending
// approvals survive a server restart. It uses modernc.org/sqlite (pure Go, no
// cgo). Safe for concurrent use.
type SQLiteStore struct {
	db     *sql.DB
	ownsDB bool
}

var _ Store = (*SQLiteStore)(nil)

const sqliteSchema = `CREATE TABLE IF NOT EXISTS confirm_pending (
	tid         TEXT    NOT NULL,
	confirm_id  TEXT    NOT NULL,
	variant     TEXT    NOT NULL,
	payload     BLOB,
	intent      TEXT    NOT NULL DEFAULT '',
	reason      TEXT    NOT NULL DEFAULT '',
	proposed_at INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	PRIMARY KEY (tid, confirm_id)
)`

// NewSQLiteStore creates the confirm_pending table in db if it does not
// exist. db stays the caller's: Close does not close it, so one database can
// hold tokens, approvals and audit. Open db with the "sqlite" driver.
func NewSQLiteStore(db *sql.DB) (*SQLiteStore, error) {
	if _, err := db.Exec(sqliteSchema); err != nil {
		return nil, fmt.Errorf("confirm: create confirm_pending table: %w", err)
	}
	return &SQLiteStore{db: db}, nil
}

// OpenSQLite opens (or creates) the SQLite file at path in WAL mode with a
// busy timeout, and returns a store that closes the database on Close.
func OpenSQLite(path string) (*SQLiteStore, error) {
	db, err := sqlitedb.Open(path)
	if err != nil {
		return nil, fmt.Errorf("confirm: %w", err)
	}
	s, err := NewSQLiteStore(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// Put inserts or replaces p.
func (s *SQLiteStore) Put(ctx context.Context, p Pending) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO confirm_pending
		(tid, confirm_id, variant, payload, intent, reason, proposed_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tid, confirm_id) DO UPDATE SET
		variant = excluded.variant, payload = excluded.payload, intent = excluded.intent,
		reason = excluded.reason, proposed_at = excluded.proposed_at, expires_at = excluded.expires_at`,
		p.TID, p.ConfirmID, p.Variant, []byte(p.Payload), p.Intent, p.Reason, p.ProposedAt, p.ExpiresAt)
	if err != nil {
		return fmt.Errorf("confirm: put approval: %w", err)
	}
	return nil
}

// Delete removes tid/confirmID; deleting a missing one is not an error.
func (s *SQLiteStore) Delete(ctx context.Context, tid, confirmID string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM confirm_pending WHERE tid = ? AND confirm_id = ?`, tid, confirmID)
	if err != nil {
		return fmt.Errorf("confirm: delete approval: %w", err)
	}
	return nil
}

// List returns every pending approval, oldest proposal first.
func (s *SQLiteStore) List(ctx context.Context) ([]Pending, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tid, confirm_id, variant, payload, intent, reason, proposed_at, expires_at
		FROM confirm_pending ORDER BY proposed_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("confirm: list approvals: %w", err)
	}
	defer rows.Close()
	var out []Pending
	for rows.Next() {
		var p Pending
		var payload []byte
		if err := rows.Scan(&p.TID, &p.ConfirmID, &p.Variant, &payload, &p.Intent, &p.Reason, &p.ProposedAt, &p.ExpiresAt); err != nil {
			return nil, fmt.Errorf("confirm: list approvals: %w", err)
		}
		if len(payload) > 0 {
			p.Payload = payload
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("confirm: list approvals: %w", err)
	}
	return out, nil
}

// Close closes the database if OpenSQLite opened it.
func (s *SQLiteStore) Close() error {
	if s.ownsDB {
		return s.db.Close()
	}
	return nil
}
