// Package static serves a fixed set of embedded files with strong ETags, so
// the browser client (/agent/client.js) and the demo app revalidate cheaply
// (304) on every load and never run a stale copy after an upgrade.
package static

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

// File is one servable file.
type File struct {
	body        []byte
	etag        string
	contentType string
}

// NewFile returns a File whose ETag is the SHA-256 of body.
func NewFile(body []byte, contentType string) File {
	sum := sha256.Sum256(body)
	return File{body: body, etag: `"` + hex.EncodeToString(sum[:]) + `"`, contentType: contentType}
}

// Handler serves files by exact URL path for GET and HEAD: other paths get
// 404, other methods 405. Responses carry the ETag, Cache-Control: no-cache
// and nosniff; If-None-Match with the current ETag (or *) gets 304.
func Handler(files map[string]File) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("ETag", f.etag)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		if etagMatches(r.Header.Get("If-None-Match"), f.etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", f.contentType)
		h.Set("Content-Length", strconv.Itoa(len(f.body)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(f.body)
		}
	})
}

// etagMatches implements If-None-Match's weak comparison over a list.
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}

// ETag returns the file's strong ETag (quoted).
func (f File) ETag() string { return f.etag }
