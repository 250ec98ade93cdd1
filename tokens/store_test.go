package tokens_test

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/tokens"
	"github.com/lapd-dev/lapd/tokens/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) tokens.Store { return tokens.NewMemoryStore() })
}

func openSQLite(t testing.TB) *tokens.SQLiteStore {
	t.Helper()
	s, err := tokens.OpenSQLite(filepath.Join(t.TempDir(), "lapd.db"))
	if err != nil {
		t.Fatalf("OpenSQLite: %v", err)
	}
	return s
}

func TestSQLiteStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) tokens.Store { return openSQLite(t) })
}

// TestSQLiteStoreSharedDB runs the suite over a *sql.DB the test owns, as the
// composition root does when tokens, confirm and audit share lapd.db.
func TestSQLiteStoreSharedDB(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) tokens.Store {
		q := url.Values{}
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "busy_timeout(5000)")
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "shared.db")+"?"+q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := tokens.NewSQLiteStoreDB(db)
		if err != nil {
			t.Fatalf("NewSQLiteStoreDB: %v", err)
		}
		return s
	})
}

func TestSQLiteStoreSurvivesReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lapd.db")
	s, err := tokens.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, hash := tokens.Generate()
	want := tokens.Record{TID: "t1", TokenHash: hash, UID: "alice", Status: tokens.StatusPendingResume,
		CreatedAt: 1, ExpiresAt: 2, LastSeenAt: 3, PendingResumeUntil: 4, Origin: "https://a", Label: "L"}
	if err := s.Create(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s, err = tokens.OpenSQLite(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	h, _ := tokens.Hash(tok)
	got, err := s.FindByHash(t.Context(), h)
	if err != nil || got != want {
		t.Errorf("after reopen FindByHash = %+v, %v; want %+v", got, err, want)
	}
}

func TestSQLiteStoreRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lapd.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.NewSQLiteStoreDB(db); err == nil {
		t.Fatal("NewSQLiteStoreDB accepted a database from a newer lapd")
	}
}

// TestSQLiteStoresShareFile checks that two processes' worth of stores on one
// file (each with its own pool) do not lose concurrent updates.
func TestSQLiteStoresShareFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lapd.db")
	a, err := tokens.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tokens.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, hash := tokens.Generate()
	if err := a.Create(t.Context(), tokens.Record{TID: "t1", TokenHash: hash, Status: tokens.StatusActive}); err != nil {
		t.Fatal(err)
	}
	const n = 50
	done := make(chan error, 2*n)
	for _, s := range []*tokens.SQLiteStore{a, b} {
		go func() {
			for range n {
				_, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.LastSeenAt++; return nil })
				done <- err
			}
		}()
	}
	for range 2 * n {
		if err := <-done; err != nil {
			t.Errorf("Update: %v", err)
		}
	}
	if r, err := a.Get(t.Context(), "t1"); err != nil || r.LastSeenAt != 2*n {
		t.Errorf("LastSeenAt = %d, %v; want %d", r.LastSeenAt, err, 2*n)
	}
}

// TestCachedStore runs the contract suite through the cache, over the
// memory store and over SQLite.
func TestCachedStore(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) tokens.Store {
			return tokens.NewCachedStore(tokens.NewMemoryStore(), tokens.CacheConfig{})
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) tokens.Store {
			return tokens.NewCachedStore(openSQLite(t), tokens.CacheConfig{})
		})
	})
}

// A lapd.db written by a lapd before tab secrets (schema 1) opens, keeps
// its records and gains the tab_hash and used columns.
func TestSQLiteStoreMigratesFromV1(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lapd.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, hash := tokens.Generate()
	if _, err := db.Exec(`CREATE TABLE tokens (
	seq INTEGER PRIMARY KEY, tid TEXT NOT NULL UNIQUE, token_hash TEXT NOT NULL UNIQUE, uid TEXT NOT NULL DEFAULT '',
	status TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL DEFAULT 0,
	pending_resume_until INTEGER NOT NULL DEFAULT 0, origin TEXT NOT NULL DEFAULT '', label TEXT NOT NULL DEFAULT '');
	INSERT INTO tokens (tid, token_hash, uid, status, created_at, expires_at) VALUES ('t1', ?, 'alice', 'active', 1, 2);
	PRAGMA user_version = 1;`, hash); err != nil {
		t.Fatal(err)
	}
	s, err := tokens.NewSQLiteStoreDB(db)
	if err != nil {
		t.Fatalf("migrating a v1 database: %v", err)
	}
	defer s.Close()
	rec, err := s.Get(t.Context(), "t1")
	if err != nil || rec.UID != "alice" || rec.TabHash != "" {
		t.Fatalf("v1 record after migration: %+v, %v", rec, err)
	}
	_, tabHash := tokens.GenerateTabSecret()
	if _, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.TabHash = tabHash; return nil }); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Get(t.Context(), "t1"); rec.TabHash != tabHash {
		t.Errorf("tab hash not stored: %+v", rec)
	}
	if rec.Used {
		t.Errorf("a record from before the used column reads as used: %+v", rec)
	}
	if _, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.Used = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Get(t.Context(), "t1"); !rec.Used {
		t.Errorf("used not stored: %+v", rec)
	}
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != 3 {
		t.Errorf("schema version after migration: %d, %v; want 3", v, err)
	}
}

func TestNATSStore(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	nc := ns.Connect(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) tokens.Store {
		s, err := tokens.OpenNATS(t.Context(), nc, fmt.Sprintf("tokens_%d", n.Add(1)))
		if err != nil {
			t.Fatalf("OpenNATS: %v", err)
		}
		return s
	})
}

// TestNATSStoreTwoNodes: two stores on one bucket (two lapd nodes) see each
// other's records at once and lose no write when they race.
func TestNATSStoreTwoNodes(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	open := func() *tokens.NATSStore {
		s, err := tokens.OpenNATS(t.Context(), ns.Connect(t), "shared")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	_, hash := tokens.Generate()
	if err := a.Create(t.Context(), tokens.Record{TID: "t1", TokenHash: hash, Status: tokens.StatusActive}); err != nil {
		t.Fatal(err)
	}
	// Right away, before any watch delivery: b reads through to the bucket.
	if r, err := b.FindByHash(t.Context(), hash); err != nil || r.TID != "t1" {
		t.Fatalf("b.FindByHash right after a.Create = %+v, %v", r, err)
	}
	if err := b.Create(t.Context(), tokens.Record{TID: "t2", TokenHash: hash}); !errors.Is(err, tokens.ErrExists) {
		t.Fatalf("b.Create with a's hash = %v, want ErrExists", err)
	}
	const n = 50
	done := make(chan error, 2*n)
	for _, s := range []*tokens.NATSStore{a, b} {
		go func() {
			for range n {
				_, err := s.Update(t.Context(), "t1", func(r *tokens.Record) error { r.LastSeenAt++; return nil })
				done <- err
			}
		}()
	}
	for range 2 * n {
		if err := <-done; err != nil {
			t.Errorf("Update: %v", err)
		}
	}
	if r, err := b.Get(t.Context(), "t1"); err != nil || r.LastSeenAt < n {
		t.Errorf("b sees LastSeenAt = %d, %v", r.LastSeenAt, err)
	}
	r, err := a.Update(t.Context(), "t1", func(r *tokens.Record) error { return nil })
	if err != nil || r.LastSeenAt != 2*n {
		t.Errorf("LastSeenAt = %d, %v; want %d (a write was lost)", r.LastSeenAt, err, 2*n)
	}
}
