package lapd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

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
func (s *Server) openStores(ctx context.Context, cfg Config) (tokens.Store, confirm.Store, error) {
	if cfg.TokenStore != nil && cfg.ConfirmStore != nil {
		return cfg.TokenStore, keepOpen{cfg.ConfirmStore}, nil
	}
	store := cfg.Store
	if store == "" {
		store = "sqlite"
		if cfg.DataDir == "" {
			store = "memory"
		}
		if s.nc != nil {
			store = "nats"
		}
	}
	var tstore tokens.Store
	var cstore confirm.Store
	switch store {
	case "nats":
		if s.nc == nil {
			return nil, nil, errors.New("lapd: the nats store needs NATSURL or NATSConn")
		}
		if cfg.TokenStore == nil {
			ts, err := tokens.OpenNATSConfig(ctx, s.nc, tokens.NATSConfig{Bucket: s.cluster + "_tokens", Replicas: cfg.NATSReplicas,
				OnRevoked: s.dropRevoked})
			if err != nil {
				return nil, nil, natsRefused(s.nc, fmt.Errorf("lapd: token store on NATS: %w", err))
			}
			tstore = ts
			s.closers = append(s.closers, ts)
		}
		if cfg.ConfirmStore == nil {
			cs, err := confirm.OpenNATSConfig(ctx, s.nc, confirm.NATSConfig{Bucket: s.cluster + "_confirm", Replicas: cfg.NATSReplicas})
			if err != nil {
				return nil, nil, natsRefused(s.nc, fmt.Errorf("lapd: approval store on NATS: %w", err))
			}
			cstore = cs
		}
		if cfg.AuditSQLite && cfg.DataDir != "" {
			// This node's own audit copy (lapd audit reads it).
			if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
				return nil, nil, fmt.Errorf("lapd: data dir: %w", err)
			}
			s.checkDataDir(cfg.DataDir)
			db, err := sqlitedb.Open(filepath.Join(cfg.DataDir, "lapd.db"))
			if err != nil {
				return nil, nil, fmt.Errorf("lapd: %w", err)
			}
			s.db = db
			s.dbFile.remember(filepath.Join(cfg.DataDir, "lapd.db"))
		}
	case "sqlite":
		if cfg.DataDir == "" {
			return nil, nil, errors.New("lapd: the sqlite store needs a DataDir (or set TokenStore and ConfirmStore)")
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("lapd: data dir: %w", err)
		}
		s.checkDataDir(cfg.DataDir)
		db, err := sqlitedb.Open(filepath.Join(cfg.DataDir, "lapd.db"))
		if err != nil {
			return nil, nil, fmt.Errorf("lapd: %w", err)
		}
		s.db = db
		s.dbFile.remember(filepath.Join(cfg.DataDir, "lapd.db"))
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
		return nil, nil, fmt.Errorf("lapd: unknown Store %q (want sqlite, memory or nats)", store)
	}
	if cfg.TokenStore != nil {
		tstore = cfg.TokenStore
	}
	if cfg.ConfirmStore != nil {
		cstore = keepOpen{cfg.ConfirmStore}
	}
	return tstore, cstore, nil
}

// openCluster connects to NATS when cfg names a cluster (NATSURL or
// NATSConn); s.nc stays nil on a single node. A connection opened here is
// closed last, after everything that uses it.
func (s *Server) openCluster(cfg Config) error {
	s.cluster = cfg.ClusterName
	if s.cluster == "" {
		s.cluster = "lapd"
	}
	for _, c := range s.cluster {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("lapd: ClusterName %q may hold only letters, digits, - and _", cfg.ClusterName)
		}
	}
	if cfg.NATSReplicas < 0 || cfg.NATSReplicas > 5 {
		return fmt.Errorf("lapd: NATSReplicas %d: want 1 to 5 (0 = keep what exists, 1 for what is created)", cfg.NATSReplicas)
	}
	switch {
	case cfg.NATSConn != nil:
		s.nc = cfg.NATSConn
	case cfg.NATSURL != "":
		opts := append([]nats.Option{
			nats.Name("lapd " + cfg.NodeID),
			nats.MaxReconnects(-1), // a NATS restart is waited out, not fatal
			nats.ReconnectWait(250 * time.Millisecond),
			// A NATS server gone without a reset (its machine lost, the
			// network cut) is found out in 15–20 s, then the node reconnects
			// to another server of the cluster or waits, knowing it is cut
			// off (writes fail at once; its tabs are re-announced after).
			// nats.go's default, 2 minutes twice, left a node believing it
			// was connected for up to 6 minutes, every write waiting 5 s.
			nats.PingInterval(5 * time.Second),
			nats.MaxPingsOutstanding(3),
			nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrConsumerNotActive) && !nc.IsConnected() {
					// The buckets' watches miss their heartbeats while NATS is
					// away: twice every 10 s, and the disconnect was logged.
					s.log.Debug("nats: asynchronous error", "err", err)
					return
				}
				s.log.Warn("nats: asynchronous error", "err", err)
			}),
			nats.DisconnectErrHandler(natsDisconnected(s.log)),
			nats.ReconnectHandler(func(nc *nats.Conn) { s.log.Info("nats: reconnected", "server", nc.ConnectedUrlRedacted()) }),
		}, cfg.NATSOptions...)
		nc, err := nats.Connect(cfg.NATSURL, opts...)
		if err != nil {
			return fmt.Errorf("lapd: connecting to NATS at %s: %w", cfg.NATSURL, err)
		}
		s.nc, s.ownNC = nc, true // closed by closeAll, after audit
	}
	return nil
}

// natsDisconnected logs a lost NATS connection, which the client then
// retries for ever. nats.go calls the same handler when the node closes the
// connection itself (Shutdown): that is no loss, and a warning that says
// "reconnecting" as the last line before "stopped" only worries whoever
// reads the log.
func natsDisconnected(log *slog.Logger) nats.ConnErrHandler {
	return func(nc *nats.Conn, err error) {
		if nc.IsClosed() {
			log.Debug("nats: connection closed")
			return
		}
		log.Warn("nats: disconnected; reconnecting", "err", err)
	}
}

// natsRefused adds to err what NATS refused this node's user, if it did: a
// JetStream request on a subject the user may not publish to is dropped,
// and only times out.
func natsRefused(nc *nats.Conn, err error) error {
	if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) {
		return fmt.Errorf("%w; NATS refused this node's user: %v (docs/CLUSTER.md lists the permissions a node needs)", err, le)
	}
	return err
}

// keepOpen shields the caller's confirm store from confirm.Manager.Close,
// which closes its store.
type keepOpen struct{ confirm.Store }

func (keepOpen) Close() error { return nil }

// openAuditSinks returns cfg.AuditSinks plus the sinks cfg names (stdout,
// a JSONL file, the audit_entries table in lapd.db).
func (s *Server) openAuditSinks(ctx context.Context, cfg Config) ([]audit.Sink, error) {
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
	if cfg.AuditNATS {
		if s.nc == nil {
			closeSinks(sinks[len(cfg.AuditSinks):])
			return nil, errors.New("lapd: AuditNATS needs a cluster (NATSURL or NATSConn)")
		}
		ns, err := audit.OpenNATSSink(ctx, s.nc, audit.NATSSinkConfig{Prefix: s.cluster, Logger: s.log, Replicas: cfg.NATSReplicas})
		if err == nil {
			if err = ns.CheckPublish(ctx); err != nil {
				_ = ns.Close()
			}
		}
		if err != nil {
			closeSinks(sinks[len(cfg.AuditSinks):])
			return nil, natsRefused(s.nc, fmt.Errorf("lapd: audit stream: %w", err))
		}
		sinks = append(sinks, ns)
	}
	if cfg.AuditSQLite {
		if s.db == nil {
			closeSinks(sinks[len(cfg.AuditSinks):])
			return nil, errors.New("lapd: AuditSQLite needs the sqlite store (or a DataDir in a cluster)")
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

// OpenClusterAudit opens for reading the audit stream every node of a
// cluster writes (Config.AuditNATS), as `lapd audit --nats` reads it.
// Close the Closer when done.
func OpenClusterAudit(ctx context.Context, natsURL, clusterName string, opts ...nats.Option) (audit.Querier, io.Closer, error) {
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("lapd: connecting to NATS at %s: %w", natsURL, err)
	}
	if clusterName == "" {
		clusterName = "lapd"
	}
	q, err := audit.OpenNATSSink(ctx, nc, audit.NATSSinkConfig{Prefix: clusterName})
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("lapd: %w", err)
	}
	return q, closerFunc(func() error { q.Close(); nc.Close(); return nil }), nil
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
		return nil, nil, withDBAdvice(dataDir, fmt.Errorf("lapd: %w", err))
	}
	q, err := audit.NewSQLiteSink(db)
	if err != nil {
		db.Close()
		return nil, nil, withDBAdvice(dataDir, fmt.Errorf("lapd: %w", err))
	}
	return q, db, nil
}

// withDBAdvice adds to err, on a line of its own, what to do about it when
// it is an error of DataDir/lapd.db that an operator can act on (damaged,
// unreadable, read-only, full, locked): lapd used to stop with SQLite's
// words only ("file is not a database (26)").
func withDBAdvice(dataDir string, err error) error {
	if dataDir == "" {
		return err
	}
	if a := sqlitedb.Advice(filepath.Join(dataDir, "lapd.db"), err); a != "" {
		return fmt.Errorf("%w\n%s", err, a)
	}
	return err
}

// peerListen is the peer link's address for pairing.Config: none on a
// single node or when turned off, 127.0.0.1:0 by default.
func peerListen(cluster bool, v string) string {
	switch {
	case !cluster || v == "off":
		return ""
	case v == "":
		return "127.0.0.1:0"
	}
	return v
}

// checkDataDir warns when the data directory (which lapd creates 0700) was
// there before and others may list or enter it. lapd's files in it are 0600
// whatever the directory's mode; an existing directory is not changed (it
// may be one the user shares on purpose), but its mode is worth knowing.
func (s *Server) checkDataDir(dir string) {
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		s.log.Warn("lapd: the data directory is open to other users of this machine (lapd's files in it are 0600); chmod 700 it to keep even their names private",
			"dir", dir, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
}
