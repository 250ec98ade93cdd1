package pairing

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// answerLoop makes tb a fake tab that answers every rpc with result, reading
// only the id (as a browser would, it does not care about the rest).
func answerLoop(ws *websocket.Conn, result []byte) {
	for {
		_, b, err := ws.Read(context.Background())
		if err != nil {
			return
		}
		var f struct {
			T  string `json:"t"`
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &f) != nil || f.T != "rpc" {
			continue
		}
		reply := make([]byte, 0, len(result)+80)
		reply = append(reply, `{"t":"rpc-reply","id":"`...)
		reply = append(reply, f.ID...)
		reply = append(reply, `","result":`...)
		reply = append(reply, result...)
		reply = append(reply, '}')
		if ws.Write(context.Background(), websocket.MessageText, reply) != nil {
			return
		}
	}
}

// result returns a JSON object of about n bytes.
func result(n int) []byte {
	return []byte(`{"state":{"blob":"` + strings.Repeat("x", n-24) + `"}}`)
}

// answeringTab pairs a tab on e that answers every rpc with a result of
// about size bytes, and returns its tid.
func answeringTab(b *testing.B, e *env, size int) string {
	b.Helper()
	tok, tid := e.mint("")
	ws, _, err := e.dialRaw(tok, dialOpts{})
	if err != nil {
		b.Fatal(err)
	}
	ws.SetReadLimit(-1)
	if err := ws.Write(context.Background(), websocket.MessageText, []byte(`{"t":"hello","appName":"b","schemaHash":"h"}`)); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); answerLoop(ws, result(size)) }()
	b.Cleanup(func() { ws.CloseNow(); <-done })
	recv(b, e.paired)
	return tid
}

func BenchmarkCall(b *testing.B) {
	for _, size := range []int{1 << 10, 20 << 10} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("result=%dKB/callers=%d", size>>10, callers), func(b *testing.B) {
				e := newEnv(b, nil)
				tid := answeringTab(b, e, size)

				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				per := (b.N + callers - 1) / callers
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range per {
							if _, err := e.reg.Call(context.Background(), tid, "get_state", nil, 0); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// TestIdleTabMemory pairs idle tabs and reports the server's heap+stack
// bytes per tab: 200 tabs in a normal run (it never skips, also not under
// CI), 1,000 and 10,000 with LAPD_MEMBENCH=1 go test -run IdleTabMemory -v.
// The tabs run in a child process (this test binary re-executed), so the
// figure is the server side only and the 20,000 open-file limit holds. It
// checks what does not depend on timing: every tab pairs, and the server
// keeps at most about one goroutine per tab.
func TestIdleTabMemory(t *testing.T) {
	if os.Getenv("LAPD_MEMBENCH_CHILD") != "" {
		memChild(t)
		return
	}
	sizes := []int{200}
	if os.Getenv("LAPD_MEMBENCH") != "" {
		sizes = []int{1000, 10000}
	}
	for _, n := range sizes {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			e := newEnv(t, nil)
			var paired atomic.Int64
			allPaired := make(chan struct{})
			e.reg.SetHooks(Hooks{OnPaired: func(string, bool) {
				if paired.Add(1) == int64(n) {
					close(allPaired)
				}
			}})
			toks := make([]string, n)
			for i := range toks {
				toks[i], _ = e.mint("")
			}
			before := memNow()
			cmd := exec.Command(os.Args[0], "-test.run=^TestIdleTabMemory$")
			cmd.Env = append(os.Environ(), "LAPD_MEMBENCH_CHILD="+e.url())
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w := bufio.NewWriter(stdin)
			for _, tok := range toks {
				fmt.Fprintln(w, tok)
			}
			fmt.Fprintln(w)
			w.Flush()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "ready") {
				t.Fatalf("child: %q %v", line, err)
			}
			recv(t, allPaired)
			after := memNow()
			g := runtime.NumGoroutine()
			if s := e.reg.Stats(); s.ActiveTabs != n {
				t.Fatalf("ActiveTabs %d", s.ActiveTabs)
			}
			if float64(g) > 1.1*float64(n)+50 {
				t.Errorf("%d goroutines for %d idle tabs: more than one each", g, n)
			}
			t.Logf("%d idle tabs: server heap+stack %.1f KiB per tab (heap %.1f, stack %.1f), %.2f goroutines per tab",
				n, float64(after.total-before.total)/1024/float64(n), float64(after.heap-before.heap)/1024/float64(n),
				float64(after.stack-before.stack)/1024/float64(n), float64(g)/float64(n))
			// Once idle for a tick, readers park (Linux): measure again.
			if runtime.GOOS == "linux" {
				deadline := time.Now().Add(30 * time.Second)
				for e.reg.Stats().ParkedTabs < n && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond) // polling a counter, not synchronisation
				}
				parked := memNow()
				t.Logf("%d idle tabs, %d parked: server heap+stack %.1f KiB per tab (heap %.1f, stack %.1f), %d goroutines",
					n, e.reg.Stats().ParkedTabs, float64(parked.total-before.total)/1024/float64(n), float64(parked.heap-before.heap)/1024/float64(n),
					float64(parked.stack-before.stack)/1024/float64(n), runtime.NumGoroutine())
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.reg.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("Shutdown with %d tabs took %v", n, time.Since(start).Round(time.Millisecond))
			stdin.Close()
			_ = cmd.Wait()
		})
	}
}

type memFig struct{ heap, stack, total int64 }

func memNow() memFig {
	for range 5 { // stacks shrink by half per GC
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memFig{heap: int64(m.HeapAlloc), stack: int64(m.StackInuse), total: int64(m.HeapAlloc + m.StackInuse)}
}

// memChild dials one tab per token read from stdin, says hello, prints
// "ready" once every hello-ack has arrived and holds the sockets until stdin
// closes.
func memChild(t *testing.T) { memChildFrom(t, os.Stdin) }

func memChildFrom(t *testing.T, r io.Reader) {
	url := os.Getenv("LAPD_MEMBENCH_CHILD")
	in := bufio.NewScanner(r)
	var toks []string
	for in.Scan() && in.Text() != "" {
		toks = append(toks, in.Text())
	}
	var wg sync.WaitGroup
	conns := make([]*websocket.Conn, len(toks))
	sem := make(chan struct{}, 64)
	for i, tok := range toks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ws, _, err := websocket.Dial(ctx, url+"?token="+tok, nil)
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = ws
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"t":"hello","appName":"m","schemaHash":"h","lapVersion":2}`))
			if _, _, err := ws.Read(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("ready")
	for _, ws := range conns {
		if ws != nil {
			go func() { // keep reading so pings are answered
				for {
					if _, _, err := ws.Read(context.Background()); err != nil {
						return
					}
				}
			}()
		}
	}
	for in.Scan() {
	}
	for _, ws := range conns {
		if ws != nil {
			ws.CloseNow()
		}
	}
}

// BenchmarkClusterCall is BenchmarkCall made on a node that does not hold
// the tab (two registries on an in-process NATS server, the call on the
// peer link): the allocations per call are both nodes' together.
//
//	go test ./pairing -run XXX -bench ClusterCall -benchmem
func BenchmarkClusterCall(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("result=10KB/callers=%d", callers), func(b *testing.B) {
			es := clusterEnvs(b, 2, viaPeer)
			a, c := es[0], es[1]
			tid := answeringTab(b, a, 10<<10)
			if paired, _, err := c.reg.Admit(context.Background(), tid); !paired || err != nil { // learns the owner's link
				b.Fatalf("Admit: %v %v", paired, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + callers - 1) / callers
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithCancel(context.Background()) // as an HTTP request's
					defer cancel()
					for range per {
						res, err := c.reg.CallReply(ctx, tid, "get_state", nil, 0)
						if err != nil {
							b.Error(err)
							return
						}
						res.Release()
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if st := c.reg.Stats().Cluster; st.Direct < int64(b.N) {
				b.Fatalf("%d calls went on the peer link, want all %d", st.Direct, b.N)
			}
		})
	}
}
