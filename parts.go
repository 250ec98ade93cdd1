package lapd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/internal/sqlitedb"
	"github.com/lapd-dev/lapd/tokens"
)

// This file is the one place where Config chooses implementations.

// openStores returns the token and approval stores: the caller's own
// (cfg.TokenStore, cfg.ConfirmStore), else those named by cfg.Store and
// cfg.DataDir, opening lapd.db for the sqlite store. A token store opened
// here is closed by Shutdown (tokens.Manager does not own it).
func (s *Server) openStores(cfg Config) (tokens.Store, confirm.Store, error) {
	if cfg.TokenStore != nil && cfg.ConfirmStore != nil {
		return cfg.TokenStore, keepOpen{cfg.ConfirmStore}, nil
	}
	store := cfg.Store
	if store == "" {
		store = "sqlite"
		if cfg.DataDir == "" {
			store = "memory"
		}
	}
	var tstore tokens.Store
	var cstore confirm.Store
	switch store {
	case "sqlite":
		if cfg.DataDir == "" {
			return nil, nil, errors.New("lapd: the sqlite store needs a DataDir (or set TokenStore and ConfirmStore)")
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("lapd: data dir: %w", err)
		}
		db, err := sqlitedb.Open(filepath.Join(cfg.DataDir, "lapd.db"))
		if err != nil {
			return nil, nil, fmt.Errorf("lapd: %w", err)
		}
		s.db = db
		if cfg.TokenStore == nil {
			ts, err := tokens.NewSQLiteStoreDB(db)
			if err != nil {
				return nil, nil, fmt.Errorf("lapd: token store: %w", err)
			}
			// Records in memory in front of SQLite: a LAP call reads and
			// writes no token row (tokens.CachedStore says what that costs).
			cs := tokens.NewCachedStore(ts, tokens.CacheConfig{Clock: cfg.Clock})
			tstore = cs
			s.closers = append(s.closers, cs)
		}
		if cfg.ConfirmStore == nil {
			cs, err := confirm.NewSQLiteStore(db)
			if err != nil {
				return nil, nil, fmt.Errorf("lapd: confirm store: %w", err)
			}
			cstore = cs
		}
	case "memory":
		tstore = tokens.NewMemoryStore()
		s.closers = append(s.closers, tstore)
		cstore = confirm.NewMemoryStore()
	default:
		return nil, nil, fmt.Errorf("lapd: unknown Store %q (want sqlite or memory)", store)
	}
	if cfg.TokenStore != nil {
		tstore = cfg.TokenStore
	}
	if cfg.ConfirmStore != nil {
		cstore = keepOpen{cfg.ConfirmStore}
	}
	return tstore, cstore, nil
}

// keepOpen shields the caller's confirm store from confirm.Manager.Close,
// which closes its store.
type keepOpen struct{ confirm.Store }

func (keepOpen) Close() error { return nil }

// openAuditSinks returns cfg.AuditSinks plus the sinks cfg names (stdout,
// a JSONL file, the audit_entries table in lapd.db).
func (s *Server) openAuditSinks(cfg Config) ([]audit.Sink, error) {
	sinks := append([]audit.Sink(nil), cfg.AuditSinks...)
	for _, k := range sinks {
		if q, ok := k.(*audit.SQLiteSink); ok && s.auditQuerier == nil {
			s.auditQuerier = q // the admin console reads the audit here
		}
	}
	if cfg.AuditStdout {
		sinks = append(sinks, audit.NewJSONLSink(os.Stdout))
	}
	if cfg.AuditFile != "" {
		fs, err := audit.OpenJSONLFile(cfg.AuditFile)
		if err != nil {
			return nil, fmt.Errorf("lapd: audit file: %w", err)
		}
		fs.SetRetention(cfg.AuditRetention)
		sinks = append(sinks, fs)
		if s.auditQuerier == nil {
			s.auditQuerier = fs
		}
	}
	if cfg.AuditSQLite {
		if s.db == nil {
			closeSinks(sinks[len(cfg.AuditSinks):])
			return nil, errors.New("lapd: AuditSQLite needs the sqlite store")
		}
		ss, err := audit.NewSQLiteSink(s.db)
		if err != nil {
			closeSinks(sinks[len(cfg.AuditSinks):])
			return nil, fmt.Errorf("lapd: audit sqlite sink: %w", err)
		}
		ss.SetRetention(cfg.AuditRetention)
		sinks = append(sinks, ss)
		s.auditQuerier = ss
	}
	return sinks, nil
}

func closeSinks(sinks []audit.Sink) {
	for _, k := range sinks {
		k.Close()
	}
}

// OpenAudit opens for reading the audit entries a lapd with this DataDir
// keeps in DataDir/lapd.db (Config.AuditSQLite; `lapd serve`'s default), as
// `lapd audit` reads them. Close the Closer when done.
func OpenAudit(dataDir string) (audit.Querier, io.Closer, error) {
	path := filepath.Join(dataDir, "lapd.db")
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("lapd: no audit database at %s: %w", path, err)
	}
	db, err := sqlitedb.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("lapd: %w", err)
	}
	q, err := audit.NewSQLiteSink(db)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("lapd: %w", err)
	}
	return q, db, nil
}
