package lap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// state of about n bytes once encoded.
func benchState(n int) map[string]any {
	items := []any{}
	size := 0
	for i := 0; size < n; i++ {
		it := map[string]any{"id": i, "title": fmt.Sprintf("task number %d", i), "done": i%2 == 0}
		b, _ := json.Marshal(it)
		size += len(b) + 1
		items = append(items, it)
	}
	return map[string]any{"count": len(items), "todos": items}
}

// BenchmarkObserve measures LAP /observe over real loopback HTTP through a
// paired lapdtest tab, next to BenchmarkFloor: the same HTTP → WebSocket → tab
// round trip with the LAP layer removed. Compare ns/op and p50-ns in one run.
func BenchmarkObserve(b *testing.B) { benchObserve(b, false) }

// BenchmarkFloor is /observe without LAP: a bare handler that calls
// Registry.Call("observe") and writes the raw result.
func BenchmarkFloor(b *testing.B) { benchObserve(b, true) }

func benchObserve(b *testing.B, floor bool) {
	for _, size := range []int{1 << 10, 20 << 10} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("%dKB/c%d", size>>10, conc), func(b *testing.B) {
				e := newBenchEnv(b)
				token, tid := e.mintB(b)
				st := benchState(size)
				raw, _ := json.Marshal(map[string]any{"state": st, "actions": []any{}, "context": nil})
				tab, err := lapdtest.Dial(context.Background(), e.srv.URL+"/agent/ws", token, lapdtest.WithoutLogAppend(),
					lapdtest.WithHandler("observe", func(json.RawMessage) (any, *lapdtest.RPCError) { return json.RawMessage(raw), nil }))
				if err != nil {
					b.Fatal(err)
				}
				defer tab.Abort()
				url := e.srv.URL + "/agent/lap/v1/observe"
				if floor {
					fl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						res, err := e.reg.Call(r.Context(), tid, "observe", json.RawMessage(`{}`), 0)
						if err != nil {
							http.Error(w, err.Error(), 500)
							return
						}
						w.Header().Set("Content-Type", "application/json")
						_, _ = w.Write(res)
					}))
					defer fl.Close()
					url = fl.URL
				}
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				defer client.CloseIdleConnections()
				one := func() time.Duration {
					start := time.Now()
					req, _ := http.NewRequest("POST", url, nil)
					req.Header.Set("Authorization", "Bearer "+token)
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return 0
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
					}
					return time.Since(start)
				}
				one() // warm the connection and caches
				lat := make([]time.Duration, b.N)
				var next sync.Mutex
				i := 0
				var wg sync.WaitGroup
				b.ResetTimer()
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							next.Lock()
							k := i
							i++
							next.Unlock()
							if k >= b.N {
								return
							}
							lat[k] = one()
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			})
		}
	}
}

type benchEnv struct {
	*env
}

func newBenchEnv(b *testing.B) benchEnv {
	// newEnv takes a *testing.T; benchmarks share its Cleanup semantics via testing.TB.
	e := newEnvTB(b, func(c *envCfg) { c.lap.LAPRate = 1e9; c.lap.LAPBurst = 1 << 30 })
	return benchEnv{e}
}

func (e benchEnv) mintB(b *testing.B) (string, string) {
	req, _ := http.NewRequest("POST", e.srv.URL+"/agent/mint", bytes.NewReader(nil))
	res, err := e.srv.Client().Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	if !strings.HasPrefix(fmt.Sprint(m["token"]), "agt_") {
		b.Fatalf("mint: %v", m)
	}
	return m["token"].(string), m["tid"].(string)
}
