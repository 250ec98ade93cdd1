package pairing_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// A Registry serves /agent/ws; Call sends an rpc frame to the tab and returns
// its reply.
func ExampleRegistry() {
	ctx := context.Background()
	tm, _ := tokens.NewManager(tokens.Config{Store: tokens.NewMemoryStore()})
	paired := make(chan string, 1)
	reg, _ := pairing.New(pairing.Config{Tokens: tm, Hooks: pairing.Hooks{
		OnPaired: func(tid string, _ bool) { paired <- tid },
	}})
	srv := httptest.NewServer(reg)
	defer srv.Close()
	defer reg.Shutdown(ctx)

	// The browser tab: connect with the token, say hello, answer one rpc.
	token, rec, _ := tm.Mint(ctx, "", srv.URL, "")
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/agent/ws?token="+token, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ws.CloseNow()
	_ = wsjson.Write(ctx, ws, map[string]any{"t": "hello", "appName": "demo", "schemaHash": "h", "lapVersion": 2})
	go func() {
		for {
			var f map[string]any
			if wsjson.Read(ctx, ws, &f) != nil {
				return
			}
			if f["t"] == "rpc" {
				_ = wsjson.Write(ctx, ws, map[string]any{"t": "rpc-reply", "id": f["id"], "result": map[string]any{"state": 42}})
			}
		}
	}()

	<-paired
	res, err := reg.Call(ctx, rec.TID, "get_state", map[string]any{}, 0)
	fmt.Println(string(res), err)
	// Output: {"state":42} <nil>
}
