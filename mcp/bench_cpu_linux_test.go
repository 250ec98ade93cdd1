//go:build linux

package mcp

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPU is the CPU time the calling thread has used
// (CLOCK_THREAD_CPUTIME_ID); -1 when it cannot be read.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return -1
	}
	return time.Duration(ts.Nano())
}
