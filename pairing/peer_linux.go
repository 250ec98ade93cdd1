//go:build linux

package pairing

import (
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerSockopt sets TCP_USER_TIMEOUT on a peer-link socket: data the other
// machine has not acknowledged within peerUserTimeout ends the connection
// (and bounds the keep-alive probes the same way), where TCP alone would
// retransmit for about 15 minutes.
func peerSockopt(rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(peerUserTimeout.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}

// netID names this process's network namespace on this running kernel:
// the kernel's boot id and the namespace's inode. Two nodes share a
// loopback address exactly when their netIDs are equal (an inode alone
// repeats across machines: every machine's first namespace has the same).
// "" when /proc cannot say.
func netID() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + strings.Trim(strings.TrimPrefix(ns, "net:"), "[]")
}
