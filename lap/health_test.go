package lap

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/lapd-dev/lapd/pairing"
)

// TestHealthAsEncodingJSON: /observe's health is written by hand as
// json.Marshal writes a pairing.Health; a field added there must be added
// to appendHealth too.
func TestHealthAsEncodingJSON(t *testing.T) {
	t.Parallel()
	if n := reflect.TypeFor[pairing.Health]().NumField(); n != 5 {
		t.Fatalf("pairing.Health has %d fields; appendHealth writes 5: update it", n)
	}
	yes, no := true, false
	for _, h := range []pairing.Health{
		{},
		{Connected: true, Visible: &yes, LastHeartbeat: 1764115200123, ConnectedAt: 1764115100000, Reconnects: 3},
		{Visible: &no, LastHeartbeat: -1, Reconnects: -2},
		{Connected: true, ConnectedAt: 1},
	} {
		want, _ := json.Marshal(h)
		if got := appendHealth(nil, h); string(got) != string(want) {
			t.Errorf("appendHealth(%+v) = %s, json.Marshal %s", h, got, want)
		}
	}
}
