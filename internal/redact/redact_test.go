package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
)

const tok = "agt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
const tab = "tab_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		tok:                                   Redacted,
		"Bearer " + tok:                       "Bearer " + Redacted,
		"ws://h/agent/ws?token=" + tok + "&x": "ws://h/agent/ws?token=" + Redacted + "&x",
		`{"token":"` + tok + `"}`:             `{"token":"` + Redacted + `"}`,
		"lapd.token." + tok + ", lapd.tab." + tab: "lapd.token." + Redacted + ", lapd.tab." + Redacted,
		"x" + tok[:20] + " cut":                   "x" + Redacted + " cut",
		"agt_… tokens, agt_ and agt_short":        "agt_… tokens, agt_ and " + Redacted,
		"tab_visibility_changed_at":               "tab_visibility_changed_at",
		"nothing here":                            "nothing here",
	} {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewJSONHandler(&buf, nil)))
	u, _ := url.Parse("ws://h/agent/ws?token=" + tok)
	log.With("bound", "k="+tok).WithGroup("g").Info("dialing "+tok,
		"err", errors.New("refused "+tok), "url", u, "raw", []byte(tab), slog.Group("inner", "s", tok), "n", 3)
	out := buf.String()
	if strings.Contains(out, tok[4:20]) || strings.Contains(out, tab[4:20]) {
		t.Fatalf("a secret reached the log: %s", out)
	}
	if strings.Count(out, Redacted) != 6 || !strings.Contains(out, `"n":3`) {
		t.Errorf("log line: %s", out)
	}
	if h := Handler(log.Handler()); h != log.Handler() {
		t.Error("double wrap")
	}
}

func FuzzString(f *testing.F) {
	f.Add("Bearer " + tok)
	f.Add("x" + tab + "y" + tok[:10])
	f.Fuzz(func(t *testing.T, s string) {
		out := String(s)
		if secretRE.MatchString(strings.ReplaceAll(out, Redacted, "")) {
			t.Fatalf("a secret survived: %q → %q", s, out)
		}
		if again := String(out); again != out {
			t.Fatalf("not idempotent: %q → %q → %q", s, out, again)
		}
	})
}
