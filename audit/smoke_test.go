package audit_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

func TestSmoke(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	dir := t.TempDir()
	fs, err := audit.OpenJSONLFile(filepath.Join(dir, "a.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := audit.OpenSQLiteSink(filepath.Join(dir, "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	l := audit.New(audit.Config{Sinks: []audit.Sink{audit.NewJSONLSink(&buf), fs, ss}})
	l.Record(t.Context(), audit.Entry{At: 5, TID: "t1", Event: audit.EventMint, Detail: map[string]any{"origin": "http://a", "tok": "agt_x"}})
	if got, want := buf.String(), `{"at":5,"tid":"t1","uid":null,"event":"mint","detail":{"origin":"http://a","tok":"agt_…redacted"}}`+"\n"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	for _, q := range []audit.Querier{fs, ss} {
		es, err := q.Query(t.Context(), audit.Filter{TID: "t1"})
		if err != nil || len(es) != 1 || es[0].Detail["origin"] != "http://a" {
			t.Fatalf("%T: %v %v", q, es, err)
		}
	}
	if err := l.Close(); err != nil || l.Failures() != 0 {
		t.Fatal(err, l.Failures())
	}
}
