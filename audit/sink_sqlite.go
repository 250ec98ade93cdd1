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
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver
)

// SQLiteSink stores entries in the table audit_entries of a SQLite database
// (usually lapd.db, shared with the token store) and can query them back.
// A batch from the Log's writer is one transaction (group commit), 32 rows
// per INSERT. The table is indexed by time only, which keeps an insert cheap
// (about 5 µs a row here); a query by tid or event walks the time index,
// newest first. With a
// Retention, entries older than MaxAge and the oldest entries beyond
// MaxBytes are deleted as batches are written (checked once a minute, and
// whenever an eighth of MaxBytes was written since the last check); the
// size is an estimate (text plus a fixed overhead per row), and SQLite
// reuses the freed pages rather than shrinking the file. Safe for
// concurrent use.
type SQLiteSink struct {
	db      *sql.DB
	ownsDB  bool
	insert  *sql.Stmt // one row
	insertN *sql.Stmt // insertRows rows

	mu        sync.Mutex // serializes WriteBatch and pruning
	migrated  bool       // dropOldIndexes ran
	ret       Retention
	lastPrune time.Time
	size      int64 // estimated bytes of audit_entries; -1 = not measured yet
	rows      int64
	added     int64 // estimated bytes written since the last prune
	clock     func() time.Time
}

// Retention bounds what a sink keeps. Zero fields mean no bound.
type Retention struct {
	MaxAge   time.Duration // delete entries older than this
	MaxBytes int64         // keep the stored entries under about this many bytes
}

// rowOverhead is the estimated bytes per audit row besides its text:
// the row header, the integer columns and three index entries.
const rowOverhead = 96

// pruneEvery bounds how often WriteBatch checks the retention.
const pruneEvery = time.Minute

var (
	_ BatchSink = (*SQLiteSink)(nil)
	_ Querier   = (*SQLiteSink)(nil)
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
CREATE INDEX IF NOT EXISTS audit_entries_at ON audit_entries (at);
`

// dropOldIndexes removes the indexes lapd created before: an index on tid
// (or event) has a few keys that every entry of a busy session lands on, in
// the middle of the B-tree, and made each insert 2–5× dearer (see
// BenchmarkSQLiteBatch). Queries by tid or event walk the time index,
// newest first. The writer runs it once, before its first batch.
const dropOldIndexes = `
DROP INDEX IF EXISTS audit_entries_tid;
DROP INDEX IF EXISTS audit_entries_event;
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
	insN, err := db.Prepare(`INSERT INTO audit_entries (at, tid, uid, event, detail) VALUES ` +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?), ", insertRows), ", "))
	if err != nil {
		ins.Close()
		return nil, fmt.Errorf("audit: prepare insert: %w", err)
	}
	return &SQLiteSink{db: db, insert: ins, insertN: insN, size: -1, clock: time.Now}, nil
}

// insertRows is how many rows one multi-row INSERT of a batch carries: the
// per-statement overhead is paid once per insertRows entries.
const insertRows = 32

// SetRetention makes the sink delete entries beyond r as it writes. Call it
// before the sink is used.
func (s *SQLiteSink) SetRetention(r Retention) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ret = r
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

// WriteBatch inserts every entry of b in one transaction.
func (s *SQLiteSink) WriteBatch(ctx context.Context, b *Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.migrated {
		if _, err := s.db.ExecContext(ctx, dropOldIndexes); err != nil {
			return fmt.Errorf("audit: drop old indexes: %w", err)
		}
		s.migrated = true
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("audit: begin batch: %w", err)
	}
	ins, insN := tx.StmtContext(ctx, s.insert), tx.StmtContext(ctx, s.insertN)
	var added int64
	args := make([]any, 0, 5*insertRows)
	for i := 0; i < len(b.Entries); {
		st, n := insN, insertRows
		if len(b.Entries)-i < insertRows {
			st, n = ins, 1
		}
		args = args[:0]
		for _, e := range b.Entries[i : i+n] {
			d := b.Detail(i)
			args = append(args, e.At, nullable(e.TID), nullable(e.UID), e.Event, string(d))
			added += rowSize(len(d), e)
			i++
		}
		if _, err := st.ExecContext(ctx, args...); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("audit: insert %d entries: %w", n, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("audit: commit batch of %d: %w", len(b.Entries), err)
	}
	if s.size >= 0 {
		s.size += added
		s.rows += int64(len(b.Entries))
	}
	s.added += added
	due := s.clock().Sub(s.lastPrune) >= pruneEvery || s.ret.MaxBytes > 0 && s.added >= s.ret.MaxBytes/8
	if (s.ret.MaxAge > 0 || s.ret.MaxBytes > 0) && due {
		s.lastPrune, s.added = s.clock(), 0
		if err := s.pruneLocked(ctx); err != nil {
			return fmt.Errorf("audit: batch stored, but applying the retention failed: %w", err)
		}
	}
	return nil
}

func rowSize(detail int, e Entry) int64 {
	return int64(detail+len(e.Event)+len(e.TID)+len(e.UID)) + rowOverhead
}

// pruneDeleteChunk bounds the rows one DELETE removes, so that pruning a
// large backlog never holds the write lock for long.
const pruneDeleteChunk = 5000

// pruneLocked applies the retention. Caller holds s.mu.
func (s *SQLiteSink) pruneLocked(ctx context.Context) error {
	if s.ret.MaxAge > 0 {
		cut := s.clock().Add(-s.ret.MaxAge).UnixMilli()
		for {
			res, err := s.db.ExecContext(ctx, `DELETE FROM audit_entries WHERE id IN (SELECT id FROM audit_entries WHERE at < ? ORDER BY id LIMIT ?)`, cut, pruneDeleteChunk)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n > 0 {
				s.size = -1 // re-measure below
			}
			if n, _ := res.RowsAffected(); n < pruneDeleteChunk {
				break
			}
		}
	}
	if s.ret.MaxBytes <= 0 {
		return nil
	}
	if s.size < 0 {
		if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(LENGTH(detail)+LENGTH(event)+COALESCE(LENGTH(tid),0)+COALESCE(LENGTH(uid),0)),0)+COUNT(*)*?, COUNT(*) FROM audit_entries`, rowOverhead).Scan(&s.size, &s.rows); err != nil {
			return err
		}
	}
	if s.size <= s.ret.MaxBytes || s.rows == 0 {
		return nil
	}
	// Delete the oldest rows until about 90% of the bound is left,
	// assuming rows of the average size.
	avg := s.size / s.rows
	excess := (s.size - s.ret.MaxBytes*9/10 + avg - 1) / avg
	for excess > 0 {
		n := min(excess, pruneDeleteChunk)
		res, err := s.db.ExecContext(ctx, `DELETE FROM audit_entries WHERE id IN (SELECT id FROM audit_entries ORDER BY id LIMIT ?)`, n)
		if err != nil {
			return err
		}
		got, _ := res.RowsAffected()
		s.rows -= got
		s.size -= got * avg
		excess -= n
		if got < n {
			break
		}
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
	err := errors.Join(s.insert.Close(), s.insertN.Close())
	if s.ownsDB {
		err = errors.Join(err, s.db.Close())
	}
	return err
}
