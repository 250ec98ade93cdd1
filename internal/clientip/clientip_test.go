package clientip

import (
	"net/http"
	"testing"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		trust  int
		want   string
	}{
		{"socket", "192.0.2.1:5555", nil, 0, "192.0.2.1"},
		{"xff ignored without trust", "192.0.2.1:5555", []string{"203.0.113.9"}, 0, "192.0.2.1"},
		{"one proxy", "10.0.0.1:80", []string{"198.51.100.7, 203.0.113.9"}, 1, "203.0.113.9"},
		{"two proxies", "10.0.0.1:80", []string{"198.51.100.7", "203.0.113.9"}, 2, "198.51.100.7"},
		{"chain shorter than trust", "10.0.0.1:80", []string{"203.0.113.9"}, 2, "10.0.0.1"},
		{"ipv6 socket", "[2001:db8::1]:80", nil, 0, "2001:db8::1"},
		{"not host:port", "in-process:0:x", nil, 0, "in-process:0:x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := Of(r, tc.trust); got != tc.want {
				t.Fatalf("Of = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":                 "192.0.2.1",
		"::ffff:192.0.2.1":          "192.0.2.1",
		"127.0.0.1":                 "127.0.0.0/8", // every loopback source is one client
		"127.11.200.7":              "127.0.0.0/8",
		"::ffff:127.0.0.2":          "127.0.0.0/8",
		"::1":                       "::/64",
		"2001:db8:1:2:aaaa::1":      "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff:ffff::9": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]":         "2001:db8:1:3::/64",
		"fe80::1%eth0":              "fe80::/64",
		"in-process":                "in-process",
		"":                          "",
	} {
		if got := Key(in); got != want {
			t.Errorf("Key(%q) = %q, want %q", in, got, want)
		}
	}
}
