package examples

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	index := files["/"]

	tests := []struct {
		name, method, path, inm string
		status                  int
		ctype                   string
		contains                string
	}{
		{"index", "GET", "/", "", 200, "text/html; charset=utf-8", `src="/app.js"`},
		{"index.html", "GET", "/index.html", "", 200, "text/html; charset=utf-8", `data-agent="board"`},
		{"app", "GET", "/app.js", "", 200, "text/javascript; charset=utf-8", `from '/agent/client.js'`},
		{"app exposes the agent", "GET", "/app.js", "", 200, "text/javascript; charset=utf-8", `window.__lapd = agent`},
		{"css", "GET", "/style.css", "", 200, "text/css; charset=utf-8", `.board`},
		{"favicon linked", "GET", "/", "", 200, "text/html; charset=utf-8", `<link rel="icon" href="/favicon.svg"`},
		{"favicon", "GET", "/favicon.svg", "", 200, "image/svg+xml", `<svg`},
		{"favicon.ico (asked for by browsers whatever the page links)", "GET", "/favicon.ico", "", 200, "image/svg+xml", `<svg`},
		{"head", "HEAD", "/", "", 200, "text/html; charset=utf-8", ""},
		{"not modified", "GET", "/", index.ETag(), 304, "", ""},
		{"stale etag", "GET", "/", `"nope"`, 200, "text/html; charset=utf-8", "Taskboard"},
		{"unknown", "GET", "/secret", "", 404, "", ""},
		{"embedded go file is not served", "GET", "/embed.go", "", 404, "", ""},
		{"post", "POST", "/", "", 405, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if tc.inm != "" {
				req.Header.Set("If-None-Match", tc.inm)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var body bytes.Buffer
			_, _ = body.ReadFrom(res.Body)
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
			}
			if tc.ctype != "" && res.Header.Get("Content-Type") != tc.ctype {
				t.Errorf("Content-Type %q, want %q", res.Header.Get("Content-Type"), tc.ctype)
			}
			if tc.status == 200 || tc.status == 304 {
				if res.Header.Get("Cache-Control") != "no-cache" || !strings.HasPrefix(res.Header.Get("ETag"), `"`) {
					t.Errorf("caching headers: %v", res.Header)
				}
			}
			if tc.contains != "" && !strings.Contains(body.String(), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
		})
	}
}

func do(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestSaveHandler(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := SaveHandler()
		rec := do(h, httptest.NewRequest("GET", "/demo/save", nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"board":null`) {
			t.Fatalf("empty GET: %d %s", rec.Code, rec.Body)
		}

		start := time.Now()
		board := `{"tasks":[{"id":1,"title":"a"},{"id":2,"title":"b"}]}`
		rec = do(h, httptest.NewRequest("POST", "/demo/save", strings.NewReader(board)))
		if rec.Code != 200 {
			t.Fatalf("POST: %d %s", rec.Code, rec.Body)
		}
		if d := time.Since(start); d != SaveDelay {
			t.Errorf("answered after %v, want %v", d, SaveDelay)
		}
		var got struct {
			OK      bool  `json:"ok"`
			SavedAt int64 `json:"savedAt"`
			Tasks   int   `json:"tasks"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || !got.OK || got.Tasks != 2 || got.SavedAt == 0 {
			t.Fatalf("POST body %s (%v)", rec.Body, err)
		}
		rec = do(h, httptest.NewRequest("GET", "/demo/save", nil))
		if !strings.Contains(rec.Body.String(), `"title":"b"`) {
			t.Fatalf("GET after save: %s", rec.Body)
		}

		// A cancelled request is not stored.
		ctx, cancel := context.WithCancel(context.Background())
		req := httptest.NewRequest("POST", "/demo/save", strings.NewReader(`{"tasks":[]}`)).WithContext(ctx)
		done := make(chan struct{})
		go func() { do(h, req); close(done) }()
		synctest.Wait()
		cancel()
		<-done
		rec = do(h, httptest.NewRequest("GET", "/demo/save", nil))
		if !strings.Contains(rec.Body.String(), `"title":"b"`) {
			t.Fatalf("cancelled save overwrote the board: %s", rec.Body)
		}
	})
}

func TestSaveHandlerRefusals(t *testing.T) {
	t.Parallel()
	h := SaveHandler()
	tests := []struct {
		name, method, body string
		status             int
		code               string
	}{
		{"not json", "POST", "nope", 400, "invalid"},
		{"no tasks", "POST", `{"x":1}`, 400, "invalid"},
		{"too large", "POST", `{"tasks":["` + strings.Repeat("x", MaxSaveBytes) + `"]}`, 413, "payload-too-large"},
		{"method", "PUT", `{}`, 405, "method-not-allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := do(h, httptest.NewRequest(tc.method, "/demo/save", strings.NewReader(tc.body)))
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), `"code":"`+tc.code+`"`) {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
		})
	}
}

// TestAppSyntax parses app.js with node (skipped without node unless CI=true).
func TestAppSyntax(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is required when CI=true")
		}
		t.Skip("node not installed")
	}
	src, err := taskboard.ReadFile("taskboard/app.js")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, "--input-type=module", "--check")
	cmd.Stdin = bytes.NewReader(src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("app.js does not parse: %v\n%s", err, out)
	}
}
