package lapd

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkPerimeter is the cost the perimeter (Host check, body read
// deadline) adds to a small POST over real loopback HTTP, against the same
// handler without it (the floor), in the same run.
func BenchmarkPerimeter(b *testing.B) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{
		{"floor", next},
		{"perimeter", newPerimeter(next, nil, 0, nil)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			c := srv.Client()
			body := `{"msg":{"type":"addTodo","title":"Buy milk"}}`
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := c.Post(srv.URL+"/agent/lap/v1/message", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			})
		})
	}
}
