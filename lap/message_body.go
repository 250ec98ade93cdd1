package lap

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/internal/jsonscan"
)

// The /message body is read and the send_message arguments written without
// reflection: one jsonscan pass over the body, whose fields stay in place
// (they alias c.body), and the arguments appended in the order json.Marshal
// of a map would write them. Both answer byte for byte as encoding/json did
// (TestMessageBodyAsEncodingJSON, FuzzMessageBody); anything unusual (a key
// that is not ASCII, which encoding/json matches by Unicode case folding)
// takes encoding/json's own path.

// decodeMessage reads the /message body as c.decode(&messageBody{}) does:
// fields matched by exact name, else case-insensitively; the last of a
// repeated field wins; a body that is not an object leaves every field
// empty.
func (c *call) decodeMessage() messageBody {
	var b messageBody
	t := trimSpace(c.body)
	if len(t) == 0 || t[0] != '{' {
		return b
	}
	slow := false
	ok := jsonscan.Object(t, func(k, v []byte) {
		if f := b.field(k); f != nil {
			*f = v
			return
		}
		for _, ch := range k {
			if ch >= utf8.RuneSelf {
				slow = true
			}
		}
	})
	if !ok || slow {
		b = messageBody{}
		c.decode(&b)
	}
	return b
}

// field is the member named k (ASCII) as encoding/json matches it: the
// exact name, else the one equal under case folding; nil for none.
func (b *messageBody) field(k []byte) *json.RawMessage {
	switch string(k) {
	case "msg":
		return &b.Msg
	case "reason":
		return &b.Reason
	case "waitFor":
		return &b.WaitFor
	case "drainQuietMs":
		return &b.DrainQuietMs
	case "timeoutMs":
		return &b.TimeoutMs
	case "includeState":
		return &b.IncludeState
	case "idempotencyKey":
		return &b.IdempotencyKey
	case "approvalTimeoutMs":
		return &b.ApprovalTimeoutMs
	}
	for _, ch := range k {
		if ch >= utf8.RuneSelf {
			return nil // the caller falls back to encoding/json
		}
	}
	for _, f := range [...]struct {
		name string
		p    *json.RawMessage
	}{{"msg", &b.Msg}, {"reason", &b.Reason}, {"waitFor", &b.WaitFor}, {"drainQuietMs", &b.DrainQuietMs},
		{"timeoutMs", &b.TimeoutMs}, {"includeState", &b.IncludeState}, {"idempotencyKey", &b.IdempotencyKey},
		{"approvalTimeoutMs", &b.ApprovalTimeoutMs}} {
		if strings.EqualFold(string(k), f.name) {
			return f.p
		}
	}
	return nil
}

// sendArgs is the send_message rpc's arguments: the body's msg, reason,
// waitFor, drainQuietMs, timeoutMs and includeState when present, and with
// an idempotency key, the key and ttl (the tab de-duplicates by key too:
// client/lapd.js keeps it for ttl, across a reload, the end-to-end guarantee
// of docs/PROTOCOL.md). The bytes are json.Marshal's of the map
// {name: json.RawMessage}: keys sorted, values compacted and HTML-escaped.
func (b *messageBody) sendArgs(key string, ttl time.Duration) ([]byte, error) {
	n := len(b.Msg) + len(b.Reason) + len(b.WaitFor) + len(b.DrainQuietMs) + len(b.TimeoutMs) + len(b.IncludeState) + len(key)
	out := make([]byte, 0, n+128)
	out = append(out, '{')
	var err error
	add := func(name string, v []byte) {
		if err != nil {
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, name...)
		out = append(out, '"', ':')
		out, err = appendRawJSON(out, v)
	}
	opt := func(name string, v []byte) {
		if len(v) > 0 {
			add(name, v)
		}
	}
	// sorted by key, as json.Marshal writes a map
	opt("drainQuietMs", b.DrainQuietMs)
	if key != "" {
		kb, _ := json.Marshal(key)
		add("idempotencyKey", kb)
		add("idempotencyTtlMs", strconv.AppendInt(nil, ttl.Milliseconds(), 10))
	}
	opt("includeState", b.IncludeState)
	add("msg", b.Msg)
	opt("reason", b.Reason)
	opt("timeoutMs", b.TimeoutMs)
	opt("waitFor", b.WaitFor)
	if err != nil {
		return nil, err
	}
	return append(out, '}'), nil
}

// appendRawJSON appends v as json.Marshal writes a json.RawMessage: null
// when empty, else compacted with <, >, &, U+2028 and U+2029 escaped. v
// that is compact already and holds none of those is copied as it is (it
// comes from a body the gate found valid).
func appendRawJSON(out, v []byte) ([]byte, error) {
	if len(v) == 0 {
		return append(out, "null"...), nil
	}
	if !compactSafe(v) {
		mb, err := json.Marshal(json.RawMessage(v))
		if err != nil {
			return out, err
		}
		return append(out, mb...), nil
	}
	return append(out, v...), nil
}

// compactSafe reports whether valid JSON v has no white space outside its
// strings and no byte json.Marshal would escape (<, >, &, and 0xE2, which
// leads U+2028 and U+2029).
func compactSafe(v []byte) bool {
	in := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '<', '>', '&', 0xE2:
			return false
		case '\\':
			i++ // in a string: the escaped byte is ASCII and not a quote that ends it
		case '"':
			in = !in
		case ' ', '\t', '\n', '\r':
			if !in {
				return false
			}
		}
	}
	return true
}
