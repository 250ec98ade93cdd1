package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// `lapbench link-shapes` compares the two shapes a link between cluster
// nodes can take, with the sizes of a forwarded /observe (a 200-byte
// request, a 10 KiB reply) between two processes on loopback:
//
//	per-conn  one request at a time per connection, the requesting goroutine
//	          writing and reading itself, the serving goroutine of the
//	          connection reading, serving and writing (pairing's peer link)
//	mux       one connection, requests and replies tagged with an id; each
//	          side writes through a write-combining buffer (whoever finds it
//	          idle writes what is queued, others' frames included) and reads
//	          on a goroutine of its own that hands each frame over (a request
//	          to a new goroutine, a reply to its waiting caller)
//
// The server "serves" a request with one hand-off to another goroutine and
// back (the owner waiting for its tab). It prints round trips per second
// and the CPU per round trip of each process, at 1 and 16 concurrent
// callers, twice, alternating. Run: go run ./cmd/lapbench link-shapes
//
// The mux shape could share syscalls and wake-ups under load; measured, its
// hand-offs cost more than it shares (docs/PERFORMANCE.md).

const (
	shapeReq, shapeRep = 200, 10 << 10
	shapeHdr           = 12 // u32 length (after itself) | u64 id
)

func linkShapes(out io.Writer) error { return linkShapesFor(out, 3*time.Second) }

// linkShapesFor measures each shape for d.
func linkShapesFor(out io.Writer, d time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv := exec.Command(self, "link-shapes-server")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var addrs [2]string // per-conn, mux
	if _, err := fmt.Fscan(stdout, &addrs[0], &addrs[1]); err != nil {
		return fmt.Errorf("link-shapes-server did not say where it listens: %w", err)
	}
	fmt.Fprintln(out, "| shape | callers | round trips/s | server CPU µs/rt | client CPU µs/rt |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: |")
	for range 2 {
		for _, conc := range []int{1, 16} {
			for i, shape := range []string{"per-conn", "mux"} {
				s0, err := procCPUTime(srv.Process.Pid)
				if err != nil {
					return err
				}
				c0, _ := procCPUTime(os.Getpid())
				start := time.Now()
				var n int
				if i == 0 {
					n, err = shapeClientPerConn(addrs[0], conc, d)
				} else {
					n, err = shapeClientMux(addrs[1], conc, d)
				}
				if err != nil {
					return err
				}
				el := time.Since(start)
				s1, _ := procCPUTime(srv.Process.Pid)
				c1, _ := procCPUTime(os.Getpid())
				fmt.Fprintf(out, "| %s | %d | %.0f | %.2f | %.2f |\n", shape, conc, float64(n)/el.Seconds(),
					float64((s1-s0).Microseconds())/float64(n), float64((c1-c0).Microseconds())/float64(n))
			}
		}
	}
	return nil
}

// procCPUTime is utime+stime of pid from /proc (clock ticks of 10 ms).
func procCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// linkShapesServer listens for both shapes and prints the two addresses.
func linkShapesServer() error {
	work := make(chan chan struct{}, 64)
	for range 2 {
		go func() {
			for c := range work {
				c <- struct{}{}
			}
		}()
	}
	serve := func() { // the owner waiting for its tab
		c := make(chan struct{}, 1)
		work <- c
		<-c
	}
	l1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(l1.Addr(), l2.Addr())
	go func() {
		for {
			c, err := l1.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReaderSize(c, 16<<10)
				rep := shapeFrame(0, shapeRep)
				body := make([]byte, 1<<16)
				for {
					id, err := readShapeFrame(br, body)
					if err != nil {
						return
					}
					serve()
					binary.BigEndian.PutUint64(rep[4:], id)
					if _, err := c.Write(rep); err != nil {
						return
					}
				}
			}()
		}
	}()
	for {
		c, err := l2.Accept()
		if err != nil {
			return err
		}
		go func() {
			br := bufio.NewReaderSize(c, 64<<10)
			w := &combiner{c: c}
			body := make([]byte, 1<<16)
			for {
				id, err := readShapeFrame(br, body)
				if err != nil {
					return
				}
				go func() {
					serve()
					w.send(shapeFrame(id, shapeRep))
				}()
			}
		}()
	}
}

func shapeFrame(id uint64, n int) []byte {
	f := make([]byte, shapeHdr+n)
	binary.BigEndian.PutUint32(f, uint32(8+n))
	binary.BigEndian.PutUint64(f[4:], id)
	return f
}

func readShapeFrame(br *bufio.Reader, body []byte) (uint64, error) {
	var h [shapeHdr]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint32(h[:])) - 8
	if n < 0 || n > len(body) {
		return 0, errors.New("bad frame")
	}
	_, err := io.ReadFull(br, body[:n])
	return binary.BigEndian.Uint64(h[4:]), err
}

// combiner writes frames to c; a sender that finds no write under way
// writes everything queued meanwhile too.
type combiner struct {
	mu      sync.Mutex
	c       net.Conn
	buf     []byte
	writing bool
}

func (w *combiner) send(f []byte) {
	w.mu.Lock()
	w.buf = append(w.buf, f...)
	if w.writing {
		w.mu.Unlock()
		return
	}
	w.writing = true
	for len(w.buf) > 0 {
		out := w.buf
		w.buf = nil
		w.mu.Unlock()
		_, _ = w.c.Write(out)
		w.mu.Lock()
	}
	w.writing = false
	w.mu.Unlock()
}

func shapeClientPerConn(addr string, conc int, d time.Duration) (int, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total, stop := 0, time.Now().Add(d)
	var first error
	for range conc {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				mu.Lock()
				first = err
				mu.Unlock()
				return
			}
			defer c.Close()
			br := bufio.NewReaderSize(c, 16<<10)
			req, body := shapeFrame(0, shapeReq), make([]byte, 1<<16)
			n := 0
			for time.Now().Before(stop) {
				if _, err := c.Write(req); err != nil {
					break
				}
				if _, err := readShapeFrame(br, body); err != nil {
					break
				}
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, first
}

func shapeClientMux(addr string, conc int, d time.Duration) (int, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	w := &combiner{c: c}
	var mu sync.Mutex
	waiting := map[uint64]chan struct{}{}
	go func() {
		br := bufio.NewReaderSize(c, 64<<10)
		body := make([]byte, 1<<16)
		for {
			id, err := readShapeFrame(br, body)
			if err != nil {
				return
			}
			mu.Lock()
			ch := waiting[id]
			delete(waiting, id)
			mu.Unlock()
			if ch != nil {
				ch <- struct{}{}
			}
		}
	}()
	var wg sync.WaitGroup
	var next uint64
	total, stop := 0, time.Now().Add(d)
	for range conc {
		wg.Go(func() {
			ch := make(chan struct{}, 1)
			n := 0
			for time.Now().Before(stop) {
				mu.Lock()
				next++
				id := next
				waiting[id] = ch
				mu.Unlock()
				w.send(shapeFrame(id, shapeReq))
				select {
				case <-ch:
					n++
				case <-time.After(5 * time.Second):
					return
				}
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, nil
}
