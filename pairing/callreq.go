package pairing

import (
	"encoding/json"
	"strconv"

	"github.com/lapd-dev/lapd/internal/jsonscan"
)

// A forwarded request's body (callReq) is encoded and decoded on every
// forwarded call; encoding/json's reflection took ~2.5 µs of the two nodes'
// CPU per call for ~150 bytes. These do the same by hand: appendCallReq
// writes what json.Marshal writes (FuzzCallReq checks that it decodes to
// the same value), and decodeCallReq reads the members it knows in one
// jsonscan pass, handing anything else (an unknown or differently cased
// key, a null, a number that is not a plain integer) to json.Unmarshal, so
// it accepts and refuses exactly what json.Unmarshal does.

// appendCallReq appends req as JSON (omitempty members left out). To a nil
// b it appends in one buffer sized for it (growing from nothing took four
// or five allocations per forwarded call).
func appendCallReq(b []byte, req *callReq) []byte {
	if b == nil {
		b = make([]byte, 0, callReqSize(req))
	}
	b = append(b, '{')
	n := len(b)
	key := func(name string) {
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	str := func(name, v string) {
		if v == "" {
			return
		}
		key(name)
		if plainString(v) {
			b = append(b, '"')
			b = append(b, v...)
			b = append(b, '"')
		} else {
			q, _ := json.Marshal(v)
			b = append(b, q...)
		}
	}
	num := func(name string, v int64) {
		if v != 0 {
			key(name)
			b = strconv.AppendInt(b, v, 10)
		}
	}
	str("tool", req.Tool)
	if len(req.Args) > 0 {
		key("args")
		if jsonscan.Valid(req.Args) {
			b = append(b, req.Args...)
		} else { // json.Marshal fails on an invalid RawMessage; here, null
			b = append(b, "null"...)
		}
	}
	num("timeoutMs", req.TimeoutMs)
	num("waitMs", req.WaitMs)
	str("path", req.Path)
	num("n", int64(req.N))
	str("kind", req.Kind)
	if req.Probe {
		key("probe")
		b = append(b, "true"...)
	}
	str("rid", req.RID)
	str("expect", req.Expect)
	return append(b, '}')
}

// decodeCallReq decodes data into req as json.Unmarshal(data, req) would.
// args is copied (data may be a reused buffer).
func decodeCallReq(data []byte, req *callReq) error {
	var out callReq
	ok := true
	valid := jsonscan.Object(data, func(key, v []byte) {
		if !ok {
			return
		}
		switch string(key) {
		case "tool":
			out.Tool, ok = jsonscan.String(v)
		case "path":
			out.Path, ok = jsonscan.String(v)
		case "kind":
			out.Kind, ok = jsonscan.String(v)
		case "rid":
			out.RID, ok = jsonscan.String(v)
		case "expect":
			out.Expect, ok = jsonscan.String(v)
		case "args":
			out.Args = append(json.RawMessage(nil), v...)
		case "timeoutMs":
			out.TimeoutMs, ok = plainInt(v, 64)
		case "waitMs":
			out.WaitMs, ok = plainInt(v, 64)
		case "n":
			var n int64
			n, ok = plainInt(v, strconv.IntSize)
			out.N = int(n)
		case "probe":
			out.Probe, ok = jsonscan.Bool(v)
		default:
			ok = false // unknown, or a key json.Unmarshal would match case-insensitively
		}
	})
	if !valid || !ok {
		return json.Unmarshal(data, req)
	}
	*req = out
	return nil
}

// plainInt reads a JSON number that is a plain integer (json.Unmarshal
// refuses a fraction or an exponent for an integer field; those, and
// numbers out of range, report false).
func plainInt(v []byte, bits int) (int64, bool) {
	i, err := strconv.ParseInt(string(v), 10, bits)
	if err != nil || (len(v) > 1 && v[0] == '0') || (len(v) > 2 && v[0] == '-' && v[1] == '0') || (len(v) > 0 && v[0] == '+') {
		return 0, false
	}
	return i, true
}

// callReqSize is an upper bound of appendCallReq's output for req, unless
// a string needs escaping: the member names, three numbers of at most 20
// digits, and the values.
func callReqSize(req *callReq) int {
	return 192 + len(req.Tool) + len(req.Args) + len(req.Path) + len(req.Kind) + len(req.RID) + len(req.Expect)
}
