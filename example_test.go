package lapd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/lapd-dev/lapd"
)

// A whole lapd (memory stores) on a test server: mint a token, check health,
// shut down gracefully.
func ExampleNew() {
	ctx := context.Background()
	a, err := lapd.New(ctx, lapd.Config{AllowAnonymous: true})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	res, _ := http.Get(srv.URL + "/healthz")
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(string(b))

	res, _ = http.Post(srv.URL+"/agent/mint", "application/json", nil)
	res.Body.Close()
	fmt.Println("mint:", res.StatusCode)

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fmt.Println("shutdown:", a.Shutdown(sctx))
	// Output:
	// {"status":"ok","tabs":0}
	// mint: 200
	// shutdown: <nil>
}
