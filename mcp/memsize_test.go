package mcp

import (
	"fmt"
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
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var acts, vars []string
	for i, n := 0, 2; ; i++ { // n: the list's length with brackets and commas
		a := fmt.Sprintf(`{"variant":"v%d"}`, i)
		if n += len(a) + 1; n > maxShownBytes {
			break
		}
		acts = append(acts, a)
	}
	for i, n := 0, 40; ; i++ {
		v := fmt.Sprintf(`"v%d":{"a":"string"}`, i)
		if n += len(v) + 1; n > maxSigsBytes {
			break
		}
		vars = append(vars, v)
	}
	actions := []byte("[" + strings.Join(acts, ",") + "]")
	messages := []byte(`{"discriminant":"type","variants":{` + strings.Join(vars, ",") + `}}`)
	before := heap()
	sigs := payloadSigs(messages)
	mid := heap()
	lean, ok := leanActionList(actions, sigs)
	after := heap()
	if !ok || len(sigs) != len(vars) {
		t.Fatalf("rendering failed: ok=%v, %d sigs", ok, len(sigs))
	}
	held := after - before
	const docFigure = 2 << 20 // docs/SECURITY.md: 1.6 MiB measured (1.7 under -race); at most 2
	t.Logf("%d actions (%d B) and %d variants (%d B): renderings hold %d KiB (signatures %d KiB)", len(lean), len(actions), len(sigs), len(messages), held>>10, (mid-before)>>10)
	if held > docFigure {
		t.Errorf("a binding's renderings hold %d KiB, over the %d KiB the docs promise", held>>10, docFigure>>10)
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
