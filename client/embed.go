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
	_ "embed"
	"net/http"

	"github.com/lapd-dev/lapd/internal/static"
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

var handler = static.Handler(map[string]static.File{
	ScriptPath: static.NewFile(lapdJS, "text/javascript; charset=utf-8"),
	TypesPath:  static.NewFile(lapdDTS, "application/typescript; charset=utf-8"),
})

// Handler serves ScriptPath (text/javascript) and TypesPath for GET and
// HEAD: other paths get 404, other methods 405. If-None-Match with the current
// ETag (or *) gets 304.
func Handler() http.Handler { return handler }
