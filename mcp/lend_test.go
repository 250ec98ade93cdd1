package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

// tokenLAP answers each token's calls deterministically: the nth call of a
// token to a route gets the same body whatever other tokens do meanwhile.
type tokenLAP struct {
	mu sync.Mutex
	n  map[string]int
}

func newTokenLAP() *tokenLAP { return &tokenLAP{n: map[string]int{}} }

const threeActions = `[{"variant":"addTodo","intent":"Add","requiresConfirm":false,"source":"schema","emits":[]},{"variant":"clearAll","intent":"Clear","requiresConfirm":true},{"variant":"undo","intent":"Undo","available":false,"unavailableReason":"nothing to undo"}]`

func (s *tokenLAP) Call(_ context.Context, _, token, route string, _ any) (json.RawMessage, error) {
	s.mu.Lock()
	s.n[token+route]++
	n := s.n[token+route]
	s.mu.Unlock()
	actions, hash, extra := twoActions, "h1", ""
	if n >= 4 {
		actions = threeActions
	}
	if n >= 5 { // the app changed: new messages too
		hash, extra = "h2", `,"rename":{"title":"string","id":"number"}`
	}
	switch route {
	case "/observe":
		return json.RawMessage(`{"state":{"owner":"` + token + `","n":` + fmt.Sprint(n) + `,"todos":[{"title":"a \"quoted\" \u00e9 <b>\n","done":false}],"pad":"` + strings.Repeat("x", 2000) + `"},` +
			`"actions":` + actions + `,` +
			`"description":{"name":"Todo","version":"1","schemaHash":"` + hash + `","docs":{"use":"add then clear","empty":""},` +
			`"messages":{"discriminant":"type","variants":{"addTodo":{"title":"string"},"clearAll":{},"undo":{}` + extra + `}}},` +
			`"context":{"page":"/list","none":null},"health":{"connected":true,"visible":true},"notice":"hello"}`), nil
	case "/message":
		return dispatched(`[{"op":"replace","path":"/n","value":`+fmt.Sprint(n)+`}]`, actions), nil
	case "/actions":
		return json.RawMessage(`{"actions":` + actions + `}`), nil
	}
	return json.RawMessage(`{"ok":true}`), nil
}

// poisonLender lends every body as a lap.Lender does and overwrites it with
// 0xff when it is released: a result, cached binding or later call that
// still reads a released body reads invalid UTF-8 instead of its bytes (and
// under -race, a read racing the overwrite is reported).
type poisonLender struct {
	lap.Client
	lent, released atomic.Int64

	mu   sync.Mutex
	bufs [][]byte // every body lent (kept, so no other value reuses the memory)
}

// owns reports whether the memory at p (n bytes) overlaps a lent body.
func (l *poisonLender) owns(p unsafe.Pointer, n int) bool {
	if n == 0 {
		return false
	}
	a := uintptr(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.bufs {
		s := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if a < s+uintptr(len(b)) && s < a+uintptr(n) {
			return true
		}
	}
	return false
}

func (l *poisonLender) ownsBytes(b []byte) bool {
	return l.owns(unsafe.Pointer(unsafe.SliceData(b)), len(b))
}

func (l *poisonLender) ownsString(s string) bool {
	return l.owns(unsafe.Pointer(unsafe.StringData(s)), len(s))
}

// keptLent names what binding b keeps that points into a lent body.
func (l *poisonLender) keptLent(b *Binding) []string {
	var out []string
	for name, s := range map[string]string{"AppName": b.AppName, "AppVersion": b.AppVersion, "SchemaHash": b.SchemaHash} {
		if l.ownsString(s) {
			out = append(out, name)
		}
	}
	if l.ownsBytes(b.shownRaw) {
		out = append(out, "shownRaw")
	}
	if l.ownsBytes(b.sigsRaw) {
		out = append(out, "sigsRaw")
	}
	for k, v := range b.sigs {
		if l.ownsString(k) || l.ownsString(v) {
			out = append(out, "sigs["+k+"]")
		}
	}
	for _, a := range b.shown {
		if l.ownsString(a.variant) || l.ownsBytes(a.enc) {
			out = append(out, "shown "+a.variant)
		}
		for _, f := range a.fields {
			if l.ownsString(f.key) || l.ownsBytes(f.val) {
				out = append(out, "shown "+a.variant+"."+f.key)
			}
		}
	}
	return out
}

type poisonLease struct {
	b    []byte
	l    *poisonLender
	done atomic.Bool
}

func (l *poisonLender) CallLent(ctx context.Context, base, token, route string, body any) (json.RawMessage, lap.Lease, error) {
	raw, err := l.Client.Call(ctx, base, token, route, body)
	if err != nil {
		return nil, nil, err
	}
	ls := &poisonLease{b: bytes.Clone(raw), l: l}
	l.lent.Add(1)
	l.mu.Lock()
	l.bufs = append(l.bufs, ls.b)
	l.mu.Unlock()
	return ls.b, ls, nil
}

func (p *poisonLease) Release() {
	if p.done.Swap(true) {
		panic("lease released twice")
	}
	for i := range p.b {
		p.b[i] = 0xff
	}
	p.l.released.Add(1)
}

// TestObserveLentBodyIsNotKept runs the same tool calls, concurrently for
// several sessions, through an endpoint whose LAP client lends its bodies
// (and poisons them on release) and one whose client does not: every
// response must be the same, with the fast path and through mcp-go. The
// sequence reads what observe left in the binding (the shown actions and
// payload signatures, compared by send_message and the next observe, the
// schema hash) after the body it came from was released.
func TestObserveLentBodyIsNotKept(t *testing.T) {
	t.Parallel()
	for _, disable := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableFastPath=%v", disable), func(t *testing.T) {
			t.Parallel()
			endpoint := func(c lap.Client) *HTTPHandler {
				h, err := NewHTTPHandler(HTTPConfig{Config: Config{Client: c, Tools: ToolsAll}, Audit: &auditRec{}, DisableFastPath: disable})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = h.Close(context.Background()) })
				return h
			}
			lender := &poisonLender{Client: newTokenLAP()}
			ref, lent := endpoint(newTokenLAP()), endpoint(lender)
			var handles sync.Map
			handle := regexp.MustCompile(`s_[a-z2-7]{16}`)
			post := func(h http.Handler, id int, tool, args string) string {
				body := `{"jsonrpc":"2.0","id":` + fmt.Sprint(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `,` + modernMeta + `}}`
				r := httptest.NewRequest(http.MethodPost, "/agent/mcp", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				r.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20260728)
				r.Header.Set("Mcp-Method", "tools/call")
				r.Header.Set("Mcp-Name", tool)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					t.Errorf("%s: %d %s", tool, w.Code, w.Body)
				}
				return w.Body.String()
			}
			steps := []struct{ tool, args string }{
				{"observe", `{"session":"S"}`},
				{"observe", `{"session":"S"}`},
				{"observe", `{"session":"S","verbose":true}`},
				{"send_message", `{"session":"S","msg":{"type":"addTodo","title":"x"}}`},
				{"observe", `{"session":"S"}`}, // a third action
				{"send_message", `{"session":"S","msg":{"type":"addTodo","title":"y"}}`},
				{"observe", `{"session":"S"}`}, // schema changed
				{"list_actions", `{"session":"S"}`},
				{"observe", `{"session":"S"}`},
				{"observe", `{"session":"S"}`},
			}
			const workers = 6
			var observes atomic.Int64
			var wg sync.WaitGroup
			for g := range workers {
				wg.Go(func() {
					tok := fmt.Sprintf("agt_%043d", g)
					connect := `{"token":"` + tok + `"}`
					rs, ls := post(ref, 1, "connect_session", connect), post(lent, 1, "connect_session", connect)
					rh, lh := handle.FindString(rs), handle.FindString(ls)
					if rh == "" || lh == "" {
						t.Errorf("connect_session: %s / %s", rs, ls)
						return
					}
					handles.Store(lh, true)
					for i, st := range steps {
						want := post(ref, i+2, st.tool, strings.ReplaceAll(st.args, `"S"`, `"`+rh+`"`))
						got := post(lent, i+2, st.tool, strings.ReplaceAll(st.args, `"S"`, `"`+lh+`"`))
						if st.tool == "observe" {
							observes.Add(1)
						}
						if strings.Contains(want, `"isError":true`) {
							t.Errorf("step %d %s failed: %s", i, st.tool, want)
						}
						if got = strings.ReplaceAll(got, lh, rh); got != want {
							t.Errorf("worker %d step %d %s with lent bodies:\n%s\nwant\n%s", g, i, st.tool, got, want)
						}
					}
				})
			}
			wg.Wait()
			n := 0
			handles.Range(func(h, _ any) bool {
				lent.exec.Bindings().Update(h.(string), func(b *Binding) {
					n++
					if kept := lender.keptLent(b); len(kept) > 0 {
						t.Errorf("binding %s keeps parts of a released LAP body: %v", b.Handle, kept)
					}
					if !b.shownSet || b.sigs == nil {
						t.Errorf("binding %s remembers nothing: the check above saw nothing", b.Handle)
					}
				})
				return true
			})
			if n != workers {
				t.Errorf("checked %d bindings, want %d", n, workers)
			}
			if n, r := lender.lent.Load(), lender.released.Load(); n != observes.Load() || r != n {
				t.Errorf("%d observe calls lent %d bodies and released %d: every observe should lend one and release it", observes.Load(), n, r)
			}
		})
	}
}
