//go:build !linux

package pairing

import "syscall"

// peerSockopt: TCP_USER_TIMEOUT is Linux's; elsewhere the keep-alive probes
// alone find a machine that is gone.
func peerSockopt(syscall.RawConn) error { return nil }

// netID: unknown here, so a loopback address is dialled whatever machine
// advertised it (a refusal then sends its requests by NATS).
func netID() string { return "" }
