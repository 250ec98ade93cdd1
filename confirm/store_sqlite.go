package confirm

import (
	"github.com/lapd-dev/lapd/internal/sqlitedb"

	"context"
	"database/sql"
	"fmt"
	"strings"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// SQLiteStore is a Store in a SQLite table, confirm_pending, so approvals
// (pending, and answered ones for the keep window) survive a server restart. It uses modernc.org/sqlite (pure Go, no
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

// The answer of an approval (added after the first release: databases made
// before get the columns on open). status is ” while pending.
var sqliteOutcomeColumns = []struct{ name, decl string }{
	{"status", "TEXT NOT NULL DEFAULT ''"},
	{"outcome_reason", "TEXT NOT NULL DEFAULT ''"},
	{"state_after", "BLOB"},
	{"outcome_variant", "TEXT NOT NULL DEFAULT ''"},
	{"resolved_at", "INTEGER NOT NULL DEFAULT 0"},
}

// NewSQLiteStore creates the confirm_pending table in db if it does not
// exist (and adds the answer columns to one made by an older lapd). db stays
// the caller's: Close does not close it, so one database can hold tokens,
// approvals and audit. Open db with the "sqlite" driver.
func NewSQLiteStore(db *sql.DB) (*SQLiteStore, error) {
	if _, err := db.Exec(sqliteSchema); err != nil {
		return nil, fmt.Errorf("confirm: create confirm_pending table: %w", err)
	}
	have := map[string]bool{}
	rows, err := db.Query(`SELECT name FROM pragma_table_info('confirm_pending')`)
	if err != nil {
		return nil, fmt.Errorf("confirm: read confirm_pending columns: %w", err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, fmt.Errorf("confirm: read confirm_pending columns: %w", err)
		}
		have[name] = true
	}
	rows.Close()
	for _, c := range sqliteOutcomeColumns {
		if have[c.name] {
			continue
		}
		if _, err := db.Exec(`ALTER TABLE confirm_pending ADD COLUMN ` + c.name + ` ` + c.decl); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			return nil, fmt.Errorf("confirm: add column %s: %w", c.name, err)
		}
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
	var o Resolution
	if p.Outcome != nil {
		o = *p.Outcome
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO confirm_pending
		(tid, confirm_id, variant, payload, intent, reason, proposed_at, expires_at,
		 status, outcome_reason, state_after, outcome_variant, resolved_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tid, confirm_id) DO UPDATE SET
		variant = excluded.variant, payload = excluded.payload, intent = excluded.intent,
		reason = excluded.reason, proposed_at = excluded.proposed_at, expires_at = excluded.expires_at,
		status = excluded.status, outcome_reason = excluded.outcome_reason, state_after = excluded.state_after,
		outcome_variant = excluded.outcome_variant, resolved_at = excluded.resolved_at`,
		p.TID, p.ConfirmID, p.Variant, []byte(p.Payload), p.Intent, p.Reason, p.ProposedAt, p.ExpiresAt,
		o.Status, o.Reason, []byte(o.StateAfter), o.Variant, o.ResolvedAt)
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
	rows, err := s.db.QueryContext(ctx, `SELECT tid, confirm_id, variant, payload, intent, reason, proposed_at, expires_at,
		status, outcome_reason, state_after, outcome_variant, resolved_at
		FROM confirm_pending ORDER BY proposed_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("confirm: list approvals: %w", err)
	}
	defer rows.Close()
	var out []Pending
	for rows.Next() {
		var p Pending
		var payload, stateAfter []byte
		var o Resolution
		if err := rows.Scan(&p.TID, &p.ConfirmID, &p.Variant, &payload, &p.Intent, &p.Reason, &p.ProposedAt, &p.ExpiresAt,
			&o.Status, &o.Reason, &stateAfter, &o.Variant, &o.ResolvedAt); err != nil {
			return nil, fmt.Errorf("confirm: list approvals: %w", err)
		}
		if len(payload) > 0 {
			p.Payload = payload
		}
		if o.Status != "" {
			if len(stateAfter) > 0 {
				o.StateAfter = stateAfter
			}
			p.Outcome = &o
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
