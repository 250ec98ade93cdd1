// Package heaptest measures what the Go heap holds, for the tests that
// check a byte budget counts at least what it keeps (the
// …SizesCoverTheHeap tests of confirm, lap, pairing, mcp and lapd): a
// budget that counts less than the heap holds lets a session keep several
// times the memory it is allowed.
package heaptest

import "runtime"

// Live returns the bytes of live heap objects after two collections (the
// second sweeps what finalizers and the first one's cleanups freed).
func Live() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
