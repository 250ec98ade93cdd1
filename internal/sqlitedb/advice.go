package sqlitedb

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
)

// SQLite's primary result codes that an operator can act on.
const (
	codeBusy     = 5
	codeIOErr    = 10
	codeLocked   = 6
	codeReadOnly = 8
	codeCorrupt  = 11
	codeFull     = 13
	codeCantOpen = 14
	codeNotADB   = 26
)

// Advice says, in a sentence for whoever runs lapd, what to do about err,
// an error from opening or using the database at path; "" when there is
// nothing to add. lapd used to stop with SQLite's words only ("file is not
// a database (26)", "database disk image is malformed (11)").
func Advice(path string, err error) string {
	if err == nil {
		return ""
	}
	dir := filepath.Dir(path)
	var se interface{ Code() int }
	code := -1
	if errors.As(err, &se) {
		code = se.Code() & 0xff
	} else if pe := (*fs.PathError)(nil); !errors.As(err, &pe) || !strings.HasPrefix(pe.Path, path) {
		return "" // not about this database (another file lapd opens, such as an audit file)
	}
	switch {
	case code == codeCorrupt || code == codeNotADB:
		return fmt.Sprintf("%s is damaged or is not lapd's database: stop lapd, move it aside with its -wal and -shm files "+
			"and start again (lapd creates an empty one: tokens, pending approvals and the audit trail in the old file stay behind), "+
			"or put back a copy from a backup", path)
	case code == codeFull || errors.Is(err, syscall.ENOSPC):
		return fmt.Sprintf("the disk holding %s is full: free space there (the audit trail's share is bounded by --audit-retention)", dir)
	case code == codeReadOnly || errors.Is(err, syscall.EROFS):
		return fmt.Sprintf("lapd cannot write %s: its file system must be mounted read-write and the user lapd runs as must own %s and its files", path, dir)
	case code == codeCantOpen || errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("lapd cannot open %s: the user lapd runs as must be able to read and write %s and its files "+
			"(chown them, or choose another --data-dir / LAPD_DATA_DIR)", path, dir)
	case code == codeIOErr:
		return fmt.Sprintf("the file system holding %s failed a read or a write: is it full (df), over a file size limit (ulimit -f) or failing (dmesg)?", dir)
	case code == codeBusy || code == codeLocked:
		return fmt.Sprintf("another process holds %s locked (another lapd on the same --data-dir?): stop it, or choose another --data-dir", path)
	}
	return ""
}
