package audit_test

import (
	"github.com/nats-io/nats.go/jetstream"

	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/natstest"
)

// querySink is a sink that can read back what it stored.
type querySink interface {
	audit.Sink
	audit.Querier
}

var querySinks = map[string]func(t *testing.T) querySink{
	"nats-stream": func(t *testing.T) querySink {
		nc := natstest.Start(t).Connect(t)
		s, err := audit.OpenNATSSink(t.Context(), nc, audit.NATSSinkConfig{Prefix: "q"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	"jsonl-file": func(t *testing.T) querySink {
		s, err := audit.OpenJSONLFile(filepath.Join(t.TempDir(), "audit.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	"sqlite-file": func(t *testing.T) querySink {
		s, err := audit.OpenSQLiteSink(filepath.Join(t.TempDir(), "lapd.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	"sqlite-shared-db": func(t *testing.T) querySink {
		q := url.Values{"_pragma": {"busy_timeout(5000)"}}
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "lapd.db")+"?"+q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := audit.NewSQLiteSink(db)
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
}

func TestQuery(t *testing.T) {
	t.Parallel()
	// Ten entries, at 1000..1009, alternating tids and events.
	var entries []audit.Entry
	for i := range 10 {
		e := audit.Entry{At: int64(1000 + i), TID: fmt.Sprint("t", i%2), Event: audit.EventLapCall,
			Detail: map[string]any{"i": float64(i), "path": "/observe", "nested": map[string]any{"ok": true}}}
		if i%3 == 0 {
			e.Event, e.UID = audit.EventMint, "alice"
		}
		if i == 9 {
			e.TID = ""
		}
		entries = append(entries, e)
	}
	tests := []struct {
		name string
		f    audit.Filter
		want []int // indexes into entries
	}{
		{"all", audit.Filter{}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"tid", audit.Filter{TID: "t1"}, []int{1, 3, 5, 7}},
		{"event", audit.Filter{Event: audit.EventMint}, []int{0, 3, 6, 9}},
		{"tid and event", audit.Filter{TID: "t0", Event: audit.EventMint}, []int{0, 6}},
		{"events", audit.Filter{Events: []string{audit.EventMint, audit.EventRevoke}}, []int{0, 3, 6, 9}},
		{"events, none present", audit.Filter{Events: []string{audit.EventRevoke}}, nil},
		{"events with tid and limit", audit.Filter{TID: "t1", Events: []string{audit.EventLapCall, audit.EventMint}, Limit: 2}, []int{5, 7}},
		{"since inclusive", audit.Filter{Since: 1007}, []int{7, 8, 9}},
		{"until exclusive", audit.Filter{Until: 1002}, []int{0, 1}},
		{"window", audit.Filter{Since: 1003, Until: 1006}, []int{3, 4, 5}},
		{"limit keeps the newest, oldest first", audit.Filter{Limit: 3}, []int{7, 8, 9}},
		{"limit with filter", audit.Filter{TID: "t0", Limit: 2}, []int{6, 8}},
		{"limit above count", audit.Filter{Event: audit.EventMint, Limit: 100}, []int{0, 3, 6, 9}},
		{"offset pages back", audit.Filter{Limit: 3, Offset: 3}, []int{4, 5, 6}},
		{"offset with filter", audit.Filter{TID: "t0", Limit: 2, Offset: 2}, []int{2, 4}},
		{"offset to the end", audit.Filter{Limit: 3, Offset: 8}, []int{0, 1}},
		{"offset past the end", audit.Filter{Limit: 3, Offset: 20}, nil},
		{"no match", audit.Filter{TID: "nope"}, nil},
	}
	for name, open := range querySinks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			defer s.Close()
			for _, e := range entries {
				if err := s.Write(t.Context(), e); err != nil {
					t.Fatal(err)
				}
			}
			for _, tt := range tests {
				got, err := s.Query(t.Context(), tt.f)
				if err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				var want []audit.Entry
				for _, i := range tt.want {
					want = append(want, entries[i])
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: Query(%+v) =\n %v\nwant\n %v", tt.name, tt.f, got, want)
				}
			}
		})
	}
}

func TestJSONLFileReopenAndAppend(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	for i := range 3 {
		s, err := audit.OpenJSONLFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(t.Context(), audit.Entry{At: int64(i + 1), Event: audit.EventMint}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("file mode %v, want 0600", perm)
	}
	s, err := audit.OpenJSONLFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es, err := s.Query(t.Context(), audit.Filter{})
	if err != nil || len(es) != 3 || es[0].At != 1 || es[2].At != 3 {
		t.Errorf("after reopening: %v, %v", es, err)
	}
}

func TestJSONLQuerySkipsMalformedLines(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	content := strings.Join([]string{
		`{"at":1,"tid":null,"uid":null,"event":"mint","detail":{}}`,
		`not json`,
		``,
		`{"at":2,"tid":"t","uid":null,"event":"revoke","detail":{}}`,
		`{"at":3}`, // no event
		`{"at":4,"event":"mint","detail":{"big":"` + strings.Repeat("x", audit.MaxLine) + `"}}`,
		`[1,2]`,
		`{"at":5,"tid":null,"uid":null,"event":"claim","detail":{}}`,
		`{"at":6,"event":"mint"`, // truncated last line, no newline
	}, "\n")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := audit.OpenJSONLFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es, err := s.Query(t.Context(), audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var ats []int64
	for _, e := range es {
		ats = append(ats, e.At)
	}
	if fmt.Sprint(ats) != "[1 2 5]" || s.Skipped() != 5 {
		t.Errorf("entries at %v, skipped %d; want [1 2 5] and 5", ats, s.Skipped())
	}
}

func TestJSONLStreamCannotQuery(t *testing.T) {
	t.Parallel()
	s := audit.NewJSONLSink(os.Stderr)
	if _, err := s.Query(t.Context(), audit.Filter{}); err == nil {
		t.Error("Query on a stream sink succeeded")
	}
}

func TestWriteAfterClose(t *testing.T) {
	t.Parallel()
	var sb strings.Builder
	stream := audit.NewJSONLSink(&sb)
	file, err := audit.OpenJSONLFile(filepath.Join(t.TempDir(), "a.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*audit.JSONLSink{stream, file} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(t.Context(), audit.Entry{Event: audit.EventMint}); !errors.Is(err, audit.ErrClosed) {
			t.Errorf("Write after Close = %v, want ErrClosed", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
	}
}

func TestSQLiteSinkSurvivesReopenAndStoresNulls(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lapd.db")
	s, err := audit.OpenSQLiteSink(path)
	if err != nil {
		t.Fatal(err)
	}
	want := audit.Entry{At: 7, UID: "alice", Event: audit.EventRateLimited, Detail: map[string]any{"endpoint": "/agent/mint"}}
	if err := s.Write(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	s.Close()

	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var nulls int
	if err := db.QueryRow(`SELECT count(*) FROM audit_entries WHERE tid IS NULL AND uid = 'alice'`).Scan(&nulls); err != nil || nulls != 1 {
		t.Errorf("an empty tid is not stored as NULL: %d, %v", nulls, err)
	}
	s2, err := audit.NewSQLiteSink(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	es, err := s2.Query(t.Context(), audit.Filter{})
	if err != nil || len(es) != 1 || fmt.Sprint(es[0]) != fmt.Sprint(want) {
		t.Errorf("after reopening: %v, %v; want [%v]", es, err, want)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "x")
	if _, err := audit.OpenJSONLFile(missing); err == nil {
		t.Error("OpenJSONLFile in a missing directory succeeded")
	}
	if _, err := audit.OpenSQLiteSink(missing); err == nil {
		t.Error("OpenSQLiteSink in a missing directory succeeded")
	}
}

// CheckPublish proves the publish permission without storing anything.
func TestNATSSinkCheckPublishStoresNothing(t *testing.T) {
	t.Parallel()
	nc := natstest.Start(t).Connect(t)
	s, err := audit.OpenNATSSink(t.Context(), nc, audit.NATSSinkConfig{Prefix: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CheckPublish(t.Context()); err != nil {
		t.Fatalf("CheckPublish with every permission: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), audit.StreamName("probe"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("the probe stored %d messages in the stream", info.State.Msgs)
	}
	// A stream that does not answer (no leader yet, here: gone) is not a
	// refused publish: NATS found no responder, so the publish got through.
	if err := js.DeleteStream(t.Context(), audit.StreamName("probe")); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckPublish(t.Context()); err != nil {
		t.Fatalf("CheckPublish with no stream leader: %v", err)
	}
}
