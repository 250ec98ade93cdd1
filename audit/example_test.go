package audit_test

import (
	"context"
	"os"

	"github.com/lapd-dev/lapd/audit"
)

// A Log with the default sink of lapd serve: one JSON object per line on
// stdout. A token that slips into a detail never reaches a sink.
func ExampleLog() {
	l := audit.New(audit.Config{Sinks: []audit.Sink{audit.NewJSONLSink(os.Stdout)}})
	defer l.Close()
	ctx := context.Background()
	l.Record(ctx, audit.Entry{At: 1764000000000, TID: "3f1c", UID: "alice", Event: audit.EventMint,
		Detail: map[string]any{"origin": "https://app.example"}})
	l.Record(ctx, audit.Entry{At: 1764000000500, TID: "3f1c", Event: audit.EventClaim,
		Detail: map[string]any{"transport": "ws", "repair": false, "oops": "agt_secret"}})
	// Output:
	// {"at":1764000000000,"tid":"3f1c","uid":"alice","event":"mint","detail":{"origin":"https://app.example"}}
	// {"at":1764000000500,"tid":"3f1c","uid":null,"event":"claim","detail":{"oops":"agt_…redacted","repair":false,"transport":"ws"}}
}
