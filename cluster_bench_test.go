package lapd_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
)

// BenchmarkClusterObserve is LAP /observe, one caller, with the tab on node
// A and the call made on A (local) or on B (forwarded over an in-process
// NATS server): the forwarder's own cost, for profiling. lapbench's
// nats-local / nats-cross configurations measure the real binaries.
//
//	go test -run '^$' -bench ClusterObserve -cpuprofile cpu.out .
func BenchmarkClusterObserve(b *testing.B) {
	ns := natstest.Start(b)
	for _, where := range []string{"local", "cross"} {
		b.Run(where, func(b *testing.B) {
			name := fmt.Sprintf("bench%d", clusterN.Add(1))
			var nodes [2]*lapdtest.Server
			for i := range nodes {
				nodes[i] = lapdtest.NewServer(lapd.Config{NATSConn: ns.Connect(b), ClusterName: name, NodeID: fmt.Sprint("n", i), LAPRate: 1e9, LAPBurst: 1e9})
				defer nodes[i].Close()
			}
			tab, sess, err := nodes[0].Pair(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			defer tab.Abort()
			url := nodes[0].LAPURL() + "/observe"
			if where == "cross" {
				url = nodes[1].LAPURL() + "/observe"
			}
			hc := &http.Client{}
			f0 := nodes[1].Lapd.Stats().Pairing.Cluster.Forwarded
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer "+sess.Token)
				res, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					b.Fatalf("observe: %d", res.StatusCode)
				}
			}
			b.ReportMetric(float64(nodes[1].Lapd.Stats().Pairing.Cluster.Forwarded-f0)/float64(b.N), "hops/op")
		})
	}
}
