package mcp

import (
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"strings"
	"testing"
)

// A binding is bounded by count (256 in all, MaxBindings), not bytes: what
// one may hold at most is its view (maxViewBytes + maxViewOpsBytes), the
// action list it remembers (maxShownBytes of JSON, plus its rendering) and
// the payload signatures (maxSigsBytes of description.messages, plus the
// signatures). This measures the renderings at their worst (the smallest
// entries, the most of them) so the figure in the docs stays true.
//
//	go test ./mcp -run TestBindingWorstCase -v
func TestBindingWorstCase(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MBs")
	}
	// The most a binding keeps: as many tiny actions and variants (the
	// shape that renders to the most heap per byte of JSON) as the caps let
	// it keep, within maxShownBytes / maxSigsBytes of JSON and
	// maxRenderBytes of estimated rendering each.
	actionsOf := func(n int) []byte {
		acts := make([]string, n)
		for i := range n {
			acts[i] = fmt.Sprintf(`{"variant":"v%d"}`, i)
		}
		return []byte("[" + strings.Join(acts, ",") + "]")
	}
	messagesOf := func(n int) []byte {
		vars := make([]string, n)
		for i := range n {
			vars[i] = fmt.Sprintf(`"v%d":{"a":"string"}`, i)
		}
		return []byte(`{"discriminant":"type","variants":{` + strings.Join(vars, ",") + `}}`)
	}
	// largest returns the largest n in [1, 16384) for which kept(n) holds.
	largest := func(kept func(n int) bool) int {
		lo, hi := 1, 16384
		if !kept(lo) || kept(hi) {
			t.Fatal("the caps do not bound the list")
		}
		for hi-lo > 1 {
			if mid := (lo + hi) / 2; kept(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		return lo
	}
	nV := largest(func(n int) bool {
		m := messagesOf(n)
		return len(m) <= maxSigsBytes && sigsHeld(payloadSigs(m)) <= maxRenderBytes
	})
	messages := messagesOf(nV)
	nA := largest(func(n int) bool {
		a := actionsOf(n)
		lean, ok := leanActionList(a, payloadSigs(messages))
		return ok && len(a) <= maxShownBytes && leanHeld(lean) <= maxRenderBytes
	})
	actions := actionsOf(nA)
	before := heaptest.Live()
	sigs := payloadSigs(messages)
	mid := heaptest.Live()
	lean, ok := leanActionList(actions, sigs)
	after := heaptest.Live()
	if !ok || len(sigs) != nV || len(lean) != nA {
		t.Fatalf("rendering failed: ok=%v, %d sigs, %d actions", ok, len(sigs), len(lean))
	}
	held := after - before
	const docFigure = 2 * maxRenderBytes * 5 / 4 // docs/SECURITY.md: the two renderings about 256 KiB at most
	t.Logf("%d actions (%d B), %d variants (%d B): renderings hold %d KiB (signatures %d KiB); estimated %d + %d KiB",
		nA, len(actions), nV, len(messages), held>>10, (mid-before)>>10, leanHeld(lean)>>10, sigsHeld(sigs)>>10)
	if held > docFigure {
		t.Errorf("a binding's renderings hold %d KiB, over the %d KiB the docs promise", held>>10, docFigure>>10)
	}
	if est := leanHeld(lean) + sigsHeld(sigs); uint64(est) < held*2/3 {
		t.Errorf("the estimates (%d B) are far under what the renderings hold (%d B)", est, held)
	}
	runtime.KeepAlive(sigs)
	runtime.KeepAlive(lean)
}

// description.messages over maxSigsBytes are not kept in the binding (a
// hello may carry up to 1 MiB of them, and its signatures ~2.4× that): the
// next observation reads them again. Smaller ones are kept.
func TestRememberBoundsSignatures(t *testing.T) {
	t.Parallel()
	e := &Executor{bindings: NewBindings(BindingsConfig{})}
	b, err := e.bindings.Bind("stdio", "", "agt_1111111111111111111")
	if err != nil {
		t.Fatal(err)
	}
	kept := func() (raw []byte, n int) {
		e.bindings.Update(b.Handle, func(b *Binding) { raw, n = b.sigsRaw, len(b.sigs) })
		return raw, n
	}
	small := []byte(`{"discriminant":"type","variants":{"addTask":{"title":"string"}}}`)
	e.remember(b.Handle, observation{messages: small, sigs: payloadSigs(small)})
	if raw, n := kept(); string(raw) != string(small) || n != 1 {
		t.Fatalf("small messages: kept %d bytes, %d signatures; want them kept", len(raw), n)
	}
	var vars []string
	for i := range 5000 {
		vars = append(vars, fmt.Sprintf(`"v%d":{"a":"string"}`, i))
	}
	big := []byte(`{"discriminant":"type","variants":{` + strings.Join(vars, ",") + `}}`)
	if len(big) <= maxSigsBytes {
		t.Fatalf("test messages are %d bytes, want over %d", len(big), maxSigsBytes)
	}
	e.remember(b.Handle, observation{messages: big, sigs: payloadSigs(big)})
	if raw, n := kept(); raw != nil || n != 0 {
		t.Errorf("%d bytes of messages: kept %d bytes, %d signatures; want none", len(big), len(raw), n)
	}
}

// An action list whose rendering would hold over maxRenderBytes is not kept
// in the binding (it is sent whole each time), though its JSON is far under
// maxShownBytes; a Taskboard-size list is kept.
func TestSetShownBoundsRendering(t *testing.T) {
	t.Parallel()
	list := func(n int) ([]byte, []leanAction) {
		acts := make([]string, n)
		for i := range n {
			acts[i] = fmt.Sprintf(`{"variant":"v%d"}`, i)
		}
		raw := []byte("[" + strings.Join(acts, ",") + "]")
		as, ok := leanActionList(raw, nil)
		if !ok {
			t.Fatal("rendering failed")
		}
		return raw, as
	}
	var b Binding
	raw, as := list(9)
	b.setShown(raw, as, true)
	if !b.shownSet {
		t.Fatal("a 9-action list was not kept")
	}
	raw, as = list(2000)
	if len(raw) > maxShownBytes {
		t.Fatalf("test list is %d bytes, want under %d", len(raw), maxShownBytes)
	}
	b.setShown(raw, as, true)
	if b.shownSet || b.shown != nil || b.shownRaw != nil {
		t.Errorf("a 2,000-action list (%d B of JSON, ~%d KiB rendered) was kept", len(raw), leanHeld(as)>>10)
	}
}
