// Package natstest runs a NATS server with JetStream inside a test process,
// for the tests of lapd's cluster parts (the KV stores, the pairing
// forwarder, several lapd.Servers on one NATS). It uses the server's own Go
// module (github.com/nats-io/nats-server/v2), so tests need no binary; the
// multi-process E2E runs a real nats-server instead.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server is a running in-process NATS server.
type Server struct {
	*server.Server
}

// Start starts a NATS server with JetStream on a free loopback port, storing
// in a temporary directory; it is shut down when t's test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with the server's options changed by mod first (users
// and their permissions, for example); mod may be nil.
func StartWith(t testing.TB, mod func(*server.Options)) *Server {
	t.Helper()
	o := &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
	}
	if mod != nil {
		mod(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	if !o.NoLog {
		s.ConfigureLogger() // to stderr
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: the NATS server did not start")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Server{s}
}

// URL is the server's client URL (nats://127.0.0.1:port).
func (s *Server) URL() string { return s.ClientURL() }

// Connect opens a client connection, closed when t's test ends.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}
