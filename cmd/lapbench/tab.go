package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// tab is a lean fake browser tab that answers like client/lapd.js: it sends
// hello (with policy), starts {t:'ping'} heartbeats at hello-ack's
// heartbeatMs, answers each rpc frame in arrival order (lapd.js runs on one
// thread) with rpc-reply and then a log-append carrying the entry lapd.js
// would log, and echoes log-push entries back as log-append. It holds no
// goroutine of its own besides the reader.
type tab struct {
	ws  *websocket.Conn
	res *results

	mu       sync.Mutex
	hbTimer  *time.Timer
	hbEvery  time.Duration
	closed   bool
	ready    chan struct{} // closed at the first hello-ack
	readyOne sync.Once
	done     chan struct{} // the reader has exited
	err      error
}

// dialTab pairs a tab with token (and the tab secret, when the mint gave
// one) on wsURL, as lapd.js does: both as sub-protocol entries. It returns
// once hello-ack arrived.
func dialTab(ctx context.Context, wsURL, token, tabSecret string, res *results) (*tab, error) {
	protocols := []string{"lapd.v2", "lapd.token." + token}
	if tabSecret != "" {
		protocols = append(protocols, "lapd.tab."+tabSecret)
	}
	ws, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		Subprotocols:    protocols,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, fmt.Errorf("dial tab (status %d): %w", status, err)
	}
	ws.SetReadLimit(8 << 20)
	t := &tab{ws: ws, res: res, ready: make(chan struct{}), done: make(chan struct{})}
	if err := ws.Write(ctx, websocket.MessageText, []byte(helloFrame)); err != nil {
		ws.CloseNow()
		return nil, err
	}
	go t.readLoop()
	select {
	case <-t.ready:
		return t, nil
	case <-t.done:
		return nil, fmt.Errorf("tab closed before hello-ack: %v", t.err)
	case <-ctx.Done():
		t.close()
		return nil, ctx.Err()
	}
}

// frame is the envelope of a server→tab frame (args are not decoded).
type frame struct {
	T           string          `json:"t"`
	ID          string          `json:"id"`
	Tool        string          `json:"tool"`
	HeartbeatMs int64           `json:"heartbeatMs"`
	Entry       json.RawMessage `json:"entry"`
}

func (t *tab) readLoop() {
	defer close(t.done)
	var buf bytes.Buffer
	out := make([]byte, 0, 16<<10)
	for {
		_, rd, err := t.ws.Reader(context.Background())
		if err != nil {
			t.err = err
			t.stopHeartbeat()
			return
		}
		buf.Reset()
		if _, err := buf.ReadFrom(rd); err != nil {
			t.err = err
			t.stopHeartbeat()
			return
		}
		var f frame
		if json.Unmarshal(buf.Bytes(), &f) != nil {
			continue
		}
		switch f.T {
		case "hello-ack":
			t.startHeartbeat(time.Duration(f.HeartbeatMs) * time.Millisecond)
			t.readyOne.Do(func() { close(t.ready) })
		case "rpc":
			out = t.answer(out[:0], f)
		case "log-push":
			if len(f.Entry) > 0 {
				out = append(out[:0], `{"t":"log-append","entry":`...)
				out = append(out, f.Entry...)
				out = append(out, '}')
				_ = t.ws.Write(context.Background(), websocket.MessageText, out)
			}
		}
	}
}

// answer sends the rpc-reply and then the log-append, as lapd.js does.
func (t *tab) answer(out []byte, f frame) []byte {
	var result []byte
	entry := ""
	switch f.Tool {
	case "observe":
		result = t.res.observe
	case "get_state":
		result = t.res.getState
	case "send_message":
		result, entry = t.res.sendMessage, dispatchedLog
	default:
		result = []byte(`{}`)
	}
	if entry == "" {
		in := readIntents[f.Tool]
		if in == "" {
			in = f.Tool
		}
		entry = `"kind":"read","intent":"` + in + `"`
	}
	out = append(out, `{"t":"rpc-reply","id":"`...)
	out = append(out, f.ID...)
	out = append(out, `","result":`...)
	out = append(out, result...)
	out = append(out, '}')
	if t.ws.Write(context.Background(), websocket.MessageText, out) != nil {
		return out
	}
	out = append(out[:0], `{"t":"log-append","entry":{"id":"`...)
	out = append(out, f.ID...)
	out = append(out, `","at":`...)
	out = strconv.AppendInt(out, time.Now().UnixMilli(), 10)
	out = append(out, ',')
	out = append(out, entry...)
	out = append(out, `}}`...)
	_ = t.ws.Write(context.Background(), websocket.MessageText, out)
	return out
}

// startHeartbeat sends {t:'ping'} every d (lapd.js: max(1s, heartbeatMs)),
// from a timer, so an idle tab holds no goroutine.
func (t *tab) startHeartbeat(d time.Duration) {
	if d <= 0 {
		return
	}
	if d < time.Second {
		d = time.Second
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.hbTimer != nil {
		return
	}
	t.hbEvery = d
	t.hbTimer = time.AfterFunc(d, t.beat)
}

func (t *tab) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := t.ws.Write(ctx, websocket.MessageText, []byte(`{"t":"ping"}`))
	cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && !t.closed {
		t.hbTimer.Reset(t.hbEvery)
	}
}

func (t *tab) stopHeartbeat() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.hbTimer != nil {
		t.hbTimer.Stop()
	}
}

// close closes the socket (1000) and waits for the reader.
func (t *tab) close() {
	t.stopHeartbeat()
	_ = t.ws.Close(websocket.StatusNormalClosure, "bye")
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
		t.ws.CloseNow()
		<-t.done
	}
}

var errStatus = errors.New("unexpected status")
