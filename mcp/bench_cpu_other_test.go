//go:build !linux

package mcp

import "time"

// threadCPU: not measured off Linux.
func threadCPU() time.Duration { return -1 }
