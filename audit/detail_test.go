package audit

import (
	"encoding/json"
	"testing"
)

// TestDetailAsEncodingJSON: the detail the writer encodes by hand reads
// byte for byte as json.Marshal's, and it declines what it does not cover.
func TestDetailAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, d := range []map[string]any{
		nil, {},
		{"tool": "observe", "rid": "r-1"},
		{"variant": "addTask", "status": "dispatched", "rid": "abc"},
		{"z": 1, "a": int64(-7), "m": true, "b": false, "n": nil, "<&>": "x<y>&z", "é": "\u2028\u2029 \"q\" \\ \x01", "bad": "\xff"},
		{"k1": "", "k2": "", "k3": "", "k4": "", "k5": "", "k6": "", "k7": "", "k8": "", "k9": "", "k10": ""},
	} {
		want, _ := json.Marshal(d)
		if len(d) == 0 {
			want = []byte("{}")
		}
		got, ok := appendDetail([]byte("prefix"), d)
		if !ok || string(got) != "prefix"+string(want) {
			t.Errorf("appendDetail(%v) = %s, %v; json.Marshal %s", d, got, ok, want)
		}
	}
	for _, d := range []map[string]any{{"f": 1.5}, {"m": map[string]any{}}, {"s": []any{}}, {"u": uint8(1)}} {
		if _, ok := appendDetail(nil, d); ok {
			t.Errorf("appendDetail(%v) took a value it does not encode", d)
		}
	}
}

// TestBatchLines: a batch's lines and details are each entry's
// MarshalJSON and Detail, whichever way the detail was encoded.
func TestBatchLines(t *testing.T) {
	t.Parallel()
	es := []Entry{
		{At: 1, TID: "t", UID: "u", Event: EventLapCall, Detail: map[string]any{"tool": "observe", "rid": "r"}},
		{At: 2, Event: EventMsgDispatched, Detail: map[string]any{"f": 2.5, "nested": map[string]any{"a": []any{1, "x"}}}},
		{At: 3, TID: "<t>", Event: EventRefused},
		{At: 4, Event: EventRefused, Detail: map[string]any{"bad": make(chan int)}},
	}
	b := &Batch{Entries: es}
	b.encode()
	for i, e := range es {
		want, err := e.MarshalJSON()
		if i == 3 {
			want, err = Entry{At: 4, Event: EventRefused, Detail: map[string]any{"unencodable": "json: unsupported type: chan int"}}.MarshalJSON()
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(b.Line(i)) != string(want) {
			t.Errorf("line %d = %s, want %s", i, b.Line(i), want)
		}
		var line struct{ Detail json.RawMessage }
		_ = json.Unmarshal(want, &line)
		if string(b.Detail(i)) != string(line.Detail) {
			t.Errorf("detail %d = %s, want %s", i, b.Detail(i), line.Detail)
		}
	}
}
