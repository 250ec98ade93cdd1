package lapdtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// todoApp is a small app with one action of each kind.
func todoApp() lapdtest.App {
	return lapdtest.App{
		Name:  "Todo",
		State: map[string]any{"todos": []any{}},
		Actions: []lapdtest.Action{
			{
				Variant: "add", Intent: "Add a task",
				Schema: json.RawMessage(`{"type":"object","properties":{"title":{"type":"string","minLength":1,"description":"what to do"}},"required":["title"],"additionalProperties":false}`),
				Apply: func(state any, msg map[string]any) (any, error) {
					st := state.(map[string]any)
					st["todos"] = append(st["todos"].([]any), msg["title"])
					return st, nil
				},
			},
			{
				Variant: "wipe", Intent: "Delete every task", RequiresConfirm: true,
				Apply: func(state any, _ map[string]any) (any, error) {
					st := state.(map[string]any)
					st["todos"] = []any{}
					return st, nil
				},
			},
			{Variant: "admin", Intent: "Humans only", HumanOnly: true},
		},
	}
}

// lapCall POSTs a LAP route and decodes the JSON answer.
func lapCall(t *testing.T, sess lapdtest.Session, route, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", sess.LapURL+route, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+sess.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %d %q", route, res.StatusCode, b)
	}
	return res.StatusCode, m
}

func TestServerPairsAnApp(t *testing.T) {
	t.Parallel()
	srv := lapdtest.NewServer(lapd.Config{})
	defer srv.Close()
	tab, sess, err := srv.Pair(ctxT(t), lapdtest.WithApp(todoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()

	_, m := lapCall(t, sess, "/actions", "")
	b, _ := json.Marshal(m["actions"])
	if got := string(b); !strings.Contains(got, `"payloadHint":{"title":"…","type":"add"}`) ||
		!strings.Contains(got, `"fieldHints":[{"hint":"what to do","path":"title"}]`) ||
		!strings.Contains(got, `"variant":"wipe"`) || strings.Contains(got, `"admin"`) {
		t.Errorf("actions: %s", got)
	}
	_, m = lapCall(t, sess, "/describe", "")
	if m["name"] != "Todo" {
		t.Errorf("describe: %v", m)
	}

	st, m := lapCall(t, sess, "/message", `{"msg":{"type":"add","title":"milk"}}`)
	if st != 200 || m["status"] != "dispatched" {
		t.Fatalf("add: %d %v", st, m)
	}
	// The policy went out in hello: lapd itself refuses these.
	if _, m = lapCall(t, sess, "/message", `{"msg":{"type":"add"}}`); m["status"] != "rejected" || m["reason"] != "schema-error" {
		t.Errorf("add without a title: %v", m)
	}
	if _, m = lapCall(t, sess, "/message", `{"msg":{"type":"admin"}}`); m["reason"] != "human-only" {
		t.Errorf("admin: %v", m)
	}

	// Approve on cue, then reject on cue.
	for _, tc := range []struct {
		approve bool
		want    string
	}{{true, "confirmed"}, {false, "rejected"}} {
		done := make(chan map[string]any, 1)
		go func() {
			_, m := lapCall(t, sess, "/message", `{"msg":{"type":"wipe"},"timeoutMs":10000}`)
			done <- m
		}()
		id, err := tab.WaitConfirm(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if tc.approve {
			err = srv.Approve(ctxT(t), tab, id)
		} else {
			err = srv.Reject(ctxT(t), tab, id)
		}
		if err != nil {
			t.Fatal(err)
		}
		if m := <-done; m["status"] != tc.want {
			t.Errorf("wipe, approve=%v: %v", tc.approve, m)
		}
	}
	if got := tab.State().(map[string]any)["todos"]; len(got.([]any)) != 0 {
		t.Errorf("todos after the approved wipe: %v", got)
	}
	// The dispatch is audited once, by the server (the tab's log-append
	// after its reply feeds /recent-actions, not the audit again).
	if _, err := srv.WaitAudit(ctxT(t), func(e audit.Entry) bool {
		return e.Event == audit.EventMsgDispatched && e.Detail["variant"] == "add"
	}); err != nil {
		t.Error(err)
	}
}

func TestMintRefused(t *testing.T) {
	t.Parallel()
	nobody := lap.IdentityFunc(func(*http.Request) (string, error) { return "", nil })
	srv := lapdtest.NewServer(lapd.Config{Identity: nobody})
	defer srv.Close()
	_, err := srv.Mint(ctxT(t))
	var me *lapdtest.MintError
	if !errors.As(err, &me) || me.Status != 401 {
		t.Errorf("mint without an identity: %v", err)
	}
}
