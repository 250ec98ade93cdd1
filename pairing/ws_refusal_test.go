package pairing

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// Refused upgrades are audited within one budget for all of IPv4 loopback:
// connecting from many 127.x.y.z addresses does not multiply it.
func TestRefusedUpgradeBudgetPerClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 30 {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 9, byte(i+1))}}
		hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		req, _ := http.NewRequestWithContext(context.Background(), "GET", e.srv.URL+"/agent/ws?token=agt_"+strconv.Itoa(i), nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("bad token: %d", res.StatusCode)
		}
	}
	written := 0
	for _, en := range e.sink.find(audit.EventRefused) {
		if en.Detail["aggregated"] == nil {
			written++
		}
	}
	if written == 0 || written > 10 {
		t.Fatalf("%d refused-upgrade entries written for 30 refusals from 30 loopback addresses, want at most the budget of 10", written)
	}
}
