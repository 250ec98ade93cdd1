package pairing

import (
	"bytes"
	"io"
	"net"
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
