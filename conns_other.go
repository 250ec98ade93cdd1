//go:build !unix

package lapd

// openFileLimit: unknown here.
func openFileLimit() uint64 { return 0 }
