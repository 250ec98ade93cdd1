package lap_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lap"
)

func TestClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired()
	unpaired, _ := e.mint()
	clients := map[string]lap.Client{
		"http":       lap.NewHTTPClient(e.srv.Client()),
		"in-process": e.lap.Client(),
	}
	base := e.srv.URL + "/agent/lap/v1"
	for name, c := range clients {
		ctx := ctxT(t)
		res, err := c.Call(ctx, base, token, "/state", map[string]string{"path": "/count"})
		if err != nil || string(res) != `{"state":0}` {
			t.Errorf("%s: %s %v", name, res, err)
		}
		_, err = c.Call(ctx, base, "agt_nope", "/state", nil)
		var le *lap.Error
		if !errors.As(err, &le) || le.Status != 401 || le.Code != "auth-failed" {
			t.Errorf("%s bad token: %v", name, err)
		}
		_, err = c.Call(ctx, base, unpaired, "/observe", nil)
		if !errors.As(err, &le) || le.Status != 503 || le.Code != "paused" || le.Reconnect != "pending" || le.RetryAfter != 5*time.Second {
			t.Errorf("%s paused: %#v", name, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := c.Call(cctx, base, token, "/state", nil); err == nil {
			t.Errorf("%s: cancelled ctx succeeded", name)
		}
	}
	_ = tab
	// network failure
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err := lap.NewHTTPClient(nil).Call(ctxT(t), dead.URL, token, "/state", nil)
	var le *lap.Error
	if !errors.As(err, &le) || le.Code != "network" || le.Status != 0 {
		t.Errorf("network: %#v", err)
	}
}
