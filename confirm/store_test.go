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
