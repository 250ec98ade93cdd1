package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var seeds = []string{
	`{}`, ` { } `, `{"t":"rpc-reply","id":"a","result":{"state":{"x":[1,2,{"y":null}]}}}`,
	`{"a":1,"a":2}`, `{"k\u0074":"v"}`, `{"t":"x\"y\\z\/\b\f\n\r\t\u00e9"}`, `[1,2,3]`, ` [ ] `, `[ 1 , {"a":[2]} , "x" ]`, `[1 2]`, `[1]]`, `"s"`, `-0.5e+10`, `true`, `null`,
	`{"a":}`, `{"a" 1}`, `{a:1}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `1e`, `-`, `"\x"`, "\"a\x01\"", `{"a":1}x`, `{"a":"é"}`,
	"\"\xff\"", `{"a":[[[[]]]]}`, `tru`, `{"":""}`, `"\u12G4"`, `[` + strings.Repeat(`"abcdefghij",`, 50) + `1]`,
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	`{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`, `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
}

// FuzzAgainstEncodingJSON: Valid and Object accept exactly what
// encoding/json accepts, and Object's members are what encoding/json
// decodes into map[string]json.RawMessage.
func FuzzAgainstEncodingJSON(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid = %v", short(b), got, want)
		}
		var elems []json.RawMessage
		aok := Array(b, func(v []byte) { elems = append(elems, append(json.RawMessage(nil), v...)) })
		var welems []json.RawMessage
		if aerr := json.Unmarshal(b, &welems); aok != (aerr == nil && welems != nil) {
			t.Fatalf("Array(%q) = %v, encoding/json array: %v (%v)", short(b), aok, welems != nil, aerr)
		}
		if aok {
			if len(elems) != len(welems) {
				t.Fatalf("Array(%q): %d elements, encoding/json %d", short(b), len(elems), len(welems))
			}
			for i := range welems {
				if !bytes.Equal(elems[i], bytes.TrimSpace(welems[i])) {
					t.Fatalf("Array(%q)[%d] = %q, encoding/json %q", short(b), i, elems[i], welems[i])
				}
			}
		}
		got := map[string]json.RawMessage{}
		ok := Object(b, func(k, v []byte) { got[string(k)] = append(json.RawMessage(nil), v...) })
		var want map[string]json.RawMessage
		werr := json.Unmarshal(b, &want)
		isObj := werr == nil && want != nil
		if ok != isObj {
			t.Fatalf("Object(%q) = %v, encoding/json object: %v (%v)", short(b), ok, isObj, werr)
		}
		if !ok {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("Object(%q): %d members, encoding/json %d", b, len(got), len(want))
		}
		for k, w := range want {
			if !bytes.Equal(got[k], bytes.TrimSpace(w)) {
				t.Fatalf("Object(%q)[%q] = %q, encoding/json %q", b, k, got[k], w)
			}
			var ws string
			if json.Unmarshal(w, &ws) == nil {
				if s, ok := String(got[k]); !ok || s != ws {
					t.Fatalf("String(%q) = %q %v, encoding/json %q", got[k], s, ok, ws)
				}
			} else if _, ok := String(got[k]); ok {
				t.Fatalf("String(%q) accepted a non-string", got[k])
			}
		}
	})
}

func short(b []byte) []byte {
	if len(b) > 200 {
		return append(b[:100:100], "…"...)
	}
	return b
}

func TestObjectKeys(t *testing.T) {
	var keys []string
	if !Object([]byte(`{"t":"a","k\u0065y":1,"t":"b"}`), func(k, v []byte) { keys = append(keys, string(k)+"="+string(v)) }) {
		t.Fatal("valid object refused")
	}
	if strings.Join(keys, " ") != `t="a" key=1 t="b"` {
		t.Errorf("members %v", keys)
	}
}

func BenchmarkFrame(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"t":"rpc-reply","id":"0b0f3f2e-6c1e-4d8e-9a3b-1c2d3e4f5a6b","result":{"state":{"tasks":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"id":12,"title":"Task number 12: write the quarterly report draft","column":"doing","done":false}`)
	}
	sb.WriteString(`]}}}`)
	frame := []byte(sb.String())
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		for range b.N {
			var res []byte
			Object(frame, func(k, v []byte) {
				if string(k) == "result" {
					res = v
				}
			})
			if len(res) == 0 {
				b.Fatal("no result")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		for range b.N {
			var f struct {
				T      string          `json:"t"`
				ID     string          `json:"id"`
				Result json.RawMessage `json:"result"`
			}
			if json.Unmarshal(frame, &f) != nil || len(f.Result) == 0 {
				b.Fatal("no result")
			}
		}
	})
}
