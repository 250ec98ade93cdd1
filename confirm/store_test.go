package confirm_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/confirm/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) confirm.Store { return confirm.NewMemoryStore() })
}

func TestSQLiteStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) confirm.Store {
		s, err := confirm.OpenSQLite(filepath.Join(t.TempDir(), "lapd.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestSQLiteStoreSharedDB(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := confirm.NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := confirm.NewSQLiteStore(db); err != nil {
		t.Fatalf("second NewSQLiteStore on the same db (table exists): %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("SQLiteStore.Close closed a database it does not own: %v", err)
	}
}

// A database made by an older lapd (no answer columns) is upgraded on open,
// keeping its pending approvals.
func TestSQLiteStoreUpgradesOldTable(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "old.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE confirm_pending (tid TEXT NOT NULL, confirm_id TEXT NOT NULL, variant TEXT NOT NULL,
		payload BLOB, intent TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '', proposed_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL, PRIMARY KEY (tid, confirm_id));
		INSERT INTO confirm_pending (tid, confirm_id, variant, proposed_at, expires_at) VALUES ('t', 'c', 'v', 1, 2)`); err != nil {
		t.Fatal(err)
	}
	s, err := confirm.NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.List(t.Context())
	if err != nil || len(ps) != 1 || ps[0].ConfirmID != "c" || ps[0].Outcome != nil {
		t.Fatalf("List = %+v, %v", ps, err)
	}
}
