package static

import (
	"net/http/httptest"
	"testing"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	f := NewFile([]byte("hello"), "text/plain; charset=utf-8")
	h := Handler(map[string]File{"/a.txt": f})
	for _, tc := range []struct {
		method, path, inm string
		status            int
		body              string
	}{
		{"GET", "/a.txt", "", 200, "hello"},
		{"HEAD", "/a.txt", "", 200, ""},
		{"GET", "/a.txt", f.ETag(), 304, ""},
		{"GET", "/a.txt", `"x", W/` + f.ETag(), 304, ""},
		{"GET", "/a.txt", "*", 304, ""},
		{"GET", "/a.txt", `"stale"`, 200, "hello"},
		{"GET", "/b.txt", "", 404, "404 page not found\n"},
		{"POST", "/a.txt", "", 405, "method not allowed\n"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.inm != "" {
			req.Header.Set("If-None-Match", tc.inm)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status || rec.Body.String() != tc.body {
			t.Errorf("%s %s (If-None-Match %q): %d %q, want %d %q", tc.method, tc.path, tc.inm, rec.Code, rec.Body.String(), tc.status, tc.body)
		}
		if tc.status == 200 && (rec.Header().Get("ETag") != f.ETag() || rec.Header().Get("Cache-Control") != "no-cache") {
			t.Errorf("%s %s: headers %v", tc.method, tc.path, rec.Header())
		}
	}
}
