package schema_test

import (
	"encoding/json"
	"fmt"

	"github.com/lapd-dev/lapd/schema"
)

func Example() {
	pol, err := schema.Parse(json.RawMessage(`{"variants":{
	  "addTodo":{"intent":"Add a task","schema":{"type":"object","properties":{"title":{"type":"string","minLength":1}},"required":["title"]}},
	  "resetBoard":{"humanOnly":true}}}`))
	if err != nil {
		panic(err)
	}
	for _, msg := range []string{
		`{"type":"addTodo","title":"Buy milk"}`,
		`{"type":"addTodo","title":""}`,
		`{"type":"resetBoard"}`,
		`{"type":"fly"}`,
	} {
		if rej := pol.Check(json.RawMessage(msg)); rej != nil {
			fmt.Printf("%s: %s\n", rej.Reason, rej.Detail)
		} else {
			fmt.Println("ok")
		}
	}
	fmt.Printf("hint: %s\n", pol.PayloadHint("addTodo"))
	// Output:
	// ok
	// schema-error: /title: minLength: got 0, want 1
	// human-only: resetBoard can only be done by the human in the app; ask them to do it
	// invalid: unknown variant: fly (known: addTodo)
	// hint: {"title":"x"}
}
