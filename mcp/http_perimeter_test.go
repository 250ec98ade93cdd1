package mcp

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// The DNS-rebinding refusal on /agent/mcp was mcp-go's plain-text 403 and
// not audited: it is now the JSON envelope, audited, and a configured host
// (e.g. the public URL's, behind a proxy on the same machine) is served.
func TestHTTPHostRefusalIsJSONAndAudited(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.AllowedHosts = []string{"lapd.example.com"} })
	req, _ := http.NewRequest(http.MethodPost, hh.srv.URL, strings.NewReader(initBody))
	req.Host = "evil.example"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	if res.StatusCode != http.StatusForbidden || json.Unmarshal(b, &env) != nil || env.Error.Code != "forbidden-host" ||
		!strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("rebinding refusal: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	if !hh.audit.has(audit.EventRefused, "code", "forbidden-host") {
		t.Fatal("host refusal not audited")
	}
	if r := hh.raw(http.MethodPost, "", initBody, map[string]string{"Host": "lapd.example.com"}); r.StatusCode != http.StatusOK {
		t.Fatalf("configured host: %d", r.StatusCode)
	}
}
