package hostguard

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
)

func req(local, host string) *http.Request {
	r, _ := http.NewRequest("GET", "/", nil)
	r.Host = host
	if local != "" {
		addr, _ := net.ResolveTCPAddr("tcp", local)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(addr)))
	}
	return r
}

func TestAllowed(t *testing.T) {
	g := New([]string{"App.Example.com:443", " ", "lapd.internal."})
	for _, tc := range []struct {
		local, host string
		want        bool
	}{
		{"127.0.0.1:8787", "127.0.0.1:8787", true},
		{"127.0.0.1:8787", "localhost:8787", true},
		{"127.0.0.1:8787", "LOCALHOST.", true},
		{"127.0.0.1:8787", "app.localhost:8787", true},
		{"127.0.0.1:8787", "127.1.2.3", true},
		{"[::1]:8787", "[::1]:8787", true},
		{"127.0.0.1:8787", "app.example.com", true},
		{"127.0.0.1:8787", "lapd.internal:8787", true},
		{"127.0.0.1:8787", "evil.example:8787", false},
		{"127.0.0.1:8787", "evil.example", false},
		{"127.0.0.1:8787", "localhost.evil.example", false},
		{"127.0.0.1:8787", "", false},
		{"127.0.0.1:8787", "192.168.1.5:8787", false},
		{"[::ffff:127.0.0.1]:8787", "evil.example", false},
		{"192.168.1.5:8787", "evil.example", true}, // not on loopback: not judged
		{"", "evil.example", true},                 // no local address: not judged
	} {
		if got := g.Allowed(req(tc.local, tc.host)); got != tc.want {
			t.Errorf("local %s Host %q: %v, want %v", tc.local, tc.host, got, tc.want)
		}
	}
}

func FuzzName(f *testing.F) {
	for _, s := range []string{"localhost:8787", "[::1]:80", "evil.example.", "127.0.0.1", "a.localhost", ""} {
		f.Add(s)
	}
	g := New([]string{"app.example.com"})
	f.Fuzz(func(t *testing.T, host string) {
		n := Name(host)
		if n != strings.ToLower(n) || strings.HasSuffix(n, ".") {
			t.Fatalf("Name(%q) = %q", host, n)
		}
		allowed := g.Allowed(req("127.0.0.1:8787", host))
		if allowed != (IsLoopbackName(n) || n == "app.example.com") {
			t.Fatalf("Allowed(%q) = %v for name %q", host, allowed, n)
		}
	})
}
