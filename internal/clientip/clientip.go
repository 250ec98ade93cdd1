// Package clientip names the client behind an HTTP request for per-client
// limits: its address (the socket's, or the one a trusted proxy put in
// X-Forwarded-For), and a grouping key under which limits are counted.
//
//	addr := clientip.Of(r, trustProxy) // "203.0.113.7", "2001:db8::1"
//	key := clientip.Key(addr)          // "203.0.113.7", "2001:db8::/64", "127.0.0.0/8"
//
// Key groups IPv6 addresses by their /64: one subscriber usually holds a
// whole /64 and can pick any of its 2^64 addresses, so counting per address
// would let one client look like as many clients as it likes. For the same
// reason IPv4 loopback is one key, "127.0.0.0/8": a local process may connect
// from any of 127.0.0.0/8's 16 million addresses (Linux routes them all to
// lo), and a limit counted per address would let it mint, or open tabs, as
// 16 million clients. Anything that is not an IP address (a unix socket,
// "in-process:0") is its own key.
package clientip

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Of is the caller's address: with trustProxy = n > 0, the n-th entry from
// the end of X-Forwarded-For (the one the outermost trusted proxy saw; the
// header is ignored when the chain is shorter); otherwise, or without the
// header, the socket's remote host. X-Forwarded-For is never read with
// trustProxy 0: a direct client could write anything there.
func Of(r *http.Request, trustProxy int) string {
	if trustProxy > 0 {
		var hops []string
		for _, v := range r.Header.Values("X-Forwarded-For") {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p != "" {
					hops = append(hops, p)
				}
			}
		}
		if len(hops) >= trustProxy {
			return hops[len(hops)-trustProxy]
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Key is the grouping key of addr for limits: an IPv4 address as itself
// (an IPv4-mapped IPv6 address as its IPv4 form), except that every IPv4
// loopback address is "127.0.0.0/8"; an IPv6 address as its /64 prefix;
// anything else unchanged.
func Key(addr string) string {
	ip, err := netip.ParseAddr(strings.Trim(addr, "[]"))
	if err != nil {
		return addr
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		if ip.IsLoopback() {
			return loopback4
		}
		return ip.String()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return addr
	}
	return p.String()
}

// loopback4 is the key of every IPv4 loopback address.
const loopback4 = "127.0.0.0/8"

// KeyOf is Key(Of(r, trustProxy)).
func KeyOf(r *http.Request, trustProxy int) string { return Key(Of(r, trustProxy)) }
