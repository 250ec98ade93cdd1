package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
)

// runAudit is `lapd audit`: print and filter audit entries from the SQLite
// database in --data-dir (the default sink of `lapd serve`) or a JSONL file.
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) error {
	var dataDir, file, natsURL, clusterName, natsCreds, natsCA, natsCert, natsKey, tid, event, since, until, format string
	var limit int
	fs := newFlagSet("lapd audit", stdout, env)
	fs.String(&dataDir, "data-dir", "lapd-data", "data directory of lapd serve (reads lapd.db)")
	fs.StringVar(&file, "file", "", "read a JSONL audit file (from --audit file:PATH) instead of the database")
	fs.String(&natsURL, "nats", "", "read the whole cluster's audit stream from this NATS server instead of one node's database")
	fs.String(&clusterName, "cluster-name", "lapd", "the cluster's --cluster-name (with --nats)")
	fs.String(&natsCreds, "nats-creds", "", "NATS credentials file (with --nats)")
	fs.String(&natsCA, "nats-ca", "", "PEM CA of the NATS server's certificate (with --nats)")
	fs.String(&natsCert, "nats-cert", "", "PEM client certificate for NATS mutual TLS (with --nats and --nats-key)")
	fs.String(&natsKey, "nats-key", "", "PEM client key for NATS mutual TLS (with --nats and --nats-cert)")
	fs.StringVar(&tid, "tid", "", "only entries of this session id")
	fs.StringVar(&event, "event", "", "only these events, comma-separated; a glob such as 'confirm-*' matches several (events: "+strings.Join(audit.Events(), ", ")+")")
	fs.StringVar(&since, "since", "", "only entries at or after this time: RFC 3339, or a duration ago such as 15m or 2h")
	fs.StringVar(&until, "until", "", "only entries before this time (same forms as --since)")
	fs.IntVar(&limit, "limit", 100, "at most this many (the newest); 0 = all")
	fs.StringVar(&format, "format", "text", "text (one line each) or json (JSONL)")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	now := time.Now()
	f := audit.Filter{TID: tid, Limit: limit}
	var err error
	if f.Events, err = parseEvents(event); err != nil {
		return err
	}
	if f.Since, err = parseWhen(since, now); err != nil {
		return usageError{"--since: " + err.Error()}
	}
	if f.Until, err = parseWhen(until, now); err != nil {
		return usageError{"--until: " + err.Error()}
	}
	if format != "text" && format != "json" {
		return usageError{"--format must be text or json"}
	}
	if limit < 0 {
		return usageError{"--limit must be 0 or more"}
	}
	if (natsCert == "") != (natsKey == "") {
		return usageError{"--nats-cert and --nats-key go together"}
	}
	if natsURL == "" && (natsCreds != "" || natsCA != "" || natsCert != "") {
		return usageError{"--nats-creds, --nats-ca and --nats-cert need --nats (the cluster's audit stream)"}
	}

	var q audit.Querier
	if natsURL != "" {
		var opts []nats.Option
		if natsCreds != "" {
			opts = append(opts, nats.UserCredentials(natsCreds))
		}
		if natsCA != "" {
			opts = append(opts, nats.RootCAs(natsCA))
		}
		if natsCert != "" {
			opts = append(opts, nats.ClientCert(natsCert, natsKey))
		}
		s, closer, err := lapd.OpenClusterAudit(ctx, natsURL, clusterName, opts...)
		if err != nil {
			return err
		}
		defer closer.Close()
		q = s
	} else if file != "" {
		if _, err := os.Stat(file); err != nil {
			return fmt.Errorf("audit file: %w", err)
		}
		s, err := audit.OpenJSONLFile(file)
		if err != nil {
			return err
		}
		defer s.Close()
		q = s
	} else {
		path := filepath.Join(dataDir, "lapd.db")
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("no audit database at %s (run lapd serve with --data-dir %s, or pass --file): %w", path, dataDir, err)
		}
		s, closer, err := lapd.OpenAudit(dataDir)
		if err != nil {
			return err
		}
		defer closer.Close()
		q = s
	}
	entries, err := q.Query(ctx, f)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if format == "json" {
			b, _ := json.Marshal(e)
			fmt.Fprintf(stdout, "%s\n", b)
		} else {
			fmt.Fprintln(stdout, audit.FormatText(e))
		}
	}
	if len(entries) == 0 {
		fmt.Fprintln(stderr, "no matching audit entries")
	}
	return nil
}

// parseWhen reads "" (no bound), an RFC 3339 time, a duration ago ("15m"),
// or Unix milliseconds; it returns Unix ms.
func parseWhen(s string, now time.Time) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d).UnixMilli(), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return ms, nil
	}
	return 0, fmt.Errorf("%q is not a time (use RFC 3339 like 2026-11-23T10:00:00Z, a duration ago like 15m, or Unix ms)", s)
}

// parseEvents reads --event: comma-separated event names or globs
// (path.Match syntax: confirm-*, msg-?locked). Each must name or match at
// least one event lapd writes; the result lists the matched names.
func parseEvents(s string) ([]string, error) {
	known := audit.Events()
	var out []string
	for _, pat := range splitList(s) {
		n := 0
		for _, ev := range known {
			ok, err := path.Match(pat, ev)
			if err != nil {
				return nil, usageError{fmt.Sprintf("--event %q: %v", pat, err)}
			}
			if ok {
				n++
				if !slices.Contains(out, ev) {
					out = append(out, ev)
				}
			}
		}
		if n == 0 {
			msg := fmt.Sprintf("--event: no audit event is called %q", pat)
			if strings.ContainsAny(pat, "*?[") {
				msg = fmt.Sprintf("--event: %q matches no audit event", pat)
			} else if slices.ContainsFunc(known, func(ev string) bool { return strings.HasPrefix(ev, pat+"-") }) {
				msg += " (did you mean " + pat + "-*?)"
			} else if sug := nearestEvent(pat, known); sug != "" {
				msg += " (did you mean " + sug + "?)"
			}
			return nil, usageError{msg + "; events are: " + strings.Join(known, ", ")}
		}
	}
	return out, nil
}

// nearestEvent is the known event closest to s (edit distance ≤ 3), or "".
func nearestEvent(s string, known []string) string {
	best, bestD := "", 4
	for _, ev := range known {
		if d := editDistance(s, ev); d < bestD {
			best, bestD = ev, d
		}
	}
	return best
}
