//go:build soak

// The chaos soak: a real `lapd serve` (built without -race, SQLite data dir,
// loopback) under load from many tabs and agents while faults are injected
// from outside: tab sockets dropped, tabs superseded by a new socket (a
// reload), sessions revoked, the server restarted with SIGTERM and killed
// with SIGKILL, approvals answered while sockets are down; plus hostile
// tabs flooding log entries and made-up approval answers, and an agent
// piling up big idempotent results. It asserts from outside:
//
//   - every logical agent call ends exactly once, within its budget;
//   - no dispatch is doubled for an idempotencyKey (the tabs count them);
//   - no approval is lost: every answer the human gave on a live session is
//     the outcome the agent reads back;
//   - the server's resident memory stays under its ceiling;
//   - its goroutines come back to a fresh server's count.
//
// Run it:
//
//	go test -tags soak -run TestSoak -count=1 -v ./e2e
//	LAPD_SOAK_DURATION=5m LAPD_SOAK_TABS=40 go test -tags soak -run TestSoak -count=1 -timeout 30m -v ./e2e
//
// Figures from a run are in docs/RELIABILITY.md.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/confirm"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func randID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ───────────────────────────── the server ─────────────────────────────

const soakKeptMiB = 64

type soakServer struct {
	t       *testing.T
	bin     string
	dataDir string
	addr    string
	args    []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *syncBuffer

	maxRSS   atomic.Int64 // KiB
	restarts atomic.Int64
}

func (s *soakServer) base() string { return "http://" + s.addr }

func (s *soakServer) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, append([]string{"serve", "--addr", s.addr, "--data-dir", s.dataDir}, s.args...)...)
	cmd.Env = append(os.Environ(), "LAPD_ADDR=", "LAPD_DATA_DIR=")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	go s.sampleRSS(cmd.Process.Pid, done)
	for start := time.Now(); ; {
		if resp, err := http.Get(s.base() + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-done:
			s.t.Fatalf("lapd serve exited before listening:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 30*time.Second {
			cmd.Process.Kill()
			s.t.Fatalf("lapd serve did not answer /healthz:\n%s", stderr.String())
		}
	}
	s.mu.Lock()
	s.cmd, s.done, s.stderr = cmd, done, stderr
	s.mu.Unlock()
}

// stop ends the server with sig and waits for it.
func (s *soakServer) stop(sig os.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		s.t.Errorf("lapd serve did not stop on %v", sig)
	}
}

func (s *soakServer) restart(sig os.Signal) {
	s.stop(sig)
	s.restarts.Add(1)
	s.start()
}

var vmRSS = regexp.MustCompile(`VmRSS:\s+(\d+) kB`)

func (s *soakServer) sampleRSS(pid int, done <-chan struct{}) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		if m := vmRSS.FindSubmatch(b); m != nil {
			kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
			for {
				cur := s.maxRSS.Load()
				if kb <= cur || s.maxRSS.CompareAndSwap(cur, kb) {
					break
				}
			}
		}
	}
}

// goroutines asks the running server for a goroutine dump (SIGQUIT, which
// also ends it) and counts the goroutines.
func (s *soakServer) goroutines() int {
	s.mu.Lock()
	cmd, done, stderr := s.cmd, s.done, s.stderr
	s.cmd = nil
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	<-done
	return strings.Count(stderr.String(), "\ngoroutine ")
}

// ───────────────────────────── HTTP ─────────────────────────────

var soakHTTP = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func post(url, token string, body any) (int, http.Header, []byte, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := soakHTTP.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, rb, err
}

func errCode(b []byte) string {
	var e struct {
		Error struct {
			Code      string `json:"code"`
			Reconnect string `json:"reconnect"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

// ───────────────────────────── a tab ─────────────────────────────

// simTab behaves like client/lapd.js in a page that is never closed: it
// reconnects after every drop, keeps its idempotency keys and its outbox of
// approvals answered while the socket was down ("sessionStorage"), and has
// a human who answers approvals at random times.
type simTab struct {
	srv    *soakServer
	token  string
	tid    string
	secret string // the tab secret (sessionStorage in lapd.js)
	big    int    // bytes of every send_message result (0 = small)
	policy json.RawMessage

	mu         sync.Mutex
	conn       *websocket.Conn
	gen        int
	count      int
	idem       map[string]json.RawMessage // key → result
	dispatches map[string]int             // key → times the app ran it
	pending    map[string]bool            // approvals on screen
	decided    map[string]string          // confirmId → the human's answer
	decidedAt  map[string]time.Time
	outbox     []map[string]any // confirm-resolved while down
	revoked    bool
	reconnects int

	wg sync.WaitGroup
}

const soakPolicy = `{"variants":{"inc":{"intent":"Increment"},"clearAll":{"intent":"Clear","requiresConfirm":true},` +
	`"reset":{"intent":"Reset","humanOnly":true}}}`

func newSimTab(srv *soakServer, token, tid string) *simTab {
	return &simTab{srv: srv, token: token, tid: tid, policy: json.RawMessage(soakPolicy),
		idem: map[string]json.RawMessage{}, dispatches: map[string]int{}, pending: map[string]bool{}, decided: map[string]string{}, decidedAt: map[string]time.Time{}}
}

// dial opens a socket (superseding any open one) and serves it.
func (tb *simTab) dial(ctx context.Context) error {
	u := "ws://" + tb.srv.addr + "/agent/ws"
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{Subprotocols: []string{"lapd.v2", "lapd.token." + tb.token, "lapd.tab." + tb.secret}})
	if err != nil {
		if resp != nil && (resp.StatusCode == 401 || resp.StatusCode == 403) {
			tb.mu.Lock()
			tb.revoked = true
			tb.mu.Unlock()
			return errRevoked
		}
		return err
	}
	c.SetReadLimit(64 << 20)
	tb.mu.Lock()
	tb.gen++
	gen := tb.gen
	tb.conn = c
	tb.reconnects++
	tb.mu.Unlock()
	hello := map[string]any{"t": "hello", "appName": "soak", "appVersion": "1", "schemaHash": "h", "lapVersion": 2, "policy": tb.policy}
	if err := tb.write(c, hello); err != nil {
		return err
	}
	tb.mu.Lock()
	out := tb.outbox
	tb.outbox = nil
	tb.mu.Unlock()
	for _, f := range out {
		tb.send(f)
	}
	tb.wg.Add(1)
	go tb.read(c, gen)
	return nil
}

var errRevoked = errors.New("revoked")

// answeredDown counts approvals answered while the tab's socket was down;
// resent, answers sent again because a confirm-sync still listed them.
var answeredDown, resent atomic.Int64

func (tb *simTab) write(c *websocket.Conn, v any) error {
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, b)
}

// send writes on the current socket; a confirm-resolved that cannot be sent
// goes to the outbox, like lapd.js.
func (tb *simTab) send(f map[string]any) {
	tb.mu.Lock()
	c := tb.conn
	tb.mu.Unlock()
	if c != nil && tb.write(c, f) == nil {
		return
	}
	if f["t"] == "confirm-resolved" {
		tb.mu.Lock()
		tb.outbox = append(tb.outbox, f)
		tb.mu.Unlock()
		answeredDown.Add(1)
	}
}

func (tb *simTab) read(c *websocket.Conn, gen int) {
	defer tb.wg.Done()
	for {
		_, b, err := c.Read(context.Background())
		if err != nil {
			tb.mu.Lock()
			if tb.gen == gen {
				tb.conn = nil
			}
			if websocket.CloseStatus(err) == 4001 {
				tb.revoked = true
			}
			tb.mu.Unlock()
			return
		}
		var f struct {
			T         string          `json:"t"`
			ID        string          `json:"id"`
			Tool      string          `json:"tool"`
			Args      json.RawMessage `json:"args"`
			ConfirmID string          `json:"confirmId"`
			Pending   []struct {
				ConfirmID string `json:"confirmId"`
			} `json:"pending"`
		}
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		switch f.T {
		case "rpc":
			tb.wg.Add(1)
			go func() { defer tb.wg.Done(); tb.answer(c, f.ID, f.Tool, f.Args) }()
		case "confirm-sync":
			// Like lapd.js: an approval answered here but still pending
			// there is answered again (the answer was lost on the way).
			var again []map[string]any
			tb.mu.Lock()
			for _, p := range f.Pending {
				if outcome, done := tb.decided[p.ConfirmID]; done {
					again = append(again, map[string]any{"t": "confirm-resolved", "confirmId": p.ConfirmID, "outcome": outcome})
				} else {
					tb.pending[p.ConfirmID] = true
				}
			}
			tb.mu.Unlock()
			for _, f := range again {
				resent.Add(1)
				tb.send(f)
			}
		case "confirm-expire":
			tb.mu.Lock()
			delete(tb.pending, f.ConfirmID)
			tb.mu.Unlock()
		case "revoked":
			tb.mu.Lock()
			tb.revoked = true
			tb.mu.Unlock()
		}
	}
}

func (tb *simTab) answer(c *websocket.Conn, id, tool string, args json.RawMessage) {
	var result any = map[string]any{"state": map[string]any{"count": tb.countNow()}, "actions": []any{}}
	if tool == "send_message" {
		result = tb.sendMessage(args)
	}
	rb, _ := json.Marshal(result)
	frame := []byte(`{"t":"rpc-reply","id":` + strconv.Quote(id) + `,"result":`)
	frame = append(append(frame, rb...), '}')
	if result == nil {
		frame = []byte(`{"t":"rpc-error","id":` + strconv.Quote(id) + `,"code":"outcome-unknown","detail":"already dispatched, result not kept; observe before retrying"}`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c.Write(ctx, websocket.MessageText, frame) == nil {
		_ = tb.write(c, map[string]any{"t": "log-append", "entry": map[string]any{"id": id, "at": time.Now().UnixMilli(), "kind": "read", "intent": tool}})
	}
}

func (tb *simTab) countNow() int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.count
}

// sendMessage answers like lapd.js: once per idempotencyKey; a repeat gets
// the first result when it was kept (≤ 256 KiB), else nil (outcome-unknown).
func (tb *simTab) sendMessage(args json.RawMessage) any {
	var a struct {
		Msg struct {
			Type string `json:"type"`
		} `json:"msg"`
		Key string `json:"idempotencyKey"`
	}
	_ = json.Unmarshal(args, &a)
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if a.Key != "" {
		if r, ok := tb.idem[a.Key]; ok {
			if r == nil {
				return nil
			}
			return r // one dispatch per key, like lapd.js
		}
	}
	var r json.RawMessage
	switch a.Msg.Type {
	case "inc":
		tb.count++
		tb.dispatches[a.Key]++
		pad := ""
		if tb.big > 0 {
			pad = `,"pad":"` + strings.Repeat("x", tb.big) + `"`
		}
		r = json.RawMessage(fmt.Sprintf(`{"status":"dispatched","stateDiff":[{"op":"replace","path":"/count","value":%d}]%s}`, tb.count, pad))
	case "clearAll":
		id := "c-" + randID()
		tb.pending[id] = true
		r = json.RawMessage(`{"status":"pending-confirmation","confirmId":"` + id + `"}`)
	default:
		r = json.RawMessage(`{"status":"rejected","reason":"invalid","detail":"unknown"}`)
	}
	if a.Key != "" {
		if len(r) <= 256<<10 {
			tb.idem[a.Key] = r
		} else {
			tb.idem[a.Key] = nil
		}
	}
	return r
}

// human answers one approval on screen, if any.
func (tb *simTab) human() {
	tb.mu.Lock()
	var id string
	for p := range tb.pending {
		id = p
		break
	}
	if id == "" {
		tb.mu.Unlock()
		return
	}
	delete(tb.pending, id)
	outcome := "confirmed"
	if mrand.IntN(3) == 0 {
		outcome = "user-cancelled"
	}
	tb.decided[id] = outcome
	tb.decidedAt[id] = time.Now()
	tb.mu.Unlock()
	f := map[string]any{"t": "confirm-resolved", "confirmId": id, "outcome": outcome}
	if outcome == "confirmed" {
		f["stateAfter"] = map[string]any{"count": tb.countNow()}
	}
	tb.send(f)
}

// run keeps the tab connected until ctx ends or the session is revoked.
func (tb *simTab) run(ctx context.Context) {
	for ctx.Err() == nil {
		tb.mu.Lock()
		up, revoked := tb.conn != nil, tb.revoked
		tb.mu.Unlock()
		if revoked {
			return
		}
		if !up {
			if err := tb.dial(ctx); errors.Is(err, errRevoked) {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+mrand.IntN(150)) * time.Millisecond):
		}
		if mrand.IntN(8) == 0 {
			tb.human()
		}
	}
}

func (tb *simTab) drop() {
	tb.mu.Lock()
	c := tb.conn
	tb.mu.Unlock()
	if c != nil {
		c.CloseNow()
	}
}

func (tb *simTab) close() {
	tb.drop()
	tb.wg.Wait()
}

// ───────────────────────────── an agent ─────────────────────────────

// outcome of one logical call.
type outcome struct {
	status string // dispatched | rejected | pending-confirmation | confirmed | outcome-unknown | revoked | failed:<why>
	key    string
	id     string // confirmId
}

type simAgent struct {
	srv   *soakServer
	tab   *simTab
	token string

	started, ended atomic.Int64
	mu             sync.Mutex
	outcomes       []outcome
	proposals      []string // confirmIds this agent saw proposed
	retries        int

	verified map[string]bool // proposals whose answer was read back
	checked  int
	agedOut  int      // answers read back after the keep window (forgotten by design)
	lost     []string // answers read back wrong
}

// verify reads back one approval the human answered; final reports
// whether the answer (or its absence) is settled.
func (a *simAgent) verify(id, want string, at time.Time, timeoutMs int) (final bool) {
	status, b := a.call("/confirm-result", map[string]any{"confirmId": id, "timeoutMs": timeoutMs}, 20*time.Second)
	var r struct{ Status, Reason string }
	_ = json.Unmarshal(b, &r)
	got := r.Status
	if got == "rejected" {
		got = r.Reason
	}
	switch {
	case status == 200 && got == "still-pending":
		return false
	case status == 400 && time.Since(at) > confirm.DefaultKeep-10*time.Second:
		a.agedOut++ // read back after the 5-minute keep window: forgotten by design
	case status != 200 || got != want:
		a.lost = append(a.lost, fmt.Sprintf("%s: human %s %.0fs ago, agent reads %d %.100s", id, want, time.Since(at).Seconds(), status, b))
	}
	a.checked++
	a.verified[id] = true
	return true
}

// verifySome reads back the answer of one of this agent's approvals the
// human answered, as a model polling get_confirm_result would.
func (a *simAgent) verifySome() {
	a.tab.mu.Lock()
	var id, want string
	var at time.Time
	for _, p := range a.proposals {
		if w, ok := a.tab.decided[p]; ok && !a.verified[p] {
			id, want, at = p, w, a.tab.decidedAt[p]
			break
		}
	}
	a.tab.mu.Unlock()
	if id != "" {
		a.verify(id, want, at, 0)
	}
}

// call is one logical LAP call with the MCP executor's retry rules: 503
// paused (reconnect pending) and shutting-down, 429 and network errors are
// retried with the same body (so the same idempotencyKey) within budget;
// and, as a model told "the app did not answer in time" might, a 504 too.
func (a *simAgent) call(route string, body map[string]any, budget time.Duration) (int, []byte) {
	deadline := time.Now().Add(budget)
	for {
		status, hdr, b, err := post(a.srv.base()+"/agent/lap/v1"+route, a.token, body)
		retry := err != nil || status == 429 || status == 504 || (status == 503 && (errCode(b) == "shutting-down" || hdr.Get("X-LLui-Reconnect") == "pending"))
		if !retry || time.Now().After(deadline) {
			if err != nil {
				return 0, []byte(err.Error())
			}
			return status, b
		}
		a.mu.Lock()
		a.retries++
		a.mu.Unlock()
		time.Sleep(time.Duration(100+mrand.IntN(300)) * time.Millisecond)
	}
}

func (a *simAgent) record(o outcome) {
	a.ended.Add(1)
	a.mu.Lock()
	a.outcomes = append(a.outcomes, o)
	a.mu.Unlock()
}

func (a *simAgent) message(variant string) {
	a.started.Add(1)
	key := "k-" + randID()
	status, b := a.call("/message", map[string]any{"msg": map[string]any{"type": variant}, "idempotencyKey": key, "timeoutMs": 0}, 20*time.Second)
	o := outcome{key: key}
	var r struct {
		Status    string `json:"status"`
		ConfirmID string `json:"confirmId"`
	}
	switch {
	case status == 200 && json.Unmarshal(b, &r) == nil:
		o.status, o.id = r.Status, r.ConfirmID
		if r.ConfirmID != "" {
			a.mu.Lock()
			a.proposals = append(a.proposals, r.ConfirmID)
			a.mu.Unlock()
		}
	case status == 409 && errCode(b) == "outcome-unknown":
		o.status = "outcome-unknown"
	case status == 401 || status == 403 || (status == 503 && errCode(b) == "paused"):
		o.status = "revoked" // the session ended (revoked, expired) or stayed away past the budget
	default:
		o.status = fmt.Sprintf("failed:%d %.120s", status, b)
	}
	a.record(o)
}

func (a *simAgent) run(ctx context.Context) {
	for ctx.Err() == nil {
		a.tab.mu.Lock()
		revoked := a.tab.revoked
		a.tab.mu.Unlock()
		if revoked {
			return
		}
		switch n := mrand.IntN(10); {
		case n < 6:
			a.message("inc")
		case n < 8:
			a.message("clearAll")
		case n < 9:
			a.verifySome()
		default:
			a.started.Add(1)
			status, b := a.call("/observe", map[string]any{}, 20*time.Second)
			o := outcome{status: "observed"}
			if status != 200 && status != 401 && status != 403 && !(status == 503 && errCode(b) == "paused") {
				o.status = fmt.Sprintf("failed:%d %.120s", status, b)
			}
			a.record(o)
		}
		time.Sleep(time.Duration(20+mrand.IntN(80)) * time.Millisecond)
	}
}

// ───────────────────────────── the soak ─────────────────────────────

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// mintTab mints a session; withSecret asks for a tab secret, as lapd.js
// does: a reload presents it, so the new socket still carries the human's
// approvals (a socket superseding a live tab without it may not approve).
func mintTab(t *testing.T, srv *soakServer, withSecret bool) (token, tid, secret string) {
	status, _, b, err := post(srv.base()+"/agent/mint", "", map[string]any{"tab": withSecret})
	if err != nil || status != 200 {
		t.Fatalf("mint: %d %s %v", status, b, err)
	}
	var m struct {
		mintResp
		TabSecret string `json:"tabSecret"`
	}
	_ = json.Unmarshal(b, &m)
	if withSecret && m.TabSecret == "" {
		t.Fatalf("mint with tab:true returned no tabSecret: %s", b)
	}
	return m.Token, m.TID, m.TabSecret
}

func TestSoak(t *testing.T) {
	dur := envDur("LAPD_SOAK_DURATION", 30*time.Second)
	nTabs := envInt("LAPD_SOAK_TABS", 12)
	dir := t.TempDir()
	bin := filepath.Join(dir, "lapd")
	build := exec.Command("go", "build", "-o", bin, "../cmd/lapd")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	args := []string{"--audit", "none", "--demo=false", "--mcp=false", "--lap-rate", "6000", "--mint-rate", "6000",
		"--heartbeat", "2s", "--grace", "5m", "--max-kept-mib", strconv.Itoa(soakKeptMiB), "--log-level", "warn", "--shutdown-timeout", "5s"}

	// A fresh server's goroutines, the baseline to come back to.
	fresh := &soakServer{t: t, bin: bin, dataDir: filepath.Join(dir, "fresh"), addr: freeAddr(t), args: args}
	fresh.start()
	baseline := fresh.goroutines()

	srv := &soakServer{t: t, bin: bin, dataDir: filepath.Join(dir, "data"), addr: freeAddr(t), args: args}
	srv.start()
	t.Cleanup(func() { srv.stop(syscall.SIGKILL) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tabs []*simTab
	var agents []*simAgent
	var wg sync.WaitGroup
	for i := range nTabs {
		token, tid, secret := mintTab(t, srv, true)
		tb := newSimTab(srv, token, tid)
		tb.secret = secret
		if i == 0 {
			tb.big = 3 << 20 // every result 3 MiB: idempotent bodies pile up
		}
		tabs = append(tabs, tb)
		for range 2 {
			agents = append(agents, &simAgent{srv: srv, tab: tb, token: token, verified: map[string]bool{}})
		}
	}
	tabCtx, stopTabs := context.WithCancel(ctx)
	for _, tb := range tabs {
		wg.Add(1)
		go func() { defer wg.Done(); tb.run(tabCtx) }()
	}
	agentCtx, stopAgents := context.WithTimeout(ctx, dur)
	defer stopAgents()
	var agentsWG sync.WaitGroup
	for _, a := range agents {
		agentsWG.Add(1)
		go func() { defer agentsWG.Done(); a.run(agentCtx) }()
	}

	// Hostile tabs: made-up approval answers with 1 MiB stateAfter, and
	// 200 KiB log entries, as fast as the server reads them.
	hostileCtx, stopHostile := context.WithCancel(ctx)
	var hostileWG sync.WaitGroup
	var junkSent atomic.Int64
	for kind := range 2 {
		token, _, _ := mintTab(t, srv, false)
		hostileWG.Add(1)
		go func() {
			defer hostileWG.Done()
			blob := strings.Repeat("x", 200<<10)
			if kind == 0 {
				blob = strings.Repeat("y", 1<<20)
			}
			for hostileCtx.Err() == nil {
				c, _, err := websocket.Dial(hostileCtx, "ws://"+srv.addr+"/agent/ws", &websocket.DialOptions{Subprotocols: []string{"lapd.token." + token}})
				if err != nil {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				_ = c.Write(hostileCtx, websocket.MessageText, []byte(`{"t":"hello","appName":"junk","appVersion":"1","schemaHash":"h","lapVersion":2}`))
				for i := 0; hostileCtx.Err() == nil; i++ {
					var f string
					if kind == 0 {
						f = `{"t":"confirm-resolved","confirmId":"junk-` + strconv.Itoa(i) + `","outcome":"confirmed","stateAfter":"` + blob + `"}`
					} else {
						f = `{"t":"log-append","entry":{"id":"` + strconv.Itoa(i) + `","kind":"read","detail":"` + blob + `"}}`
					}
					if c.Write(hostileCtx, websocket.MessageText, []byte(f)) != nil {
						break
					}
					junkSent.Add(1)
				}
				c.CloseNow()
			}
		}()
	}

	// Faults.
	faults := map[string]int{}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(400+mrand.IntN(800)) * time.Millisecond)
		tb := tabs[1+mrand.IntN(len(tabs)-1)]
		switch n := mrand.IntN(20); {
		case n < 8:
			tb.drop()
			faults["tab dropped"]++
		case n < 13:
			_ = tb.dial(ctx) // a reload: the old socket is superseded (4002)
			faults["tab superseded"]++
		case n < 14:
			if status, _, _, _ := post(srv.base()+"/agent/revoke", "", map[string]any{"tid": tb.tid}); status == 200 {
				faults["session revoked"]++
			}
		case n < 17:
			srv.restart(syscall.SIGTERM)
			faults["server SIGTERM"]++
		default:
			srv.restart(syscall.SIGKILL)
			faults["server SIGKILL"]++
		}
	}
	stopAgents()
	agentsWG.Wait()
	stopHostile()
	hostileWG.Wait()

	// Settle: the human answers everything still on screen; tabs reconnect
	// and flush their outboxes.
	settle := time.Now().Add(30 * time.Second)
	for time.Now().Before(settle) {
		busy := false
		for _, tb := range tabs {
			tb.human()
			tb.mu.Lock()
			if !tb.revoked && (tb.conn == nil || len(tb.outbox) > 0 || len(tb.pending) > 0) {
				busy = true
			}
			tb.mu.Unlock()
		}
		if !busy {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Read back every approval the agents saw proposed and the human
	// answered, not yet read back during the run.
	for _, a := range agents {
		a.tab.mu.Lock()
		revoked := a.tab.revoked
		a.tab.mu.Unlock()
		if revoked {
			continue
		}
		for _, id := range a.proposals {
			a.tab.mu.Lock()
			want, ok := a.tab.decided[id]
			at := a.tab.decidedAt[id]
			a.tab.mu.Unlock()
			if !ok || a.verified[id] {
				continue // never answered (expired or still pending), or already read back
			}
			for range 3 { // a model polls until it has the answer
				if a.verify(id, want, at, 5000) {
					break
				}
			}
			if !a.verified[id] {
				a.lost = append(a.lost, id+": still pending after the human answered")
			}
		}
	}
	lost, checked, agedOut := 0, 0, 0
	var lostDetail []string
	for _, a := range agents {
		checked += a.checked
		agedOut += a.agedOut
		lost += len(a.lost)
		for _, d := range a.lost {
			if len(lostDetail) < 10 {
				lostDetail = append(lostDetail, d)
			}
		}
	}
	stopTabs()
	wg.Wait()
	for _, tb := range tabs {
		tb.close()
	}

	// Idle, then count goroutines (SIGQUIT ends the server).
	soakHTTP.CloseIdleConnections()
	time.Sleep(3 * time.Second) // closed sockets are noticed by their readers; not a synchronisation
	final := srv.goroutines()

	// Figures and assertions.
	calls, ends, retries, unknown, failed := int64(0), int64(0), 0, 0, 0
	byStatus := map[string]int{}
	var failures []string
	dispatched := 0
	for _, a := range agents {
		calls += a.started.Load()
		ends += a.ended.Load()
		retries += a.retries
		for _, o := range a.outcomes {
			st := o.status
			if strings.HasPrefix(st, "failed:") {
				failed++
				if len(failures) < 10 {
					failures = append(failures, st)
				}
				st = "failed"
			}
			byStatus[st]++
			if o.status == "outcome-unknown" {
				unknown++
			}
			if o.status == "dispatched" {
				a.tab.mu.Lock()
				n := a.tab.dispatches[o.key]
				a.tab.mu.Unlock()
				if n != 1 {
					t.Errorf("key %s answered dispatched, the tab ran it %d times", o.key, n)
				}
				dispatched++
			}
		}
	}
	doubled := 0
	for _, tb := range tabs {
		for k, n := range tb.dispatches {
			if n > 1 {
				doubled++
				t.Errorf("key %s dispatched %d times", k, n)
			}
		}
	}
	rssMiB := float64(srv.maxRSS.Load()) / 1024
	t.Logf("soak: %s, %d tabs, %d agents, 2 hostile tabs (%d junk frames sent)", dur, nTabs, len(agents), junkSent.Load())
	t.Logf("calls: %d started, %d ended, %d retried requests; outcomes %v", calls, ends, retries, byStatus)
	t.Logf("faults injected: %v (server restarts %d)", faults, srv.restarts.Load())
	t.Logf("approvals answered by the human and read back: %d (answered while the socket was down: %d, answered again after a confirm-sync: %d), lost: %d, read back after the 5-minute keep window: %d", checked, answeredDown.Load(), resent.Load(), lost, agedOut)
	t.Logf("dispatches doubled: %d; outcome-unknown answers: %d", doubled, unknown)
	t.Logf("max RSS of lapd serve: %.0f MiB (--max-kept-mib %d); goroutines: fresh %d, after the soak %d", rssMiB, soakKeptMiB, baseline, final)
	if junkSent.Load() == 0 {
		t.Errorf("the hostile tabs sent nothing: the soak did not test what it says")
	}
	if calls != ends {
		t.Errorf("%d calls started, %d ended", calls, ends)
	}
	if failed > 0 {
		t.Errorf("%d calls failed: %v", failed, failures)
	}
	if lost > 0 {
		t.Errorf("%d approvals lost: %v", lost, lostDetail)
	}
	if limit := float64(3*soakKeptMiB + 128); rssMiB > limit {
		t.Errorf("max RSS %.0f MiB over %.0f MiB", rssMiB, limit)
	}
	if final > baseline+5 {
		t.Errorf("goroutines after the soak %d, fresh server %d", final, baseline)
	}
}
