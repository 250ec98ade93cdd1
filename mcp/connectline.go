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
