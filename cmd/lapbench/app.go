package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The fake app every tab runs: the demo Taskboard's actions (what
// examples/taskboard/app.js declares) and a board whose state is about
// StateBytes of JSON. The frames below are the bytes lapd.js would send for
// it: hello with msgSchema (the reference compiler shape) and policy (lapd's
// per-variant JSON Schema), observe and send_message results, and the
// log-append entry that follows every reply.

// helloFrame is lapd.js's hello for the Taskboard (buildMsgSchema,
// buildPolicy, docs, an empty affordances sample, schemaHash, lapVersion 2).
const helloFrame = `{"t":"hello","appName":"taskboard","appVersion":"1.0.0",` +
	`"msgSchema":{"discriminant":"type","variants":{` +
	`"addTask":{"title":{"type":"string","hint":"Short task title"},"column":{"type":{"enum":["todo","doing","done"]},"optional":true,"hint":"Board column"}},` +
	`"toggleDone":{"id":{"type":"number","hint":"Task id (see /tasks in the state)"}},` +
	`"renameTask":{"id":{"type":"number","hint":"Task id (see /tasks in the state)"},"title":{"type":"string","hint":"Short task title"}},` +
	`"moveTask":{"id":{"type":"number","hint":"Task id (see /tasks in the state)"},"column":{"type":{"enum":["todo","doing","done"]},"hint":"Board column"}},` +
	`"setFilter":{"filter":{"enum":["all","active","done"]}},"save":{},"clearAll":{},"resetDemo":{}}},` +
	`"stateSchema":null,"affordancesSample":[],` +
	`"docs":{"purpose":"A kanban task board with three columns: todo, doing, done.","tips":["Task ids are in /tasks/*/id.","Call save after edits; it is asynchronous."]},` +
	`"schemaHash":"5d1c2a7e","lapVersion":2,"visible":true,` +
	`"policy":{"variants":{` +
	`"addTask":{"intent":"Add a task to a column (default todo)","schema":{"type":"object","required":["title"],"additionalProperties":false,"properties":{"title":{"type":"string","minLength":1,"maxLength":120,"description":"Short task title"},"column":{"enum":["todo","doing","done"],"description":"Board column"}}},"alwaysAffordable":true,"examples":[{"type":"addTask","title":"Buy milk"},{"type":"addTask","title":"Write tests","column":"doing"}]},` +
	`"toggleDone":{"intent":"Mark a task done or not done","schema":{"type":"object","required":["id"],"additionalProperties":false,"properties":{"id":{"type":"integer","minimum":1,"description":"Task id (see /tasks in the state)"}}}},` +
	`"renameTask":{"intent":"Rename a task","schema":{"type":"object","required":["id","title"],"additionalProperties":false,"properties":{"id":{"type":"integer","minimum":1,"description":"Task id (see /tasks in the state)"},"title":{"type":"string","minLength":1,"maxLength":120,"description":"Short task title"}}}},` +
	`"moveTask":{"intent":"Move a task to another column","schema":{"type":"object","required":["id","column"],"additionalProperties":false,"properties":{"id":{"type":"integer","minimum":1,"description":"Task id (see /tasks in the state)"},"column":{"enum":["todo","doing","done"],"description":"Board column"}}}},` +
	`"setFilter":{"intent":"Show all, only active, or only done tasks","schema":{"type":"object","required":["filter"],"additionalProperties":false,"properties":{"filter":{"enum":["all","active","done"]}}},"alwaysAffordable":true},` +
	`"save":{"intent":"Save the board to the server (async, about 150 ms)","schema":{"type":"object","additionalProperties":false,"properties":{}}},` +
	`"clearAll":{"intent":"Delete every task","schema":{"type":"object","additionalProperties":false,"properties":{}},"requiresConfirm":true,"warning":"Deletes all tasks; the user must approve it in the app."},` +
	`"resetDemo":{"intent":"Reset the demo board (humans only)","humanOnly":true}}}}`

// actionsJSON is lapd.js's listActions for the Taskboard (humanOnly hidden).
const actionsJSON = `[` +
	`{"variant":"addTask","intent":"Add a task to a column (default todo)","requiresConfirm":false,"dispatchMode":"shared","source":"always-affordable","selectorHint":null,"payloadHint":{"type":"addTask","title":""},"warning":null,"examples":[{"type":"addTask","title":"Buy milk"},{"type":"addTask","title":"Write tests","column":"doing"}],"emits":[],"fieldHints":[{"path":"title","hint":"Short task title"},{"path":"column","hint":"Board column"}]},` +
	`{"variant":"toggleDone","intent":"Mark a task done or not done","requiresConfirm":false,"dispatchMode":"shared","source":"schema","selectorHint":null,"payloadHint":{"type":"toggleDone","id":1},"warning":null,"examples":[],"emits":[],"fieldHints":[{"path":"id","hint":"Task id (see /tasks in the state)"}]},` +
	`{"variant":"renameTask","intent":"Rename a task","requiresConfirm":false,"dispatchMode":"shared","source":"schema","selectorHint":null,"payloadHint":{"type":"renameTask","id":1,"title":""},"warning":null,"examples":[],"emits":[],"fieldHints":[{"path":"id","hint":"Task id (see /tasks in the state)"},{"path":"title","hint":"Short task title"}]},` +
	`{"variant":"moveTask","intent":"Move a task to another column","requiresConfirm":false,"dispatchMode":"shared","source":"schema","selectorHint":null,"payloadHint":{"type":"moveTask","id":1,"column":"todo"},"warning":null,"examples":[],"emits":[],"fieldHints":[{"path":"id","hint":"Task id (see /tasks in the state)"},{"path":"column","hint":"Board column"}]},` +
	`{"variant":"setFilter","intent":"Show all, only active, or only done tasks","requiresConfirm":false,"dispatchMode":"shared","source":"always-affordable","selectorHint":null,"payloadHint":{"type":"setFilter","filter":"all"},"warning":null,"examples":[],"emits":[],"fieldHints":[]},` +
	`{"variant":"save","intent":"Save the board to the server (async, about 150 ms)","requiresConfirm":false,"dispatchMode":"shared","source":"schema","selectorHint":null,"payloadHint":{"type":"save"},"warning":null,"examples":[],"emits":[],"fieldHints":[]},` +
	`{"variant":"clearAll","intent":"Delete every task","requiresConfirm":true,"dispatchMode":"shared","source":"schema","selectorHint":null,"payloadHint":{"type":"clearAll"},"warning":"Deletes all tasks; the user must approve it in the app.","examples":[],"emits":[],"fieldHints":[]}]`

// boardState returns a Taskboard state of about n bytes of JSON.
func boardState(n int) string {
	var b strings.Builder
	b.WriteString(`{"tasks":[`)
	cols := []string{"todo", "doing", "done"}
	for i := 1; ; i++ {
		if i > 1 {
			b.WriteByte(',')
		}
		col := cols[i%3]
		fmt.Fprintf(&b, `{"id":%d,"title":"Task number %d: write the quarterly report draft","column":"%s","done":%t}`, i, i, col, col == "done")
		if b.Len() > n-140 {
			fmt.Fprintf(&b, `],"nextId":%d,"filter":"all","saving":false,"dirty":true,"savedAt":null,"saveError":null}`, i+1)
			break
		}
	}
	return b.String()
}

// results are the rpc results the fake tab answers with (bytes, spliced
// into rpc-reply frames as lapd.js's JSON.stringify would produce them).
type results struct {
	observe     []byte // {state, actions, context}
	sendMessage []byte // {status:'dispatched', stateDiff, actions, drain}
	getState    []byte // {state}
	stateBytes  int
}

func newResults(stateBytes int) results {
	st := boardState(stateBytes)
	return results{
		observe: []byte(`{"state":` + st + `,"actions":` + actionsJSON + `,"context":{"summary":"40 tasks (14 todo, 13 doing, 13 done); filter all; unsaved changes.","hints":["Use moveTask to change a column; toggleDone only flips the checkbox.","There are unsaved changes: call save when you are done editing."]}}`),
		sendMessage: []byte(`{"status":"dispatched","stateDiff":[{"op":"add","path":"/tasks/40","value":{"id":41,"title":"Buy milk","column":"todo","done":false}},{"op":"replace","path":"/nextId","value":42}],` +
			`"actions":` + actionsJSON + `,"drain":{"effectsObserved":1,"durationMs":0,"timedOut":false,"errors":[]}}`),
		getState:   []byte(`{"state":` + st + `}`),
		stateBytes: len(st),
	}
}

// readIntents are lapd.js's READ_INTENTS.
var readIntents = map[string]string{
	"get_state": "Read app state", "query_state": "Query app state", "list_actions": "List actions",
	"describe_visible_content": "Describe visible content", "describe_context": "Describe context",
	"observe": "Observe the app",
}

// messageBody is the /message request of the /message scenario.
const messageBody = `{"msg":{"type":"addTask","title":"Buy milk"},"waitFor":"idle"}`

// dispatchedLog is lapd.js's log entry for that dispatch (after id and at).
const dispatchedLog = `"kind":"dispatched","variant":"addTask","intent":"Add a task to a column (default todo)","detail":"title=Buy milk",` +
	`"stateDiff":[{"op":"add","path":"/tasks/40","value":{"id":41,"title":"Buy milk","column":"todo","done":false}},{"op":"replace","path":"/nextId","value":42}]`

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
