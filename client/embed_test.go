package client

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)

	sum := sha256.Sum256(lapdJS)
	jsTag := `"` + hex.EncodeToString(sum[:]) + `"`

	tests := []struct {
		name, method, path, ifNoneMatch string
		wantStatus                      int
		wantType                        string
		wantBody                        []byte
	}{
		{name: "script", method: "GET", path: ScriptPath, wantStatus: 200, wantType: "text/javascript; charset=utf-8", wantBody: lapdJS},
		{name: "types", method: "GET", path: TypesPath, wantStatus: 200, wantType: "application/typescript; charset=utf-8", wantBody: lapdDTS},
		{name: "head", method: "HEAD", path: ScriptPath, wantStatus: 200, wantType: "text/javascript; charset=utf-8", wantBody: []byte{}},
		{name: "etag match", method: "GET", path: ScriptPath, ifNoneMatch: jsTag, wantStatus: 304, wantBody: []byte{}},
		{name: "etag in list, weak", method: "GET", path: ScriptPath, ifNoneMatch: `"x", W/` + jsTag, wantStatus: 304, wantBody: []byte{}},
		{name: "etag star", method: "GET", path: ScriptPath, ifNoneMatch: `*`, wantStatus: 304, wantBody: []byte{}},
		{name: "stale etag", method: "GET", path: ScriptPath, ifNoneMatch: `"old"`, wantStatus: 200, wantType: "text/javascript; charset=utf-8", wantBody: lapdJS},
		{name: "unknown path", method: "GET", path: "/agent/other.js", wantStatus: 404},
		{name: "post", method: "POST", path: ScriptPath, wantStatus: 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.ifNoneMatch != "" {
				req.Header.Set("If-None-Match", tc.ifNoneMatch)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.wantStatus {
				t.Fatalf("status = %d, want %d", res.StatusCode, tc.wantStatus)
			}
			if tc.wantStatus == 200 || tc.wantStatus == 304 {
				if got := res.Header.Get("ETag"); tc.path == ScriptPath && got != jsTag {
					t.Errorf("ETag = %q, want %q", got, jsTag)
				}
				if got := res.Header.Get("Cache-Control"); got != "no-cache" {
					t.Errorf("Cache-Control = %q", got)
				}
			}
			if tc.wantType != "" && res.Header.Get("Content-Type") != tc.wantType {
				t.Errorf("Content-Type = %q, want %q", res.Header.Get("Content-Type"), tc.wantType)
			}
			if tc.wantBody != nil && !bytes.Equal(body, tc.wantBody) {
				t.Errorf("body: got %d bytes, want %d", len(body), len(tc.wantBody))
			}
		})
	}
}

func TestScriptIsACopy(t *testing.T) {
	t.Parallel()
	s := Script()
	if len(s) == 0 || !bytes.Contains(s, []byte("export function createAgent")) {
		t.Fatal("embedded script looks wrong")
	}
	s[0] = 'X'
	if lapdJS[0] == 'X' {
		t.Fatal("Script must return a copy")
	}
}
