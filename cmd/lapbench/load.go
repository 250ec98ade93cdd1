package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// op is one request an agent makes; it returns an error for anything but
// the expected answer.
type op func(ctx context.Context, buf *bytes.Buffer) error

// measured is what one load phase produced.
type measured struct {
	N       int // calls completed in the measured window
	All     int // calls completed from the start of the warm-up to the end (for per-call ratios of counters)
	Errors  int
	FirstEr string
	Elapsed time.Duration
	Lat     []time.Duration // sorted
	CPU     time.Duration   // server CPU during the phase
	Client  time.Duration   // lapbench's own CPU (agents and tabs) during the phase
	Parts   []time.Duration // CPU by process (proc.cpuParts) during the phase
}

func (m measured) rate() float64 {
	if m.Elapsed <= 0 {
		return 0
	}
	return float64(m.N) / m.Elapsed.Seconds()
}

func (m measured) pct(p float64) time.Duration {
	if len(m.Lat) == 0 {
		return 0
	}
	i := int(float64(len(m.Lat)-1) * p)
	return m.Lat[i]
}

// drive runs ops (one per agent) concurrently: warm first (not recorded),
// then for d, recording each call's latency and the server's CPU time.
func drive(ctx context.Context, p *proc, ops []op, warm, d time.Duration) measured {
	type agentOut struct {
		lat    []time.Duration
		errs   int
		first  string
		counts int
	}
	outs := make([]agentOut, len(ops))
	var startWG, doneWG sync.WaitGroup
	startGate := make(chan struct{})
	var stopAt time.Time
	var mu sync.Mutex
	measureFrom := time.Time{}
	for i, o := range ops {
		startWG.Add(1)
		doneWG.Add(1)
		go func() {
			defer doneWG.Done()
			var buf bytes.Buffer
			startWG.Done()
			<-startGate
			mu.Lock()
			from, until := measureFrom, stopAt
			mu.Unlock()
			out := &outs[i]
			out.lat = make([]time.Duration, 0, 1<<16)
			for {
				t0 := time.Now()
				if t0.After(until) || ctx.Err() != nil {
					return
				}
				err := o(ctx, &buf)
				t1 := time.Now()
				out.counts++
				if t0.Before(from) {
					continue // warm-up
				}
				if t1.After(until) {
					return
				}
				if err != nil {
					out.errs++
					if out.first == "" {
						out.first = err.Error()
					}
					continue
				}
				out.lat = append(out.lat, t1.Sub(t0))
			}
		}()
	}
	startWG.Wait()
	now := time.Now()
	mu.Lock()
	measureFrom, stopAt = now.Add(warm), now.Add(warm+d)
	mu.Unlock()
	close(startGate)
	time.Sleep(time.Until(measureFrom))
	cpu0, _ := p.cpu()
	parts0 := p.cpuParts()
	self0, _ := cpuOf("self")
	t0 := time.Now()
	time.Sleep(time.Until(stopAt))
	cpu1, _ := p.cpu()
	parts1 := p.cpuParts()
	self1, _ := cpuOf("self")
	elapsed := time.Since(t0)
	doneWG.Wait()
	var m measured
	for _, o := range outs {
		m.All += o.counts
		m.Lat = append(m.Lat, o.lat...)
		m.Errors += o.errs
		if m.FirstEr == "" {
			m.FirstEr = o.first
		}
	}
	slices.Sort(m.Lat)
	m.N = len(m.Lat)
	m.Elapsed = elapsed
	m.CPU = cpu1 - cpu0
	m.Client = self1 - self0
	if len(parts0) == len(parts1) {
		for i := range parts1 {
			m.Parts = append(m.Parts, parts1[i]-parts0[i])
		}
	}
	return m
}

// httpClient is a keep-alive client with one idle connection per agent.
func httpClient(agents int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        agents * 2,
		MaxIdleConnsPerHost: agents * 2,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}, Timeout: 30 * time.Second}
}

// postOp POSTs body to url with a bearer and expects 200 with a body.
func postOp(hc *http.Client, url, token string, body []byte) op {
	return func(ctx context.Context, buf *bytes.Buffer) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		buf.Reset()
		_, err = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			b := buf.Bytes()
			if len(b) > 200 {
				b = b[:200]
			}
			return fmt.Errorf("%w %d: %s", errStatus, resp.StatusCode, b)
		}
		if buf.Len() == 0 {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
}
