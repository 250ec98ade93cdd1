package lapd_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lapdtest"
)

// BenchmarkObserveAdmin is LAP /observe over loopback HTTP to a paired
// lapdtest tab (10 KiB of state), 16 callers, with the admin side (hot-path
// metrics, the audit-stream counters) off and on: the in-process floor next
// to lapbench's default-admin configuration. Interleave the two when
// comparing on a shared machine:
//
//	for i in 1 2 3 4 5; do for m in off on; do go test -run '^$' -bench "ObserveAdmin/$m" -benchtime 20000x . | grep ns/op; done; done
func BenchmarkObserveAdmin(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		b.Run(name, func(b *testing.B) {
			srv := lapdtest.NewServer(lapd.Config{Admin: lapd.AdminConfig{Enabled: on}, LAPRate: 1e9, LAPBurst: 1e9})
			defer srv.Close()
			todos := make([]map[string]any, 0, 100)
			for i := range 100 {
				todos = append(todos, map[string]any{"id": i, "title": fmt.Sprintf("task number %d of the board", i), "done": i%2 == 0})
			}
			tab, sess, err := srv.Pair(b.Context(), lapdtest.WithState(map[string]any{"todos": todos}))
			if err != nil {
				b.Fatal(err)
			}
			defer tab.Abort()
			url := srv.LAPURL() + "/observe"
			tr := &http.Transport{MaxIdleConnsPerHost: 16}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			var n atomic.Int64
			n.Store(int64(b.N))
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n.Add(-1) >= 0 {
						req, _ := http.NewRequest("POST", url, strings.NewReader(`{}`))
						req.Header.Set("Authorization", "Bearer "+sess.Token)
						res, err := hc.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != 200 {
							b.Errorf("observe: %d", res.StatusCode)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
