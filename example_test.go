package lapd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lap"
)

// lapd mounted in a plain http.ServeMux, next to the app's own routes.
func ExampleNew() {
	ctx := context.Background()
	srv, err := lapd.New(ctx, lapd.Config{AllowAnonymous: true}) // memory stores
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `<script type="module">import { createAgent } from '/agent/client.js' …</script>`)
	})
	mux.Handle("/agent/", srv.Handler()) // WebSocket, mint, LAP, MCP, client.js
	mux.Handle("GET /healthz", srv.Handler())
	hs := httptest.NewServer(mux) // your http.Server
	defer hs.Close()

	res, _ := http.Get(hs.URL + "/healthz")
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(string(b))

	res, _ = http.Post(hs.URL+"/agent/mint", "application/json", nil)
	res.Body.Close()
	fmt.Println("mint:", res.StatusCode)

	res, _ = http.Get(hs.URL + "/agent/client.js")
	res.Body.Close()
	fmt.Println("client.js:", res.StatusCode)

	// On the way down: lapd first (tabs reconnect to the next process),
	// then your http.Server.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fmt.Println("shutdown:", srv.Shutdown(sctx))
	// Output:
	// {"status":"ok","tabs":0}
	// mint: 200
	// client.js: 200
	// shutdown: <nil>
}

// Only your app's logged-in users may mint: the identity resolver reads the
// app's own session, so no JWT plumbing is needed.
func ExampleConfig_identity() {
	sessions := map[string]string{"s3cr3t": "alice"} // your app's session table
	identity := lap.IdentityFunc(func(r *http.Request) (string, error) {
		c, err := r.Cookie("session")
		if err != nil {
			return "", nil // not logged in: anonymous, and mint answers 401
		}
		return sessions[c.Value], nil
	})
	srv, err := lapd.New(context.Background(), lapd.Config{Identity: identity})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown(context.Background())
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	for _, cookie := range []string{"", "session=s3cr3t"} {
		req, _ := http.NewRequest("POST", hs.URL+"/agent/mint", strings.NewReader("{}"))
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		res, _ := http.DefaultClient.Do(req)
		res.Body.Close()
		fmt.Printf("mint with %q: %d\n", cookie, res.StatusCode)
	}
	// Output:
	// mint with "": 401
	// mint with "session=s3cr3t": 200
}

// The operator's side on a listener of its own: Prometheus metrics, pprof,
// health and the admin console. Without a token only loopback clients are
// served (an httptest server is one).
func ExampleServer_AdminHandler() {
	ctx := context.Background()
	srv, err := lapd.New(ctx, lapd.Config{AllowAnonymous: true, Admin: lapd.AdminConfig{Enabled: true}})
	if err != nil {
		panic(err)
	}
	admin := httptest.NewServer(srv.AdminHandler()) // e.g. 127.0.0.1:9090, never the public listener
	defer admin.Close()

	res, _ := http.Get(admin.URL + "/metrics")
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println("metrics:", res.StatusCode, strings.Contains(string(b), "lapd_tabs_connected 0"))

	res, _ = http.Get(admin.URL + "/admin/")
	res.Body.Close()
	fmt.Println("console:", res.StatusCode)

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	// Output:
	// metrics: 200 true
	// console: 200
}
