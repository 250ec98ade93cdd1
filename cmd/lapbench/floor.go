package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// The floor: the least a server can do on the path lapd serves — an HTTP
// request handed to a tab over a WebSocket and the tab's reply written back
// — with the same client, the same fake tab and the same payload, in its
// own process so its CPU is measured the same way. It has no tokens, gates,
// audit or LAP routes: lapd's cost above it is what lapd adds.
//
// `lapbench floor-server` runs it (lapbench starts it as a child process):
//
//	GET  /ws    a tab connects (token in a "lapd.token.<t>" sub-protocol)
//	POST /call  Authorization: Bearer <t>: one rpc "observe" to that tab,
//	            its result bytes are the response

func floorServer() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	f := &floor{tabs: map[string]*floorTab{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", f.serveWS)
	mux.HandleFunc("/call", f.serveCall)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "floor listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() { <-ctx.Done(); _ = hs.Close() }()
	if err := hs.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

type floor struct {
	mu   sync.Mutex
	tabs map[string]*floorTab
}

type floorTab struct {
	ws    *websocket.Conn
	seq   atomic.Int64
	mu    sync.Mutex
	calls map[string]chan []byte
}

func (f *floor) serveWS(w http.ResponseWriter, r *http.Request) {
	token := ""
	for _, p := range strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(p), "lapd.token."); ok {
			token = t
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"lapd.v2"}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	ws.SetReadLimit(8 << 20)
	t := &floorTab{ws: ws, calls: map[string]chan []byte{}}
	f.mu.Lock()
	f.tabs[token] = t
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.tabs, token)
		f.mu.Unlock()
		ws.CloseNow()
	}()
	var env struct {
		T      string          `json:"t"`
		ID     string          `json:"id"`
		Result json.RawMessage `json:"result"`
	}
	buf := new(bytes.Buffer)
	for {
		_, rd, err := ws.Reader(context.Background())
		if err != nil {
			return
		}
		buf.Reset()
		if _, err := buf.ReadFrom(rd); err != nil {
			return
		}
		env.T, env.ID, env.Result = "", "", nil
		if json.Unmarshal(buf.Bytes(), &env) != nil {
			continue
		}
		switch env.T {
		case "hello":
			_ = ws.Write(context.Background(), websocket.MessageText, []byte(`{"t":"hello-ack","lapVersion":2,"minClientVersion":2,"heartbeatMs":15000}`))
		case "ping":
			_ = ws.Write(context.Background(), websocket.MessageText, []byte(`{"t":"pong"}`))
		case "rpc-reply":
			t.mu.Lock()
			ch := t.calls[env.ID]
			delete(t.calls, env.ID)
			t.mu.Unlock()
			if ch != nil {
				ch <- env.Result // Unmarshal copied it out of buf
			}
		}
	}
}

func (f *floor) serveCall(w http.ResponseWriter, r *http.Request) {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	t := f.tabs[token]
	f.mu.Unlock()
	if t == nil {
		http.Error(w, "no tab", http.StatusServiceUnavailable)
		return
	}
	id := strconv.FormatInt(t.seq.Add(1), 10)
	ch := make(chan []byte, 1)
	t.mu.Lock()
	t.calls[id] = ch
	t.mu.Unlock()
	frame := []byte(`{"t":"rpc","id":"` + id + `","tool":"observe","args":{}}`)
	if err := t.ws.Write(r.Context(), websocket.MessageText, frame); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	select {
	case res := <-ch:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(res)))
		_, _ = w.Write(res)
	case <-time.After(15 * time.Second):
		http.Error(w, "timeout", http.StatusGatewayTimeout)
	}
}

func init() {
	log.SetFlags(0)
}
