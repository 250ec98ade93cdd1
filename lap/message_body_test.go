package lap

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

// messageArgsByEncodingJSON is how /message read its body and wrote the
// send_message arguments before they were hand-written: the reference the
// hand-written ones must match byte for byte.
func messageArgsByEncodingJSON(body []byte, key string, ttl time.Duration) (messageBody, []byte, error) {
	var b messageBody
	c := &call{body: body}
	c.decode(&b)
	args := map[string]json.RawMessage{"msg": b.Msg}
	for k, v := range map[string]json.RawMessage{"reason": b.Reason, "waitFor": b.WaitFor, "drainQuietMs": b.DrainQuietMs, "timeoutMs": b.TimeoutMs, "includeState": b.IncludeState} {
		if len(v) > 0 {
			args[k] = v
		}
	}
	if key != "" {
		args["idempotencyKey"], _ = json.Marshal(key)
		args["idempotencyTtlMs"] = json.RawMessage(strconv.FormatInt(ttl.Milliseconds(), 10))
	}
	raw, err := json.Marshal(args)
	return b, raw, err
}

func checkMessageBody(t *testing.T, body []byte, key string) {
	t.Helper()
	want, wantArgs, wantErr := messageArgsByEncodingJSON(body, key, DefaultIdempotencyTTL)
	c := &call{body: body}
	got := c.decodeMessage()
	for i, p := range [][2]json.RawMessage{{got.Msg, want.Msg}, {got.Reason, want.Reason}, {got.WaitFor, want.WaitFor},
		{got.DrainQuietMs, want.DrainQuietMs}, {got.TimeoutMs, want.TimeoutMs}, {got.IncludeState, want.IncludeState},
		{got.IdempotencyKey, want.IdempotencyKey}, {got.ApprovalTimeoutMs, want.ApprovalTimeoutMs}} {
		if !bytes.Equal(p[0], p[1]) || (p[0] == nil) != (p[1] == nil) {
			t.Fatalf("body %q field %d: %q, encoding/json reads %q", body, i, p[0], p[1])
		}
	}
	args, err := got.sendArgs(key, DefaultIdempotencyTTL)
	if !bytes.Equal(args, wantArgs) || (err == nil) != (wantErr == nil) {
		t.Fatalf("body %q key %q: args %s (%v), json.Marshal writes %s (%v)", body, key, args, err, wantArgs, wantErr)
	}
}

var messageBodySeeds = []string{
	``, `null`, `[]`, `"x"`, `{}`, ` { } `,
	`{"msg":{"type":"addTask","title":"Buy milk"},"waitFor":"idle"}`,
	`{"msg": {"type" : "a", "n": [1, 2]}, "reason":"why <not> & \u2028", "timeoutMs": 1500}`,
	`{"MSG":{"type":"a"},"Reason":null,"WAITFOR":"none","drainquietms":5,"TimeoutMS":1,"includestate":true,"IdempotencyKey":"k","approvaltimeoutms":0}`,
	`{"msg":{"type":"a"},"msg":{"type":"b"},"Msg":{"type":"c"}}`,
	`{"m\u0073g":{"type":"esc"}}`,
	`{"ms\u017fg":{"type":"long s"},"idempotency\u212aey":"kelvin"}`,
	"{\"msg\":{\"type\":\"a\",\"t\":\"\xe2\x80\xa8\"},\"reason\":\"\xe2\x82\xac\"}",
	`{"msg":{"type":"a"},"other":[1,{"x":null}],"includeState":{"deep":[true,false]}}`,
	`{"msg":{"type":"a","t":"x\" y","u":"\\"},"reason":"a\\ b","waitFor":[1, 2],"timeoutMs" :1}`,
	`{"msg":{"type":"a"}`, `{"msg":1,}`, "{\"msg\":\"\xff\"}",
}

func TestMessageBodyAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range messageBodySeeds {
		for _, key := range []string{"", "k-1", "<key>", "é\u2028"} {
			checkMessageBody(t, []byte(s), key)
		}
	}
}

func FuzzMessageBody(f *testing.F) {
	for _, s := range messageBodySeeds {
		f.Add([]byte(s), "")
		f.Add([]byte(s), "key")
	}
	f.Fuzz(func(t *testing.T, body []byte, key string) {
		if !json.Valid(body) && len(trimSpace(body)) > 0 {
			return // the gate answers 400 before any route reads it
		}
		checkMessageBody(t, body, key)
	})
}
