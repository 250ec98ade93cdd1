package lap

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadBody: readBody reads what io.ReadAll(io.LimitReader(r, limit+1))
// reads, whatever length was declared.
func TestReadBody(t *testing.T) {
	t.Parallel()
	const limit = 1000
	for _, n := range []int{0, 1, 511, 512, 513, 999, 1000, 1001, 5000} {
		body := strings.Repeat("x", n)
		want, _ := io.ReadAll(io.LimitReader(strings.NewReader(body), limit+1))
		for _, declared := range []int64{-1, 0, int64(n), int64(n) + 7, limit + 1} {
			for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)), iotest.DataErrReader(strings.NewReader(body))} {
				got, err := readBody(r, declared, limit)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("n %d declared %d: %d bytes, %v; want %d", n, declared, len(got), err, len(want))
				}
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readBody(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 10, limit); !errors.Is(err, boom) {
		t.Fatalf("error %v, want boom", err)
	}
}
