package pairing

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/tokens"
)

// TestIdleTabMemoryCluster compares, in one run, what an idle paired tab
// costs a node on its own (memory token store) and a cluster node (NATS
// token store replica + the tab's subscription). The NATS server runs in
// the child process with the tabs, so only lapd's side is counted. The
// baseline is taken before minting, so both figures include the token
// record.
//
//	LAPD_MEMBENCH=1 go test -run IdleTabMemoryCluster -v ./pairing
func TestIdleTabMemoryCluster(t *testing.T) {
	if os.Getenv("LAPD_MEMBENCH_CHILD") != "" {
		if os.Getenv("LAPD_MEMBENCH_NATS") != "" {
			natsChild(t)
		}
		return
	}
	if os.Getenv("LAPD_MEMBENCH") == "" {
		t.Skip("set LAPD_MEMBENCH=1 to measure idle tab memory")
	}
	const n = 5000
	per := map[string]float64{}
	for _, mode := range []string{"single", "nats"} {
		t.Run(mode, func(t *testing.T) {
			// The child: with nats it first runs a NATS server and names it.
			run := "^TestIdleTabMemory$" // memChild
			if mode == "nats" {
				run = "^TestIdleTabMemoryCluster$" // natsChild
			}
			cmd := exec.Command(os.Args[0], "-test.run="+run)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			rd := bufio.NewReader(stdout)
			var nc *nats.Conn
			mod := func(*Config, *tokens.Config) {}
			if mode == "nats" {
				cmd.Env = append(os.Environ(), "LAPD_MEMBENCH_CHILD=pending", "LAPD_MEMBENCH_NATS=1")
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				line, err := rd.ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "nats ") {
					t.Fatalf("child: %q %v", line, err)
				}
				if nc, err = nats.Connect(strings.TrimSpace(strings.TrimPrefix(line, "nats "))); err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				st, err := tokens.OpenNATS(t.Context(), nc, "mem")
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				mod = func(c *Config, tc *tokens.Config) { tc.Store, c.Cluster = st, nc }
			}
			before := memNow()
			e := newEnv(t, mod)
			var paired atomic.Int64
			allPaired := make(chan struct{})
			e.reg.SetHooks(Hooks{OnPaired: func(string, bool) {
				if paired.Add(1) == n {
					close(allPaired)
				}
			}})
			toks := make([]string, n)
			for i := range toks {
				toks[i], _ = e.mint("")
			}
			if mode == "single" {
				cmd.Env = append(os.Environ(), "LAPD_MEMBENCH_CHILD="+e.url())
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
			}
			w := bufio.NewWriter(stdin)
			if mode == "nats" {
				fmt.Fprintln(w, e.url())
			}
			for _, tok := range toks {
				fmt.Fprintln(w, tok)
			}
			fmt.Fprintln(w)
			w.Flush()
			if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
				t.Fatalf("child: %q %v", line, err)
			}
			recv(t, allPaired)
			// Once idle for a tick, readers park (Linux): measure then, so
			// that both modes are compared in the same state.
			if runtime.GOOS == "linux" {
				deadline := time.Now().Add(30 * time.Second)
				for e.reg.Stats().ParkedTabs < n && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond) // polling a counter, not synchronisation
				}
			}
			after := memNow()
			if p := os.Getenv("LAPD_MEMBENCH_PROFILE"); p != "" {
				f, _ := os.Create(p + "." + mode)
				_ = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
			t.Logf("%s: goroutines %d, parked tabs %d", mode, runtime.NumGoroutine(), e.reg.Stats().ParkedTabs)
			per[mode] = float64(after.total-before.total) / 1024 / n
			t.Logf("%s: %d idle tabs, lapd heap+stack %.2f KiB per tab (heap %.2f, stack %.2f; token record included), owned subscriptions %d",
				mode, n, per[mode], float64(after.heap-before.heap)/1024/n, float64(after.stack-before.stack)/1024/n, e.reg.Stats().Cluster.Owned)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.reg.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			stdin.Close()
			_ = cmd.Wait()
		})
	}
	t.Logf("--nats adds %.2f KiB per idle paired tab (target ≤ 2 KiB)", per["nats"]-per["single"])
}

// natsChild runs a NATS server, names it on stdout, then plays memChild
// with the WebSocket URL read first from stdin.
func natsChild(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	defer s.Shutdown()
	fmt.Println("nats " + s.ClientURL())
	in := bufio.NewReader(os.Stdin)
	url, _ := in.ReadString('\n')
	os.Setenv("LAPD_MEMBENCH_CHILD", strings.TrimSpace(url))
	memChildFrom(t, in)
}
