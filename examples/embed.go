// Package examples embeds lapd's demo app, Taskboard, and serves it.
//
// Taskboard (examples/taskboard) is a small kanban board wired to lapd.js: it
// declares its actions once (add, toggle, rename, move, filter, an async save,
// a clear-all that needs the user's approval, a reset only humans may do) and
// uses the same table for its own buttons and for the AI. `lapd serve` mounts
// it by default; a Go program can do the same:
//
//	mux.Handle("/agent/client.js", client.Handler())
//	mux.Handle("/demo/save", examples.SaveHandler())
//	mux.Handle("/", examples.Handler())
//
// The save route answers after SaveDelay so that send_message's "drained" wait
// has a real asynchronous effect to wait for. examples/react and examples/vue
// hold short, unbuilt snippets for wiring lapd.js into those frameworks.
//
// browser_test.go drives the page and lapd.js in headless Chromium through
// github.com/chromedp/chromedp (a test-only dependency in go.mod) against a
// minimal fake lapd server; it is skipped without Chromium unless CI=true.
package examples

import (
	"embed"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/internal/static"
)

//go:embed taskboard/index.html taskboard/app.js taskboard/style.css taskboard/favicon.svg
var taskboard embed.FS

// SaveDelay is how long SaveHandler takes to answer.
const SaveDelay = 150 * time.Millisecond

// MaxSaveBytes bounds the board a save may carry.
const MaxSaveBytes = 256 << 10

var files = func() map[string]static.File {
	m := map[string]static.File{}
	add := func(path, name, ctype string) {
		b, err := taskboard.ReadFile("taskboard/" + name)
		if err != nil {
			panic("examples: missing embedded " + name)
		}
		m[path] = static.NewFile(b, ctype)
	}
	add("/", "index.html", "text/html; charset=utf-8")
	add("/index.html", "index.html", "text/html; charset=utf-8")
	add("/app.js", "app.js", "text/javascript; charset=utf-8")
	add("/style.css", "style.css", "text/css; charset=utf-8")
	add("/favicon.svg", "favicon.svg", "image/svg+xml")
	add("/favicon.ico", "favicon.svg", "image/svg+xml") // browsers ask for it whatever the page links
	return m
}()

// Handler serves the Taskboard page at / (and /index.html, /app.js,
// /style.css, /favicon.svg, /favicon.ico) for GET and HEAD, with a strong
// ETag (SHA-256), Cache-Control: no-cache and 304 on If-None-Match. The page
// loads /agent/client.js, which the client package serves.
func Handler() http.Handler { return static.Handler(files) }

// SaveHandler is the demo's POST /demo/save: it stores the JSON board it is
// given in memory (one board per handler, at most MaxSaveBytes) and answers
// {"ok":true,"savedAt":<ms>,"tasks":<n>} after SaveDelay. GET returns the last
// saved board ({"board":null} before the first save). A request cancelled
// during the delay is not stored.
func SaveHandler() http.Handler {
	s := &saver{}
	return s
}

type saver struct {
	mu      sync.Mutex
	board   json.RawMessage
	savedAt int64
}

func (s *saver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		s.mu.Lock()
		board, at := s.board, s.savedAt
		s.mu.Unlock()
		if board == nil {
			board = json.RawMessage("null")
		}
		writeJSON(w, http.StatusOK, map[string]any{"board": board, "savedAt": at})
	case http.MethodPost:
		// A cross-site page may POST a form or a no-cors fetch here: only
		// the demo's own origin (or a client with no Origin) may save.
		if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
			writeJSON(w, http.StatusForbidden, errBody("forbidden-origin", "only the demo page itself may save the board"))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSaveBytes))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, errBody("payload-too-large", "the board is over 256 KiB"))
			return
		}
		var board struct {
			Tasks []json.RawMessage `json:"tasks"`
		}
		if err := json.Unmarshal(body, &board); err != nil || board.Tasks == nil {
			writeJSON(w, http.StatusBadRequest, errBody("invalid", "body must be {\"tasks\":[…]}"))
			return
		}
		t := time.NewTimer(SaveDelay)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
		at := time.Now().UnixMilli()
		s.mu.Lock()
		s.board, s.savedAt = json.RawMessage(body), at
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "savedAt": at, "tasks": len(board.Tasks)})
	default:
		w.Header().Set("Allow", "GET, POST")
		writeJSON(w, http.StatusMethodNotAllowed, errBody("method-not-allowed", ""))
	}
}

// sameOrigin reports whether origin is the request's own http(s)://Host.
func sameOrigin(origin string, r *http.Request) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(origin, scheme+"://"+r.Host)
}

func errBody(code, detail string) map[string]any {
	e := map[string]any{"code": code}
	if detail != "" {
		e["detail"] = detail
	}
	return map[string]any{"error": e}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
