package pairing

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestHealthAsEncodingJSON: /observe's health is written by hand as
// json.Marshal writes a Health; a field added there must be added
// to appendHealth too.
func TestHealthAsEncodingJSON(t *testing.T) {
	t.Parallel()
	if n := reflect.TypeFor[Health]().NumField(); n != 5 {
		t.Fatalf("Health has %d fields; AppendJSON writes 5: update it", n)
	}
	yes, no := true, false
	for _, h := range []Health{
		{},
		{Connected: true, Visible: &yes, LastHeartbeat: 1764115200123, ConnectedAt: 1764115100000, Reconnects: 3},
		{Visible: &no, LastHeartbeat: -1, Reconnects: -2},
		{Connected: true, ConnectedAt: 1},
	} {
		want, _ := json.Marshal(h)
		if got := h.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("AppendJSON(%+v) = %s, json.Marshal %s", h, got, want)
		}
	}
}
