// Package syncbuf is a text buffer that one goroutine may write (a logger,
// an audit sink) while another reads it, for tests that read what lapd
// logged.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is a strings.Builder guarded by a mutex. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
