package lapdtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lapdtest"
)

// A lapd in-process, a tab playing a small app, and the LLM's side over LAP:
// one dispatch, one approval the "human" gives on cue.
func Example() {
	ctx := context.Background()
	srv := lapdtest.NewServer(lapd.Config{})
	defer srv.Close()

	counter := lapdtest.App{
		Name:  "Counter",
		State: map[string]any{"n": 0},
		Actions: []lapdtest.Action{
			{Variant: "inc", Intent: "Add one", Apply: func(st any, _ map[string]any) (any, error) {
				m := st.(map[string]any)
				m["n"] = m["n"].(float64) + 1
				return m, nil
			}},
			{Variant: "zero", Intent: "Back to zero", RequiresConfirm: true, Apply: func(st any, _ map[string]any) (any, error) {
				return map[string]any{"n": 0}, nil
			}},
		},
	}
	tab, sess, err := srv.Pair(ctx, lapdtest.WithApp(counter))
	if err != nil {
		panic(err)
	}
	defer tab.Close()

	send := func(msg string) string {
		req, _ := http.NewRequest("POST", sess.LapURL+"/message", strings.NewReader(`{"msg":`+msg+`,"timeoutMs":10000}`))
		req.Header.Set("Authorization", "Bearer "+sess.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var out struct{ Status string }
		_ = json.Unmarshal(b, &out)
		return out.Status
	}
	fmt.Println("inc:", send(`{"type":"inc"}`))

	done := make(chan string)
	go func() { done <- send(`{"type":"zero"}`) }() // waits for the human
	id, _ := tab.WaitConfirm(ctx)
	_ = srv.Approve(ctx, tab, id)
	fmt.Println("zero:", <-done)
	fmt.Println("state:", tab.State())
	// Output:
	// inc: dispatched
	// zero: confirmed
	// state: map[n:0]
}
