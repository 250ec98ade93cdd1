package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// natsServer is the nats-server the cluster configurations share: built
// from its Go module (a dependency of lapd's), or $LAPD_NATS_SERVER (e.g.
// Debian's /usr/bin/nats-server). Each scenario's cluster gets its own
// --cluster-name, so buckets and streams never carry over.
type natsServer struct {
	URL  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

func startNATS(ctx context.Context) (*natsServer, error) {
	dir, err := os.MkdirTemp("", "lapbench-nats-")
	if err != nil {
		return nil, err
	}
	bin := os.Getenv("LAPD_NATS_SERVER")
	if bin == "" {
		bin = filepath.Join(dir, "nats-server")
		b := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
		if out, err := b.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("building nats-server: %v\n%s", err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	n := &natsServer{URL: "nats://127.0.0.1:" + strconv.Itoa(port), dir: dir, done: make(chan struct{})}
	n.cmd = exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "js"))
	if err := n.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = n.cmd.Wait(); close(n.done) }()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			c.Close()
			return n, nil
		}
		select {
		case <-n.done:
			os.RemoveAll(dir)
			return nil, errors.New("nats-server exited before listening")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop()
			return nil, errors.New("nats-server did not listen within 20s")
		}
	}
}

func (n *natsServer) stop() {
	_ = n.cmd.Process.Signal(os.Interrupt)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	os.RemoveAll(n.dir)
}

// startCluster runs cfg.Nodes `lapd serve --nats` nodes; the first is
// returned, the others are its peers, and the nats-server's CPU is counted
// with theirs.
func (b *bench) startCluster(ctx context.Context, cfg config, pprofOn bool) (*proc, error) {
	if b.nats == nil {
		fmt.Fprint(b.log, "(starting nats-server) ")
		n, err := startNATS(ctx)
		if err != nil {
			return nil, err
		}
		b.nats = n
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "bench" + hex.EncodeToString(rnd[:])
	var first *proc
	for i := range cfg.Nodes {
		flags := append([]string{"--nats", b.nats.URL, "--cluster-name", name, "--node-id", fmt.Sprint("n", i)}, cfg.Flags...)
		p, err := startLapd(b.bin, config{Name: cfg.Name, Flags: flags}, pprofOn)
		if err != nil {
			if first != nil {
				_ = first.stop()
			}
			return nil, err
		}
		if first == nil {
			first = p
			first.extra = []int{b.nats.cmd.Process.Pid}
		} else {
			first.peers = append(first.peers, p)
		}
	}
	return first, nil
}
