package lapd

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/internal/natstest"
)

// A node that closes its own NATS connection (Shutdown) does not log that it
// lost NATS and is reconnecting; a connection that drops while open does.
func TestNATSDisconnectedLog(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	handle := natsDisconnected(log)

	open := ns.Connect(t)
	handle(open, io.EOF)
	if got := buf.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "reconnecting") {
		t.Fatalf("a dropped connection logged %q; want a warning that it reconnects", got)
	}

	buf.Reset()
	closed := ns.Connect(t)
	closed.Close()
	handle(closed, nil)
	if got := buf.String(); got != "" {
		t.Fatalf("closing the connection on purpose logged %q at info or above; want nothing", got)
	}
}
