// Command embed-go is a tiny Go app server with lapd inside it: its own
// routes (a login, a page), and lapd mounted under /agent/ by the ten lines
// in newServer. It is a separate Go module, as your app would be; go.mod's
// replace points at this repository.
//
//	cd examples/embed-go && go run . --addr 127.0.0.1:8080
//	open http://127.0.0.1:8080/login?user=alice, then "Connect an AI"
//
// Only logged-in users may mint: lapd asks the app's own session (the
// "session" cookie) who is there, through lap.IdentityFunc.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lap"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	data := flag.String("data-dir", "", "lapd's data directory (SQLite); empty = memory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, *addr, *data); err != nil {
		fmt.Fprintln(os.Stderr, "embed-go:", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, addr, dataDir string) error {
	app, err := newServer(ctx, dataDir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		app.agent.Shutdown(context.Background())
		return err
	}
	// ConnState caps the connections one client keeps open (its
	// longest-idle one makes room for a new one); IdleTimeout bounds idle
	// keep-alives.
	hs := &http.Server{Handler: app.mux, ConnState: app.agent.ConnState, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(os.Stderr, "embed-go listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		app.agent.Shutdown(context.Background())
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// lapd first: tabs are told to reconnect while the listener still
	// answers in-flight calls; then the HTTP server.
	return errors.Join(app.agent.Shutdown(sctx), hs.Shutdown(sctx))
}

// server is the app: its sessions, its routes, and lapd.
type server struct {
	mu       sync.Mutex
	sessions map[string]string // session cookie → user
	mux      *http.ServeMux
	agent    *lapd.Server
}

func newServer(ctx context.Context, dataDir string) (*server, error) {
	s := &server{sessions: map[string]string{}, mux: http.NewServeMux()}

	// lapd, in ten lines: who may mint is the app's own session.
	agent, err := lapd.New(ctx, lapd.Config{
		DataDir:  dataDir,
		Identity: lap.IdentityFunc(func(r *http.Request) (string, error) { return s.user(r), nil }),
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	s.agent = agent
	s.mux.Handle("/agent/", agent.Handler()) // WebSocket, mint, LAP, MCP, client.js

	// The app's own routes.
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.HandleFunc("GET /login", s.login)
	return s, nil
}

// user is the logged-in user of r, or "".
func (s *server) user(r *http.Request) string {
	c, err := r.Cookie("session")
	if err != nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[c.Value]
}

// login is a stand-in for real authentication: /login?user=alice.
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("user")
	if u == "" || len(u) > 64 {
		http.Error(w, "login with ?user=NAME (at most 64 bytes)", http.StatusBadRequest)
		return
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.sessions[id] = u
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: "session", Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pageTmpl.Execute(w, s.user(r))
}

// The page: a todo list that declares its state and actions to lapd.js.
var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><meta charset="utf-8"><title>Todos</title>
{{if .}}<h1>{{.}}'s todos</h1>
<ul id="list"></ul>
<form id="add"><input name="title" aria-label="New task" required> <button>Add</button></form>
<script type="module">
import { createAgent } from '/agent/client.js'

let state = { todos: [] }
const listeners = new Set()
function set (next) {
  state = next
  document.getElementById('list').replaceChildren(...state.todos.map((t) => Object.assign(document.createElement('li'), { textContent: t })))
  for (const fn of listeners) fn()
}
document.getElementById('add').addEventListener('submit', (ev) => {
  ev.preventDefault()
  set({ todos: [...state.todos, ev.target.title.value] })
  ev.target.reset()
})

createAgent({
  app: { name: 'Todos', version: '1.0.0' },
  getState: () => state,
  subscribe: (fn) => { listeners.add(fn); return () => listeners.delete(fn) },
  actions: {
    add: {
      intent: 'Add a task',
      schema: { type: 'object', properties: { title: { type: 'string', minLength: 1 } }, required: ['title'], additionalProperties: false },
      handler: ({ title }) => set({ todos: [...state.todos, title] }),
    },
    clear: { intent: 'Delete every task', requiresConfirm: true, handler: () => set({ todos: [] }) },
  },
  context: (s) => ({ summary: s.todos.length + ' tasks' }),
})
</script>
{{else}}<p><a href="/login?user=alice">Log in as alice</a> to use the app.</p>{{end}}
</html>
`))
