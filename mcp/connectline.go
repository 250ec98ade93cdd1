package mcp

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// MaxConnectLine bounds the pasted connect line connect_session accepts.
const MaxConnectLine = 8 << 10

var (
	urlRE   = regexp.MustCompile("https?://[^\\s\"'<>`\\\\]+")
	tokenRE = regexp.MustCompile(`agt_[A-Za-z0-9_-]{16,200}`)
)

// ParseConnectLine pulls the LAP base URL and the agt_ token out of the line
// a user copied from the app's "Connect an AI" panel: free text, the
// reference's JSON-quoted snippet (url="…" token="…"), or the slash-command
// form "/llui-connect <url> <token>". It takes the first http(s) URL and the
// first agt_ token; either may be absent (url is "" then, and the caller
// decides whether it needs one). A URL with no path gets the default LAP base
// path /agent/lap/v1.
func ParseConnectLine(line string) (base, token string, err error) {
	if len(line) > MaxConnectLine {
		return "", "", errors.New("the connect line is longer than 8 KiB")
	}
	token = tokenRE.FindString(line)
	if raw := urlRE.FindString(line); raw != "" {
		raw = strings.TrimRight(raw, ".,;:)]}")
		u, perr := url.Parse(raw)
		if perr != nil || u.Host == "" {
			return "", "", errors.New("the URL in the connect line is not valid")
		}
		u.RawQuery, u.Fragment = "", ""
		if u.Path == "" || u.Path == "/" {
			u.Path = "/agent/lap/v1"
		}
		u.Path = strings.TrimRight(u.Path, "/")
		base = u.String()
	}
	if token == "" {
		return base, "", errors.New("no agt_… token found in the connect line")
	}
	return base, token, nil
}

// LAPBase checks that raw is a LAP base URL and returns it without a
// trailing slash: http(s), a host, no user info, query or fragment, and a
// path that ends in /lap/v1 (the reference's /agent/lap/v1, or another
// prefix's). The bridge sends the user's bearer to <base>/<route>, so a URL
// that is not a LAP base (http://127.0.0.1:X/admin/secret?) is refused before
// anything is sent.
func LAPBase(raw string) (string, error) {
	const want = "url must be the app's LAP base URL, ending in /lap/v1 (like http://localhost:8787/agent/lap/v1)"
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return "", errors.New(want)
	}
	p := strings.TrimRight(u.Path, "/")
	if !strings.HasSuffix(p, "/lap/v1") || strings.Contains(p, "/../") || strings.Contains(p, "/./") || strings.Contains(p, "//") {
		return "", errors.New(want)
	}
	u.Path, u.RawPath = p, ""
	return u.String(), nil
}
