package lapd

import (
	"fmt"
	neturl "net/url"
	"strconv"
	"strings"
)

// CleanOrigin checks one extra allowed origin (Config.Origins) and returns
// it as a browser writes it in the Origin header: scheme://host[:port] with
// scheme http or https, lower case, the default port dropped, nothing after
// the host but an optional "/". The exact-match checks compare against that
// form, so "https://App.example.com:443/" and "https://app.example.com"
// are the same origin, and "*" or a path is an error, not a silent
// mismatch.
func CleanOrigin(o string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("%q is not an origin: %s (want scheme://host[:port], such as https://app.example.com or http://localhost:3000)", o, why)
	}
	if strings.Contains(o, "*") {
		return "", bad("wildcards are not allowed; list each origin")
	}
	if !strings.Contains(o, "://") {
		return "", bad("it has no scheme (http:// or https://)")
	}
	u, err := neturl.Parse(o)
	switch {
	case err != nil:
		return "", bad(strings.TrimPrefix(err.Error(), "parse "+strconv.Quote(o)+": "))
	case u.Scheme != "http" && u.Scheme != "https":
		return "", bad("the scheme must be http or https")
	case u.Host == "":
		return "", bad("it has no host")
	case u.User != nil:
		return "", bad("an origin has no user name")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "", u.ForceQuery:
		return "", bad("an origin has no path, query or fragment")
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "http" && p == "80") || (u.Scheme == "https" && p == "443") {
		host = strings.TrimSuffix(host, ":"+p)
	} else if p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", bad("the port must be 1 to 65535")
		}
	}
	return u.Scheme + "://" + host, nil
}

// cleanOrigins checks every Config.Origins entry (see CleanOrigin).
func cleanOrigins(list []string) ([]string, error) {
	out := make([]string, 0, len(list))
	for _, o := range list {
		c, err := CleanOrigin(strings.TrimSpace(o))
		if err != nil {
			return nil, fmt.Errorf("lapd: Origins: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}
