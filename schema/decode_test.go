package schema

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// FuzzDecodePayload: decodePayload gives the validator what
// jsonschema.UnmarshalJSON gives it, value for value, and fails where it
// fails; it says bad exactly when a number is out of bounds.
func FuzzDecodePayload(f *testing.F) {
	for _, s := range []string{`{}`, `{"title":"Buy milk","column":"todo"}`, ` {"a" : [1, -2.5e3, "x\u00e9\ud800", true, false, null, {"b":[]}]} `,
		`{"a":1,"a":2}`, `[1,2]`, `"s"`, `12`, `{"a":1}x`, "{\"\xff\":\"\xfe\"}", `{"a":` + strings.Repeat(`[`, 20) + strings.Repeat(`]`, 20) + `}`,
		`{"n":1e400}`, `{"n":1e401}`, `{"n":[1E-1000000]}`, `{"n":-0}`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, werr := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		got, bad, err := decodePayload(b)
		if (err == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("decodePayload(%q) = %#v, %v; jsonschema.UnmarshalJSON %#v, %v", b, got, err, want, werr)
		}
		if werr == nil && bad != (len(badNumbers(want, nil, nil)) > 0) {
			t.Fatalf("decodePayload(%q): bad = %v, badNumbers %v", b, bad, badNumbers(want, nil, nil))
		}
	})
}

func TestDecodePayloadFastPath(t *testing.T) {
	t.Parallel()
	for _, s := range []string{`{"title":"Buy milk"}`, `{"a":[1,{"b":null}],"c":"\u00e9"}`} {
		if _, ok := decodeValue([]byte(s), 0); !ok {
			t.Errorf("decodeValue(%s) took the slow path", s)
		}
	}
	deep := `{"a":` + strings.Repeat(`[`, fastDecodeDepth+1) + strings.Repeat(`]`, fastDecodeDepth+1) + `}`
	if _, ok := decodeValue([]byte(deep), 0); ok {
		t.Errorf("decodeValue took a payload nested deeper than %d", fastDecodeDepth)
	}
}
