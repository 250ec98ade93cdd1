package pairing

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeFrame: decoding untrusted tab frames never panics, a frame that
// decodes is valid JSON with the fields its type requires, and what is
// forwarded undecoded is valid JSON.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{"t":"hello","appName":"a","appVersion":"1","schemaHash":"h","lapVersion":2,"msgSchema":{},"visible":true}`,
		`{"t":"rpc-reply","id":"x","result":{"a":[1,2,3]}}`,
		`{"t":"rpc-error","id":"x","code":"invalid","detail":{"why":1}}`,
		`{"t":"state-update","id":"w","path":"/a","stateAfter":null}`,
		`{"t":"log-append","entry":{"id":"1","kind":"read"}}`,
		`{"t":"confirm-resolved","confirmId":"c","outcome":"confirmed","stateAfter":{}}`,
		`{"t":"visibility","visible":false}`,
		`{"t":"ping"}`, `{"t":"zzz"}`, `{}`, `[]`, `null`, `{"t":"hello","lapVersion":1e400}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeFrame(b)
		if err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("decodeFrame accepted invalid JSON %q", b)
		}
		switch fr.T {
		case "rpc-reply", "state-update":
			if fr.ID == "" {
				t.Fatalf("%s without id accepted", fr.T)
			}
			if (len(fr.Result) > 0 && !json.Valid(fr.Result)) || (len(fr.StateAfter) > 0 && !json.Valid(fr.StateAfter)) {
				t.Fatal("invalid JSON accepted for forwarding")
			}
		case "rpc-error":
			if fr.ID == "" || fr.Code == "" {
				t.Fatal("rpc-error without id/code accepted")
			}
			_ = detailString(fr.Detail)
		case "log-append":
			if !json.Valid(fr.Entry) {
				t.Fatal("invalid entry accepted")
			}
			_ = entryKind(fr.Entry)
		case "visibility":
			if fr.Visible == nil {
				t.Fatal("visibility without visible accepted")
			}
		case "confirm-resolved":
			if fr.ConfirmID == "" || (fr.Outcome != "confirmed" && fr.Outcome != "user-cancelled") {
				t.Fatalf("confirm-resolved %q/%q accepted", fr.ConfirmID, fr.Outcome)
			}
		}
	})
}
