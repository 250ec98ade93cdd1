package pairing

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// tcpPair is a connected loopback TCP pair (sock reads the descriptor).
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// TestSockReadsThroughItsBuffer: what the peer sent (after the early bytes)
// comes out whole and in order however small the reads, a wait leaves the
// bytes buffered, the buffer is given back once drained (an idle tab holds
// none), and EOF is reported after the last byte.
func TestSockReadsThroughItsBuffer(t *testing.T) {
	t.Parallel()
	server, client := tcpPair(t)
	var s sock
	s.init(server, []byte("early:"))
	if rawReads && s.rc == nil {
		t.Fatal("a TCP connection should be read through its descriptor")
	}
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1500) // 24,000 bytes: larger than one small read
	if _, err := client.Write(payload); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 7)
	for len(got) < len("early:") {
		n, err := s.Read(buf[:min(len(buf), len("early:")-len(got))])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "early:" {
		t.Fatalf("early bytes %q", got)
	}
	if s.buffered() != 0 || s.buf != nil {
		t.Fatalf("drained early bytes left %d buffered (buf %v)", s.buffered(), s.buf != nil)
	}
	s.wait()
	if rawReads && s.buffered() == 0 {
		t.Fatal("wait returned with nothing buffered")
	}
	client.Close()
	rest, err := io.ReadAll(readerFunc(func(p []byte) (int, error) { return s.Read(p[:min(len(p), 1000)]) }))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rest, payload) {
		t.Fatalf("read %d bytes, want the %d sent", len(rest), len(payload))
	}
	if s.buf != nil {
		t.Fatal("the buffer is held after everything was read")
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestFramesSentWithTheUpgradeRequest: a client that writes its hello in the
// same packet as its upgrade request (net/http has read it by the time the
// socket is hijacked) is answered as any other.
func TestFramesSentWithTheUpgradeRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	nc, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hello := []byte(`{"t":"hello","appName":"x","schemaHash":"h"}`)
	req := "GET /agent/ws?token=" + tok + " HTTP/1.1\r\nHost: " + strings.TrimPrefix(e.srv.URL, "http://") +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	// A text frame, masked with the key 0 (so the payload reads as sent).
	frame := append([]byte{0x81, 0x80 | byte(len(hello)), 0, 0, 0, 0}, hello...)
	if _, err := nc.Write(append([]byte(req), frame...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatal(err)
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			t.Fatal(err)
		}
		n = int(l[0])<<8 | int(l[1])
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	if h[0] != 0x81 || !bytes.Contains(payload, []byte(`"t":"hello-ack"`)) {
		t.Fatalf("first frame %x %s, want hello-ack", h[0], payload)
	}
	if got := recv(t, e.paired); got != tid {
		t.Fatalf("paired %q, want %q", got, tid)
	}
}
