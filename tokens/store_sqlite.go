package tokens

import (
	"github.com/lapd-dev/lapd/internal/sqlitedb"

	"context"
	"crypto/subtle"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver
)

// SQLiteStore is a Store in the table "tokens" of a SQLite database, so that
// tabs survive a server restart inside their grace window. It uses
// modernc.org/sqlite (pure Go, no cgo). Safe for concurrent use, also by
// several processes on one file: Update runs in a BEGIN IMMEDIATE
// transaction, so concurrent updates of one record serialize.
//
// The schema version is kept in the database's PRAGMA user_version, which
// this package owns in a shared lapd database.
type SQLiteStore struct {
	db     *sql.DB
	ownsDB bool
	// write serializes this process's writers before they reach SQLite, so
	// they queue in Go (honouring their contexts) instead of spinning on
	// SQLite's busy handler.
	write chan struct{}

	get, byHash *sql.Stmt
}

var _ Store = (*SQLiteStore)(nil)

// sqliteSchemaVersion is the tokens table layout this code reads and writes:
// 1 the reference's fields, 2 adds tab_hash, 3 adds used.
const sqliteSchemaVersion = 3

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS tokens (
	seq                  INTEGER PRIMARY KEY,
	tid                  TEXT    NOT NULL UNIQUE,
	token_hash           TEXT    NOT NULL UNIQUE,
	uid                  TEXT    NOT NULL DEFAULT '',
	status               TEXT    NOT NULL,
	created_at           INTEGER NOT NULL,
	expires_at           INTEGER NOT NULL,
	last_seen_at         INTEGER NOT NULL DEFAULT 0,
	pending_resume_until INTEGER NOT NULL DEFAULT 0,
	origin               TEXT    NOT NULL DEFAULT '',
	label                TEXT    NOT NULL DEFAULT '',
	tab_hash             TEXT    NOT NULL DEFAULT '',
	used                 INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tokens_uid ON tokens (uid, seq);
CREATE INDEX IF NOT EXISTS tokens_expires_at ON tokens (expires_at);
`

const recordColumns = `tid, token_hash, uid, status, created_at, expires_at, last_seen_at, pending_resume_until, origin, label, tab_hash, used`

// sqliteMigrations[v] moves a version-v table to version v+1.
var sqliteMigrations = map[int]string{
	1: `ALTER TABLE tokens ADD COLUMN tab_hash TEXT NOT NULL DEFAULT ''`,
	// Records from before it read as unused: such a tab that re-pairs is
	// told no model used it until the model's next call says otherwise.
	2: `ALTER TABLE tokens ADD COLUMN used INTEGER NOT NULL DEFAULT 0`,
}

// OpenSQLite opens (or creates) the SQLite file at path in WAL mode with a
// busy timeout, creates the tokens table, and returns a store whose Close
// closes the database.
func OpenSQLite(path string) (*SQLiteStore, error) {
	db, err := sqlitedb.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	s, err := NewSQLiteStoreDB(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// NewSQLiteStoreDB creates the tokens table in db (opened with the "sqlite"
// driver) if it is missing and returns a store over it. db stays the
// caller's: Close does not close it, so one database file can hold tokens,
// pending approvals and audit entries. Open db with a busy_timeout pragma
// (and preferably WAL), as OpenSQLite does.
func NewSQLiteStoreDB(db *sql.DB) (*SQLiteStore, error) {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("tokens: create schema: %w", err)
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return nil, fmt.Errorf("tokens: read schema version: %w", err)
	}
	if version > sqliteSchemaVersion {
		return nil, fmt.Errorf("tokens: database schema version %d is newer than this lapd understands (%d); upgrade lapd", version, sqliteSchemaVersion)
	}
	if version == 0 {
		if _, err := tx.ExecContext(ctx, sqliteSchema); err != nil {
			return nil, fmt.Errorf("tokens: create schema: %w", err)
		}
	} else {
		for v := version; v < sqliteSchemaVersion; v++ {
			if _, err := tx.ExecContext(ctx, sqliteMigrations[v]); err != nil {
				return nil, fmt.Errorf("tokens: migrate schema %d→%d: %w", v, v+1, err)
			}
		}
	}
	if version < sqliteSchemaVersion {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, sqliteSchemaVersion)); err != nil {
			return nil, fmt.Errorf("tokens: set schema version: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("tokens: create schema: %w", err)
	}
	s := &SQLiteStore{db: db, write: make(chan struct{}, 1)}
	if s.get, err = db.Prepare(`SELECT ` + recordColumns + ` FROM tokens WHERE tid = ?`); err != nil {
		return nil, fmt.Errorf("tokens: prepare: %w", err)
	}
	if s.byHash, err = db.Prepare(`SELECT ` + recordColumns + ` FROM tokens WHERE token_hash = ?`); err != nil {
		s.get.Close()
		return nil, fmt.Errorf("tokens: prepare: %w", err)
	}
	return s, nil
}

type rowScanner interface{ Scan(dest ...any) error }

func scanRecord(r rowScanner) (Record, error) {
	var rec Record
	var status string
	err := r.Scan(&rec.TID, &rec.TokenHash, &rec.UID, &status, &rec.CreatedAt, &rec.ExpiresAt,
		&rec.LastSeenAt, &rec.PendingResumeUntil, &rec.Origin, &rec.Label, &rec.TabHash, &rec.Used)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	rec.Status = Status(status)
	return rec, err
}

// isConstraint reports whether err is a SQLite constraint violation (here: a
// duplicate tid or token hash).
func isConstraint(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == 19 // SQLITE_CONSTRAINT and its extended codes
}

// lock takes this process's write slot, or fails with ctx.
func (s *SQLiteStore) lock(ctx context.Context) error {
	select {
	case s.write <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *SQLiteStore) unlock() { <-s.write }

// Create inserts rec; ErrExists if its tid or hash is taken.
func (s *SQLiteStore) Create(ctx context.Context, rec Record) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	_, err := s.db.ExecContext(ctx, `INSERT INTO tokens (`+recordColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		rec.TID, rec.TokenHash, rec.UID, string(rec.Status), rec.CreatedAt, rec.ExpiresAt,
		rec.LastSeenAt, rec.PendingResumeUntil, rec.Origin, rec.Label, rec.TabHash, rec.Used)
	switch {
	case isConstraint(err):
		return ErrExists
	case err != nil:
		return fmt.Errorf("tokens: create record: %w", err)
	}
	return nil
}

// Get returns the record for tid, or ErrNotFound.
func (s *SQLiteStore) Get(ctx context.Context, tid string) (Record, error) {
	rec, err := scanRecord(s.get.QueryRowContext(ctx, tid))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Record{}, fmt.Errorf("tokens: get record: %w", err)
	}
	return rec, err
}

// FindByHash returns the record whose token hash is hash, or ErrNotFound.
// The index finds the row; the stored hash is then compared in constant time.
func (s *SQLiteStore) FindByHash(ctx context.Context, hash string) (Record, error) {
	rec, err := scanRecord(s.byHash.QueryRowContext(ctx, hash))
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Record{}, err
		}
		return Record{}, fmt.Errorf("tokens: find record: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(rec.TokenHash), []byte(hash)) != 1 {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// Update reads tid's record, applies fn to a copy and writes the result, all
// inside one BEGIN IMMEDIATE transaction. If fn fails the record is left as
// it was and fn's error is returned with the unchanged record. Changing
// TokenHash to a taken hash fails with ErrExists. The TID cannot change.
func (s *SQLiteStore) Update(ctx context.Context, tid string, fn func(*Record) error) (rec Record, err error) {
	if err := s.lock(ctx); err != nil {
		return Record{}, err
	}
	defer s.unlock()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return Record{}, fmt.Errorf("tokens: update record: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return Record{}, fmt.Errorf("tokens: update record: %w", err)
	}
	done := false
	defer func() {
		if done {
			return
		}
		if _, rbErr := conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`); rbErr != nil {
			// Never hand a connection that may still be inside a
			// transaction back to a pool shared with other packages.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	cur, err := scanRecord(conn.QueryRowContext(ctx, `SELECT `+recordColumns+` FROM tokens WHERE tid = ?`, tid))
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Record{}, err
		}
		return Record{}, fmt.Errorf("tokens: update record: %w", err)
	}
	next := cur
	if err := fn(&next); err != nil {
		return cur, err
	}
	next.TID = tid
	_, err = conn.ExecContext(ctx, `UPDATE tokens SET token_hash = ?, uid = ?, status = ?, created_at = ?,
		expires_at = ?, last_seen_at = ?, pending_resume_until = ?, origin = ?, label = ?, tab_hash = ?, used = ? WHERE tid = ?`,
		next.TokenHash, next.UID, string(next.Status), next.CreatedAt, next.ExpiresAt,
		next.LastSeenAt, next.PendingResumeUntil, next.Origin, next.Label, next.TabHash, next.Used, tid)
	switch {
	case isConstraint(err):
		return cur, ErrExists
	case err != nil:
		return cur, fmt.Errorf("tokens: update record: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		return cur, fmt.Errorf("tokens: update record: commit: %w", err)
	}
	done = true
	return next, nil
}

// ListByUID returns uid's records in creation order.
func (s *SQLiteStore) ListByUID(ctx context.Context, uid string) ([]Record, error) {
	return s.list(ctx, `SELECT `+recordColumns+` FROM tokens WHERE uid = ? ORDER BY seq`, uid)
}

// ListByStatus returns the records in any of statuses, in creation order.
func (s *SQLiteStore) ListByStatus(ctx context.Context, statuses ...Status) ([]Record, error) {
	if len(statuses) == 0 {
		return nil, nil
	}
	args := make([]any, len(statuses))
	for i, st := range statuses {
		args[i] = string(st)
	}
	q := strings.TrimSuffix(strings.Repeat("?, ", len(statuses)), ", ")
	return s.list(ctx, `SELECT `+recordColumns+` FROM tokens WHERE status IN (`+q+`) ORDER BY seq`, args...)
}

func (s *SQLiteStore) list(ctx context.Context, query string, args ...any) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("tokens: list records: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("tokens: list records: %w", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tokens: list records: %w", err)
	}
	return out, nil
}

// DeleteExpired removes records whose ExpiresAt is before beforeMs.
func (s *SQLiteStore) DeleteExpired(ctx context.Context, beforeMs int64) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.unlock()
	res, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE expires_at < ?`, beforeMs)
	if err != nil {
		return 0, fmt.Errorf("tokens: delete expired records: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("tokens: delete expired records: %w", err)
	}
	return int(n), nil
}

// Close releases the prepared statements, and the database if OpenSQLite
// opened it.
func (s *SQLiteStore) Close() error {
	err := errors.Join(s.get.Close(), s.byHash.Close())
	if s.ownsDB {
		err = errors.Join(err, s.db.Close())
	}
	return err
}
