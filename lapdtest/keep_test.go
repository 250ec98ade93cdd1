package lapdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/lapdtest"
)

func TestBackoffIsLapdJS(t *testing.T) {
	t.Parallel()
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i, w := range want {
		if got := lapdtest.Backoff(i); got != w*time.Second {
			t.Errorf("Backoff(%d) = %v, want %v", i, got, w*time.Second)
		}
	}
}

// A server restart (1012) is not the end of a session: Keep re-pairs with
// the same token, the app keeps its state and lapd re-delivers the
// approval still pending. A revoke ends it.
func TestKeepAcrossRestarts(t *testing.T) {
	t.Parallel()
	srv := lapdtest.NewServer(lapd.Config{DataDir: t.TempDir()})
	defer srv.Close()
	sess, err := srv.Mint(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tabs := make(chan *lapdtest.Tab, 4)
	ended := make(chan error, 1)
	go func() {
		ended <- lapdtest.Keep(ctx, sess.WSURL, sess.Token, func(tb *lapdtest.Tab) { tabs <- tb }, lapdtest.WithApp(todoApp()), lapdtest.WithTabSecret(sess.TabSecret))
	}()
	next := func() *lapdtest.Tab {
		t.Helper()
		select {
		case tb := <-tabs:
			return tb
		case err := <-ended:
			t.Fatalf("Keep returned %v", err)
		case <-ctx.Done():
			t.Fatal("no tab")
		}
		return nil
	}
	next()
	if _, m := lapCall(t, sess, "/message", `{"msg":{"type":"add","title":"milk"}}`); m["status"] != "dispatched" {
		t.Fatalf("add: %v", m)
	}
	_, m := lapCall(t, sess, "/message", `{"msg":{"type":"wipe"},"timeoutMs":1}`)
	cid, _ := m["confirmId"].(string)
	if m["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("wipe: %v", m)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	tab := next()
	if _, m := lapCall(t, sess, "/state", `{"path":"/todos"}`); len(m["state"].([]any)) != 1 {
		t.Errorf("state after the restart: %v", m)
	}
	id, err := tab.WaitConfirm(ctx) // from lapd's confirm-sync
	if err != nil || id != cid {
		t.Fatalf("pending approval after the restart: %q %v, want %q", id, err, cid)
	}
	if err := tab.Approve(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, m := lapCall(t, sess, "/confirm-result", `{"confirmId":"`+cid+`","timeoutMs":10000}`); m["status"] != "confirmed" {
		t.Errorf("confirm-result: %v", m)
	}

	if err := srv.Lapd.Revoke(ctx, sess.TID); err != nil {
		t.Fatal(err)
	}
	var ee *lapdtest.EndedError
	if err := <-ended; !errors.As(err, &ee) || ee.Code != "revoked" {
		t.Errorf("Keep after a revoke: %v", err)
	}
}
