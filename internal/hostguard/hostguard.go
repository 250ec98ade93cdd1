// Package hostguard is lapd's DNS-rebinding defence. A web page can make the
// browser resolve its own name (evil.example) to 127.0.0.1 and then talk to
// a server on the user's machine as if it were evil.example's own server:
// same-origin, so no CORS or Origin check stops it. What gives it away is the
// Host header, which still says evil.example. A Guard therefore refuses any
// request that arrived on a loopback address but names a host that is not a
// loopback name (localhost, *.localhost, 127.0.0.0/8, ::1) or one the
// operator listed (the --public-url host, --hosts):
//
//	g := hostguard.New([]string{"app.example.com"})
//	if !g.Allowed(r) { /* 403 forbidden-host */ }
//
// A request that arrived on any other address is not judged here: rebinding
// only reaches servers the browser can reach by a name it does not own, and a
// server listening on a public address has no loopback-only trust to lose.
// Where the connection came in is read from http.LocalAddrContextKey, which
// net/http sets; a request without it (a handler called directly) passes.
package hostguard

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Guard holds the allowed host names. Safe for concurrent use.
type Guard struct {
	hosts map[string]bool
}

// New returns a Guard that allows loopback names plus hosts (names or
// host:port; ports, case and a trailing dot are ignored; blanks skipped).
func New(hosts []string) *Guard {
	g := &Guard{hosts: map[string]bool{}}
	for _, h := range hosts {
		if n := Name(h); n != "" {
			g.hosts[n] = true
		}
	}
	return g
}

// Allowed reports whether r may be served.
func (g *Guard) Allowed(r *http.Request) bool {
	if !OnLoopback(r) {
		return true
	}
	n := Name(r.Host)
	return IsLoopbackName(n) || g.hosts[n]
}

// OnLoopback reports whether r arrived on a loopback address.
func OnLoopback(r *http.Request) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || a == nil {
		return false
	}
	if ta, ok := a.(*net.TCPAddr); ok && ta != nil { // net/http's usual: no String and parse per request
		ip, ok := netip.AddrFromSlice(ta.IP)
		return ok && ip.Unmap().IsLoopback()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	return ap.Addr().Unmap().IsLoopback()
}

// Name is the host name of a Host header value or host[:port]: lower case,
// without port, brackets or trailing dot.
func Name(hostport string) string {
	h := strings.TrimSpace(hostport)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.Trim(h, "[]")
	return strings.TrimRight(strings.ToLower(h), ".")
}

// IsLoopbackName reports whether a host name (as Name returns it) can only
// mean this machine: localhost, a name under .localhost (RFC 6761: never sent
// to DNS), or a loopback IP address.
func IsLoopbackName(name string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(name)
	return err == nil && ip.Unmap().IsLoopback()
}
