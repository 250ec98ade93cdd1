// Package client embeds lapd's browser runtime, lapd.js, and serves it.
//
// lapd.js is one ES module with no build step and no dependencies (it is meant
// to be read in one sitting); lapd.d.ts is its hand-written type declaration.
// Mount the handler next to the rest of lapd:
//
//	mux.Handle("/agent/client.js", client.Handler())
//	mux.Handle("/agent/client.d.ts", client.Handler())
//
// and load it from the app page:
//
//	<script type="module">
//	  import { createAgent } from '/agent/client.js'
//	  const agent = createAgent({ app: {name: 'demo', version: '1'}, getState: () => state, actions })
//	</script>
//
// Responses carry a strong ETag (the SHA-256 of the content) and
// Cache-Control: no-cache, so browsers revalidate on every load and get a
// cheap 304 while the binary is unchanged.
//
// The JavaScript tests live in client/test and run under `node --test`;
// node_test.go runs them as part of `go test` when Node is installed.
package client

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

//go:embed lapd.js
var lapdJS []byte

//go:embed lapd.d.ts
var lapdDTS []byte

// Paths served by Handler.
const (
	ScriptPath = "/agent/client.js"
	TypesPath  = "/agent/client.d.ts"
)

// Script returns a copy of the embedded lapd.js.
func Script() []byte { return append([]byte(nil), lapdJS...) }

type file struct {
	body        []byte
	etag        string
	contentType string
}

func newFile(body []byte, contentType string) file {
	sum := sha256.Sum256(body)
	return file{body: body, etag: `"` + hex.EncodeToString(sum[:]) + `"`, contentType: contentType}
}

var files = map[string]file{
	ScriptPath: newFile(lapdJS, "text/javascript; charset=utf-8"),
	TypesPath:  newFile(lapdDTS, "application/typescript; charset=utf-8"),
}

// Handler serves ScriptPath (text/javascript) and TypesPath for GET and
// HEAD: other paths get 404, other methods 405. If-None-Match with the current
// ETag (or *) gets 304.
func Handler() http.Handler {
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
