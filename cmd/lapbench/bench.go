package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type bench struct {
	nats *natsServer // started for the first cluster configuration
	o    options
	bin  string
	self string
	res  *results
	log  io.Writer
}

// scenario runs one scenario against a fresh server of configuration cn.
func (b *bench) scenario(ctx context.Context, sc scenario, cn string) (Result, error) {
	var p *proc
	var err error
	if sc.Kind == "floor" {
		p, err = startProc(b.self, []string{"floor-server"}, "")
	} else {
		// Idle scenarios start the profiler listener to trigger the GC the
		// runtime would otherwise run within two minutes (see idle).
		if cfg := configs[cn]; cfg.Nodes > 1 {
			p, err = b.startCluster(ctx, cfg, b.o.profileDir != "" || sc.Kind == "idle")
		} else {
			p, err = startLapd(b.bin, cfg, b.o.profileDir != "" || sc.Kind == "idle")
		}
	}
	if err != nil {
		return Result{}, err
	}
	var out Result
	if sc.Kind == "idle" {
		out, err = b.idle(ctx, p, sc.Agents)
	} else {
		out, err = b.load(ctx, p, sc, cn)
	}
	if serr := p.stop(); serr != nil && err == nil {
		err = serr
	}
	return out, err
}

// load pairs one tab per agent and drives the scenario's op.
func (b *bench) load(ctx context.Context, p *proc, sc scenario, cn string) (Result, error) {
	hc := httpClient(sc.Agents)
	defer hc.CloseIdleConnections()
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var tabs []*tab
	defer func() {
		for _, t := range tabs {
			t.close()
		}
	}()
	ops := make([]op, sc.Agents)
	for i := range ops {
		var m mintResp
		if sc.Kind == "floor" {
			var rnd [16]byte
			_, _ = rand.Read(rnd[:])
			m = mintResp{Token: hex.EncodeToString(rnd[:]), WSURL: "ws" + strings.TrimPrefix(p.URL, "http") + "/ws"}
		} else {
			var err error
			if m, err = mint(setup, hc, p.URL); err != nil {
				return Result{}, err
			}
		}
		t, err := dialTab(setup, m.WSURL, m.Token, m.TabSecret, b.res)
		if err != nil {
			return Result{}, err
		}
		tabs = append(tabs, t)
		base := p.URL
		if configs[cn].Cross && len(p.peers) > 0 {
			// The tab is on node A (p); the agent calls node B.
			base = p.peers[0].URL
			rest, ok := strings.CutPrefix(m.LapURL, p.URL)
			if !ok {
				return Result{}, fmt.Errorf("lapUrl %q is not on node A (%s)", m.LapURL, p.URL)
			}
			m.LapURL = base + rest
		}
		switch sc.Kind {
		case "floor":
			ops[i] = postOp(hc, p.URL+"/call", m.Token, []byte(`{}`))
		case "observe":
			ops[i] = postOp(hc, m.LapURL+"/observe", m.Token, []byte(`{}`))
		case "message":
			ops[i] = postOp(hc, m.LapURL+"/message", m.Token, []byte(messageBody))
		case "mcp", "mcpraw":
			a, err := dialMCP(setup, base, m, sc.Agents)
			if err != nil {
				return Result{}, err
			}
			defer a.c.Close()
			if sc.Kind == "mcpraw" {
				ops[i] = a.rawObserveOp(hc, p.URL+"/agent/mcp")
			} else {
				ops[i] = a.observeOp()
			}
		}
	}
	var prof sync.WaitGroup
	var profErr error
	if b.o.profileDir != "" && p.pprof != "" {
		// Every node of a cluster, at once: <scenario>-<config>-n<i>.
		nodes := append([]*proc{p}, p.peers...)
		var mu sync.Mutex
		for i, q := range nodes {
			name := sc.Name + "-" + cn
			if len(nodes) > 1 {
				name += fmt.Sprint("-n", i)
			}
			prof.Add(1)
			go func() {
				defer prof.Done()
				time.Sleep(b.o.warm)
				secs := int(b.o.d / time.Second)
				if secs < 1 {
					secs = 1
				}
				if err := q.profile(ctx, b.o.profileDir, name, secs); err != nil {
					mu.Lock()
					profErr = errors.Join(profErr, err)
					mu.Unlock()
				}
			}()
		}
	}
	lines0 := p.settledAuditLines() // the set-up's lines (mint, claim) are written asynchronously
	mallocs0 := p.mallocs(ctx)
	m := drive(ctx, p, ops, b.o.warm, b.o.d)
	mallocs1 := p.mallocs(ctx)
	lines1 := p.settledAuditLines()
	prof.Wait()
	if profErr != nil {
		fmt.Fprintln(b.log, "profile:", profErr)
	}
	rss, _ := p.rss()
	out := Result{Agents: sc.Agents, Requests: m.N, Errors: m.Errors, FirstErr: m.FirstEr, Seconds: m.Elapsed.Seconds(),
		ReqPerS: m.rate(), P50us: us(m.pct(0.50)), P90us: us(m.pct(0.90)), P99us: us(m.pct(0.99)), RSSMiB: float64(rss) / (1 << 20)}
	if m.N > 0 {
		out.CPUms = float64(m.CPU.Microseconds()) / 1e3 / float64(m.N)
		out.ClientCPUms = float64(m.Client.Microseconds()) / 1e3 / float64(m.N)
		if len(m.Parts) > 1 {
			var parts []string
			for i, d := range m.Parts {
				ms := float64(d.Microseconds()) / 1e3 / float64(m.N)
				out.CPUPartsMs = append(out.CPUPartsMs, ms)
				who := fmt.Sprint("n", i)
				if i > len(p.peers) {
					who = "nats-server"
				}
				parts = append(parts, fmt.Sprintf("%s %.3f", who, ms))
			}
			fmt.Fprintf(b.log, "(server CPU ms/req by process: %s) ", strings.Join(parts, ", "))
		}
		// Lines are counted over the whole drive, warm-up included, and so
		// are the calls they are divided by.
		out.AuditPerReq = float64(lines1-lines0) / float64(m.All)
		if mallocs0 > 0 && mallocs1 > mallocs0 {
			// with -profile: heap objects over the drive (warm-up included),
			// per call, like the audit lines
			out.AllocsPerReq = float64(mallocs1-mallocs0) / float64(m.All)
		}
	}
	return out, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// idle mints n tokens, reads RSS, pairs n idle tabs, reads RSS again.
func (b *bench) idle(ctx context.Context, p *proc, n int) (Result, error) {
	hc := httpClient(64)
	defer hc.CloseIdleConnections()
	setup, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	mints := make([]mintResp, n)
	if err := parallel(setup, n, 32, func(i int) error {
		var err error
		mints[i], err = mint(setup, hc, p.URL)
		return err
	}); err != nil {
		return Result{}, err
	}
	hc.CloseIdleConnections()
	rss0 := settledRSS(setup, p, b.o.settle)
	rss0gc := p.rssAfterGC(setup)
	tabs := make([]*tab, n)
	defer func() {
		_ = parallel(context.Background(), n, 256, func(i int) error {
			if tabs[i] != nil {
				tabs[i].close()
			}
			return nil
		})
	}()
	if err := parallel(setup, n, 64, func(i int) error {
		var err error
		tabs[i], err = dialTab(setup, mints[i].WSURL, mints[i].Token, mints[i].TabSecret, b.res)
		return err
	}); err != nil {
		return Result{}, err
	}
	rss1 := settledRSS(setup, p, b.o.settle)
	rss1gc := p.rssAfterGC(setup)
	if b.o.profileDir != "" && p.pprof != "" {
		if err := p.heapProfile(ctx, b.o.profileDir, fmt.Sprintf("idle-%d-%s", n, p.config)); err != nil {
			fmt.Fprintln(b.log, "heap profile:", err)
		}
	}
	cpu0, _ := p.cpu()
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	cpu1, _ := p.cpu()
	return Result{Tabs: n, RSSMiB: float64(rss1) / (1 << 20), RSSMintMiB: float64(rss0) / (1 << 20), RSSPairedMiB: float64(rss1) / (1 << 20),
		RSSPerTabKiB:   float64(rss1-rss0) / 1024 / float64(n),
		RSSPerTabGCKiB: float64(rss1gc-rss0gc) / 1024 / float64(n),
		IdleCPUPerTab:  float64((cpu1 - cpu0).Microseconds()) / time.Since(t0).Seconds() / float64(n)}, nil
}

// settledRSS waits d and then until RSS stops falling (the runtime returns
// freed memory gradually), at most another d.
func settledRSS(ctx context.Context, p *proc, d time.Duration) int64 {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	last, _ := p.rss()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		cur, _ := p.rss()
		if cur >= last-(64<<10) {
			return cur
		}
		last = cur
	}
	return last
}

// parallel runs fn(0..n-1) with at most width at once; the first error wins.
func parallel(ctx context.Context, n, width int, fn func(i int) error) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("item %d: %w", i, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// medians folds runs: the median of each figure per scenario × config.
func medians(rs []Result) []Result {
	type key struct{ s, c string }
	groups := map[key][]Result{}
	var order []key
	for _, r := range rs {
		k := key{r.Scenario, r.Config}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []Result
	for _, k := range order {
		g := groups[k]
		m := g[0]
		med := func(f func(Result) float64) float64 {
			v := make([]float64, len(g))
			for i, r := range g {
				v[i] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		m.Run = 0
		m.ReqPerS = med(func(r Result) float64 { return r.ReqPerS })
		m.P50us = med(func(r Result) float64 { return r.P50us })
		m.P90us = med(func(r Result) float64 { return r.P90us })
		m.P99us = med(func(r Result) float64 { return r.P99us })
		m.CPUms = med(func(r Result) float64 { return r.CPUms })
		m.ClientCPUms = med(func(r Result) float64 { return r.ClientCPUms })
		m.CPUPartsMs = nil
		for i := range g[0].CPUPartsMs {
			m.CPUPartsMs = append(m.CPUPartsMs, med(func(r Result) float64 {
				if i < len(r.CPUPartsMs) {
					return r.CPUPartsMs[i]
				}
				return 0
			}))
		}
		m.RSSMiB = med(func(r Result) float64 { return r.RSSMiB })
		m.AuditPerReq = med(func(r Result) float64 { return r.AuditPerReq })
		m.RSSPerTabKiB = med(func(r Result) float64 { return r.RSSPerTabKiB })
		m.RSSPerTabGCKiB = med(func(r Result) float64 { return r.RSSPerTabGCKiB })
		m.RSSMintMiB = med(func(r Result) float64 { return r.RSSMintMiB })
		m.RSSPairedMiB = med(func(r Result) float64 { return r.RSSPairedMiB })
		m.IdleCPUPerTab = med(func(r Result) float64 { return r.IdleCPUPerTab })
		errs := 0
		for _, r := range g {
			errs += r.Errors
		}
		m.Errors = errs
		out = append(out, m)
	}
	return out
}

// markdown renders the medians and the targets.
func markdown(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nlapbench %s — %s, %d CPUs (%s), load at start %s, state %d B, %s\n\n",
		rep.Started.Format("2006-01-02 15:04"), rep.GoVersion, rep.CPUs, rep.CPUModel, rep.LoadAvg, rep.StateB, strings.Join(rep.Args, " "))
	b.WriteString("| scenario | config | req/s | p50 µs | p90 µs | p99 µs | server CPU ms/req | client CPU ms/req | server RSS MiB | audit lines/req | errors |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var idle []Result
	for _, r := range rep.Medians {
		if r.Tabs > 0 {
			idle = append(idle, r)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.0f | %.2f | %d |\n",
			r.Scenario, r.Config, r.ReqPerS, r.P50us, r.P90us, r.P99us, r.CPUms, r.ClientCPUms, r.RSSMiB, r.AuditPerReq, r.Errors)
	}
	if len(idle) > 0 {
		b.WriteString("\n| scenario | config | RSS after mint MiB | RSS paired MiB | RSS per idle tab KiB | same, after a GC KiB | idle CPU µs/tab/s | errors |\n")
		b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range idle {
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %d |\n", r.Scenario, r.Config, r.RSSMintMiB, r.RSSPairedMiB, r.RSSPerTabKiB, r.RSSPerTabGCKiB, r.IdleCPUPerTab, r.Errors)
		}
	}
	var parts []Result
	for _, r := range rep.Medians {
		if len(r.CPUPartsMs) > 1 {
			parts = append(parts, r)
		}
	}
	if len(parts) > 0 {
		b.WriteString("\n| scenario | config | server CPU ms/req by process: node A (the tab's), B, C, nats-server |\n| --- | --- | --- |\n")
		for _, r := range parts {
			v := make([]string, len(r.CPUPartsMs))
			for i, ms := range r.CPUPartsMs {
				v[i] = fmt.Sprintf("%.3f", ms)
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", r.Scenario, r.Config, strings.Join(v, " / "))
		}
	}
	b.WriteString(targets(rep.Medians))
	b.WriteString(clusterTargets(rep))
	return b.String()
}

// targets checks the figures against issue #7's targets.
func targets(ms []Result) string {
	get := func(s, c string) (Result, bool) {
		for _, r := range ms {
			if r.Scenario == s && r.Config == c {
				return r, true
			}
		}
		return Result{}, false
	}
	var b strings.Builder
	b.WriteString("\n| target (issue #7, default config) | measured | |\n| --- | --- | --- |\n")
	row := func(what, got string, ok bool) {
		v := "met"
		if !ok {
			v = "**not met**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", what, got, v)
	}
	if r, ok := get("observe-16", "default"); ok {
		row("/observe ×16 ≥ 11,000 req/s (4× the reference's 2,750)", fmt.Sprintf("%.0f req/s", r.ReqPerS), r.ReqPerS >= 11000)
		row("/observe ×16 p99 ≤ 10 ms", fmt.Sprintf("%.1f ms", r.P99us/1e3), r.P99us <= 10000)
		row("/observe ×16 server CPU ≤ 0.11 ms/req (reference 0.45)", fmt.Sprintf("%.3f ms", r.CPUms), r.CPUms <= 0.11)
		if c, ok := get("observe-16", "memory-none"); ok {
			row("/observe ×16 default ≥ 0.8× memory-none", fmt.Sprintf("%.2f×", r.ReqPerS/c.ReqPerS), r.ReqPerS >= 0.8*c.ReqPerS)
		}
		if f, ok := get("floor-16", "floor"); ok {
			fmt.Fprintf(&b, "| (/observe ×16 vs the floor in this run) | %.2f× floor req/s, %.2f× floor CPU/req | |\n", r.ReqPerS/f.ReqPerS, r.CPUms/f.CPUms)
		}
	}
	if r, ok := get("observe-1", "default"); ok {
		row("/observe ×1 p50 ≤ 250 µs (reference 500–750)", fmt.Sprintf("%.0f µs", r.P50us), r.P50us <= 250)
		if f, ok := get("floor-1", "floor"); ok {
			fmt.Fprintf(&b, "| (/observe ×1 vs the floor in this run) | p50 %.2f× floor | |\n", r.P50us/f.P50us)
		}
	}
	if r, ok := get("message-16", "default"); ok {
		row("/message ×16 ≥ 14,000 req/s (3× the reference's 4,650)", fmt.Sprintf("%.0f req/s", r.ReqPerS), r.ReqPerS >= 14000)
		row("/message ×16 server CPU ≤ 0.10 ms/req (reference 0.30)", fmt.Sprintf("%.3f ms", r.CPUms), r.CPUms <= 0.10)
		if c, ok := get("message-16", "memory-none"); ok {
			row("/message ×16 default ≥ 0.8× memory-none", fmt.Sprintf("%.2f×", r.ReqPerS/c.ReqPerS), r.ReqPerS >= 0.8*c.ReqPerS)
		}
	}
	if r, ok := get("mcp-1", "default"); ok {
		if l, ok := get("observe-1", "default"); ok {
			row("MCP observe ×1 p50 ≤ 1.3× raw LAP /observe ×1 p50", fmt.Sprintf("%.0f µs = %.2f× %.0f µs", r.P50us, r.P50us/l.P50us, l.P50us), r.P50us <= 1.3*l.P50us)
		}
	}
	if r, ok := get("mcp-8", "default"); ok {
		fmt.Fprintf(&b, "| (MCP observe ×8: reference 772–811 calls/s) | %.0f calls/s, server CPU %.3f ms/call | |\n", r.ReqPerS, r.CPUms)
	}
	for _, n := range []string{"1000", "10000"} {
		if r, ok := get("idle-"+n, "default"); ok {
			row("idle paired tab ≤ 12 KiB RSS ("+n+" tabs; settled / after a GC)", fmt.Sprintf("%.1f / %.1f KiB", r.RSSPerTabKiB, r.RSSPerTabGCKiB), r.RSSPerTabKiB <= 12 && r.RSSPerTabGCKiB <= 12)
		}
	}
	b.WriteString("\nReference server (not runnable here; issue #7's figures, same kind of machine): /observe ×1 1,391–1,418 req/s p50 607–616 µs; " +
		"×16 2,468–2,783 req/s; /message ×16 3,470–4,648 req/s; MCP observe ×8 772–811 calls/s; ~5 KB RSS per idle tab; " +
		"server CPU 0.45 ms (/observe ×16) and 0.30 ms (/message ×16) per request.\n")
	return b.String()
}

// clusterTargets checks issue #12's targets when a run has nats-local and
// nats-cross: cross ÷ local throughput (≥ 0.7×) and p50 (≤ +150 µs at one
// agent), for each run's pair as well as their median (the two
// configurations alternate, so a run's pair shares the machine's mood), and
// an idle tab's RSS with --nats against default (≤ +2 KiB).
func clusterTargets(rep Report) string {
	type pair struct{ local, cross Result }
	runs := map[string]map[int]*pair{}
	var order []string
	for _, r := range rep.Results {
		if r.Config != "nats-local" && r.Config != "nats-cross" || r.Tabs > 0 {
			continue
		}
		if runs[r.Scenario] == nil {
			runs[r.Scenario] = map[int]*pair{}
			order = append(order, r.Scenario)
		}
		p := runs[r.Scenario][r.Run]
		if p == nil {
			p = &pair{}
			runs[r.Scenario][r.Run] = p
		}
		if r.Config == "nats-local" {
			p.local = r
		} else {
			p.cross = r
		}
	}
	var b strings.Builder
	row := func(what, got, verdict string) {
		if b.Len() == 0 {
			b.WriteString("\n| target (issue #12, cluster) | measured (median; each run) | |\n| --- | --- | --- |\n")
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", what, got, verdict)
	}
	verdict := func(med float64, each []float64, ok func(float64) bool) string {
		all := true
		for _, v := range each {
			all = all && ok(v)
		}
		switch {
		case ok(med) && all:
			return "met"
		case ok(med):
			return "met by the median, not by every run"
		}
		return "**not met**"
	}
	median := func(v []float64) float64 {
		w := slices.Clone(v)
		slices.Sort(w)
		return w[len(w)/2]
	}
	list := func(v []float64, f string) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprintf(f, x)
		}
		return strings.Join(s, ", ")
	}
	for _, sc := range order {
		var ratio, dp50 []float64
		for run := 0; run <= len(runs[sc])+1; run++ {
			p := runs[sc][run]
			if p != nil && p.local.ReqPerS > 0 && p.cross.ReqPerS > 0 {
				ratio = append(ratio, p.cross.ReqPerS/p.local.ReqPerS)
				dp50 = append(dp50, p.cross.P50us-p.local.P50us)
			}
		}
		if len(ratio) == 0 {
			continue
		}
		m := median(ratio)
		row(sc+": cross-node req/s ≥ 0.7× nats-local", fmt.Sprintf("%.3f× (%s)", m, list(ratio, "%.3f")), verdict(m, ratio, func(v float64) bool { return v >= 0.7 }))
		if strings.HasSuffix(sc, "-1") {
			m := median(dp50)
			row(sc+": cross-node p50 ≤ +150 µs", fmt.Sprintf("%+.0f µs (%s)", m, list(dp50, "%+.0f")), verdict(m, dp50, func(v float64) bool { return v <= 150 }))
		}
	}
	for _, r := range rep.Medians {
		if r.Tabs == 0 || !strings.HasPrefix(r.Config, "nats-") {
			continue
		}
		for _, d := range rep.Medians {
			if d.Scenario == r.Scenario && d.Config == "default" {
				settled, gc := r.RSSPerTabKiB-d.RSSPerTabKiB, r.RSSPerTabGCKiB-d.RSSPerTabGCKiB
				row(r.Scenario+" "+r.Config+": idle tab ≤ +2 KiB RSS against default (settled / after a GC)",
					fmt.Sprintf("%+.1f / %+.1f KiB", settled, gc), verdict(settled, []float64{gc}, func(v float64) bool { return v <= 2 }))
			}
		}
	}
	return b.String()
}
