package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// MaxLine is the longest JSONL line Query reads; longer lines count as
// malformed and are skipped.
const MaxLine = 1 << 20

// ErrClosed is returned by a sink's Write after Close.
var ErrClosed = errors.New("audit: sink closed")

// JSONLSink writes one JSON object per line ({at, tid|null, uid|null, event,
// detail}) to a writer. Writes are serialized, each line is written by one
// Write call, and the sink is safe for concurrent use.
//
// A file sink with a Retention rotates: when the file reaches half of
// MaxBytes, or its oldest entry half of MaxAge, it is renamed to PATH.1
// (replacing the previous one) and a new file starts; PATH.1 is deleted
// once its newest entry is older than half of MaxAge. So the two files stay
// under about MaxBytes, entries are kept at least MaxAge/2 and at most
// MaxAge, and Query reads PATH.1 then PATH.
type JSONLSink struct {
	mu     sync.Mutex
	w      io.Writer
	f      *os.File // set by OpenJSONLFile; nil for NewJSONLSink
	path   string
	closed bool
	buf    []byte

	ret       Retention
	size      int64 // bytes in the current file
	oldest    int64 // ms of the current file's first entry; 0 = unknown/empty
	lastCheck time.Time
	clock     func() time.Time

	skipped atomic.Int64
}

var (
	_ BatchSink = (*JSONLSink)(nil)
	_ Querier   = (*JSONLSink)(nil)
)

// NewJSONLSink returns a sink that writes to w (typically os.Stdout). Close
// does not close w. It cannot be queried: Query returns an error.
func NewJSONLSink(w io.Writer) *JSONLSink { return &JSONLSink{w: w} }

// OpenJSONLFile opens (or creates, mode 0600) the file at path for appending
// and returns a sink that writes to it and can Query it. Close closes the file.
func OpenJSONLFile(path string) (*JSONLSink, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	s := &JSONLSink{w: f, f: f, path: path, clock: time.Now}
	if st, err := f.Stat(); err == nil {
		s.size = st.Size()
	}
	s.oldest = firstEntryAt(path)
	return s, nil
}

// SetRetention makes a file sink rotate and delete old entries (see
// JSONLSink); a stream sink ignores it. Call it before the sink is used.
func (s *JSONLSink) SetRetention(r Retention) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ret = r
}

// firstEntryAt reads the at of the first entry in the file at path (0 if
// none can be read).
func firstEntryAt(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	line, _ := bufio.NewReaderSize(f, 4096).ReadSlice('\n')
	var e struct{ At int64 }
	if json.Unmarshal(line, &e) != nil {
		return 0
	}
	return e.At
}

// rotateLocked applies the retention before a write of entries starting at
// firstAt. Caller holds s.mu.
func (s *JSONLSink) rotateLocked(firstAt int64) error {
	if s.f == nil || (s.ret.MaxAge <= 0 && s.ret.MaxBytes <= 0) {
		return nil
	}
	now := s.clock()
	old := s.path + ".1"
	if s.ret.MaxAge > 0 && now.Sub(s.lastCheck) >= pruneEvery {
		s.lastCheck = now
		if st, err := os.Stat(old); err == nil && now.Sub(st.ModTime()) > s.ret.MaxAge/2 {
			if err := os.Remove(old); err != nil {
				return fmt.Errorf("audit: retention: %w", err)
			}
		}
	}
	if s.oldest == 0 {
		s.oldest = firstAt
	}
	full := s.ret.MaxBytes > 0 && s.size >= s.ret.MaxBytes/2
	aged := s.ret.MaxAge > 0 && s.oldest > 0 && now.UnixMilli()-s.oldest >= (s.ret.MaxAge/2).Milliseconds()
	if !full && !aged {
		return nil
	}
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	if err := os.Rename(s.path, old); err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	s.f, s.w, s.size, s.oldest = f, f, 0, firstAt
	return nil
}

// Write appends e as one line.
func (s *JSONLSink) Write(_ context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit: encode %s entry: %w", e.Event, err)
	}
	b = append(b, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.rotateLocked(e.At); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	s.size += int64(len(b))
	return nil
}

// WriteBatch appends every entry of b with one write.
func (s *JSONLSink) WriteBatch(_ context.Context, b *Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	buf := s.buf[:0]
	for i := range b.Entries {
		buf = append(buf, b.Line(i)...)
		buf = append(buf, '\n')
	}
	if cap(buf) <= 64<<10 { // keep a modest buffer between batches
		s.buf = buf
	}
	if err := s.rotateLocked(b.Entries[0].At); err != nil {
		return err
	}
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	s.size += int64(len(buf))
	return nil
}

// Close closes the file of OpenJSONLFile; later writes fail with ErrClosed.
func (s *JSONLSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

// Query reads the file of OpenJSONLFile from the start and returns the
// entries that match f, in file order. Malformed lines are skipped and
// counted (see Skipped).
func (s *JSONLSink) Query(ctx context.Context, f Filter) ([]Entry, error) {
	if s.path == "" {
		return nil, errors.New("audit: this JSONL sink writes to a stream and cannot be queried")
	}
	r, err := os.Open(s.path)
	if err != nil {
		return nil, fmt.Errorf("audit: query %s: %w", s.path, err)
	}
	defer r.Close()
	var src io.Reader = r
	if old, err := os.Open(s.path + ".1"); err == nil {
		defer old.Close()
		src = io.MultiReader(old, r) // every line ends in a newline: files never join
	}
	entries, skipped, err := ScanJSONL(ctx, src, f)
	s.skipped.Store(int64(skipped))
	if err != nil {
		return nil, fmt.Errorf("audit: query %s: %w", s.path, err)
	}
	return entries, nil
}

// Skipped reports how many malformed lines the last Query skipped.
func (s *JSONLSink) Skipped() int64 { return s.skipped.Load() }

// ScanJSONL reads JSONL audit entries from r and returns those that match f
// (the newest f.Limit of them when set, after skipping the newest f.Offset,
// oldest first) and how many lines it
// skipped because they were not an entry or longer than MaxLine. Blank lines
// are ignored.
func ScanJSONL(ctx context.Context, r io.Reader, f Filter) (entries []Entry, skipped int, err error) {
	keep := f.Limit
	if keep > 0 && f.Offset > 0 {
		keep += f.Offset
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	tooLong := false
	for n := 0; ; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, skipped, err
			}
		}
		chunk, isPrefix, rerr := br.ReadLine()
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, skipped, rerr
		}
		if !tooLong {
			if len(line)+len(chunk) > MaxLine {
				tooLong, line = true, line[:0]
			} else {
				line = append(line, chunk...)
			}
		}
		if isPrefix {
			continue
		}
		if tooLong {
			skipped++
		} else if l := bytes.TrimSpace(line); len(l) > 0 {
			var e Entry
			if json.Unmarshal(l, &e) != nil || e.Event == "" {
				skipped++
			} else if f.match(e) {
				entries = append(entries, e)
				if keep > 0 && len(entries) > 2*keep {
					entries = append(entries[:0], entries[len(entries)-keep:]...)
				}
			}
		}
		line, tooLong = line[:0], false
	}
	if keep > 0 && len(entries) > keep {
		entries = entries[len(entries)-keep:]
	}
	if f.Limit > 0 && f.Offset > 0 {
		entries = entries[:max(len(entries)-f.Offset, 0)]
		if len(entries) > f.Limit {
			entries = entries[len(entries)-f.Limit:]
		}
	}
	return entries, skipped, nil
}

// marshalDetail encodes a detail map compactly without HTML escaping.
func marshalDetail(d map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
