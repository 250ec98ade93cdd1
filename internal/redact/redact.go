// Package redact keeps lapd's secrets out of audit entries and logs. An agent
// token ("agt_" + 43 base64url characters) or a tab secret ("tab_" + 43) may
// turn up anywhere in a string: inside an error message, a URL's query, a
// header echoed in a detail. String replaces each one wherever it stands:
//
//	redact.String(`dial ws://h/agent/ws?token=agt_AbC…: refused`)
//	// `dial ws://h/agent/ws?token=agt_…redacted: refused`
//
// A shortened token is still caught ("agt_" and any token characters after
// it); a tab secret only at its full length, since "tab_" starts ordinary
// identifiers. Handler wraps a slog.Handler so every message and string
// attribute (errors and Stringers too) goes through String.
package redact

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
)

// Redacted is what a secret is replaced with.
const Redacted = "agt_…redacted"

var secretRE = regexp.MustCompile(`agt_[A-Za-z0-9_-]+|tab_[A-Za-z0-9_-]{43}`)

// String returns s with every agent token and tab secret replaced by Redacted.
func String(s string) string {
	if !strings.Contains(s, "agt_") && !strings.Contains(s, "tab_") {
		return s // the common case costs two scans, no regexp
	}
	return secretRE.ReplaceAllString(s, Redacted)
}

// Handler returns h wrapped so that log records carry no secrets. Wrapping a
// Handler that Handler returned returns it unchanged.
func Handler(h slog.Handler) slog.Handler {
	if _, ok := h.(*handler); ok {
		return h
	}
	return &handler{h: h}
}

type handler struct{ h slog.Handler }

func (r *handler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r *handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = attr(a)
	}
	return &handler{h: r.h.WithAttrs(clean)}
}

func (r *handler) WithGroup(name string) slog.Handler { return &handler{h: r.h.WithGroup(name)} }

func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]slog.Attr, len(g))
		for i, x := range g {
			clean[i] = attr(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(clean...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, String(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, String(x.String()))
		case []byte:
			return slog.String(a.Key, String(string(x)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
