package serve

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatalf("dialing %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refused reports whether the server closed c without a word.
func refused(t *testing.T, c net.Conn) bool {
	t.Helper()
	if c == nil {
		return true
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

// request sends one kept-alive GET of path on c and returns the status, or 0 when the server
// closed the connection instead of answering.
func TestPoolListenerCapsEachSourceAndThePool(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pool := &Pool{Name: "test", Total: 3, PerSource: 2}
	ln := NewListener(inner, func(_, _ netip.Addr) *Pool { return pool })
	defer ln.Close()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	addr := ln.Addr().String()
	from := func(c net.Conn) string { a, _ := AddrOf(c.RemoteAddr()); return a.String() }

	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.2", addr)
	first, second := <-accepted, <-accepted
	if from(first) != "127.0.0.2" || from(second) != "127.0.0.2" {
		t.Fatalf("accepted %s and %s, want two from 127.0.0.2", from(first), from(second))
	}
	if !refused(t, dialFrom(t, "127.0.0.2", addr)) {
		t.Error("a third connection from 127.0.0.2 was kept; want it closed (2 per source)")
	}
	dialFrom(t, "127.0.0.3", addr)
	if c := <-accepted; from(c) != "127.0.0.3" {
		t.Errorf("accepted %s, want 127.0.0.3's first", from(c))
	}
	if !refused(t, dialFrom(t, "127.0.0.4", addr)) {
		t.Error("a fourth connection was kept; want it closed (3 in the pool)")
	}
	// A closed connection gives its place back.
	_ = first.Close()
	dialFrom(t, "127.0.0.4", addr)
	if c := <-accepted; from(c) != "127.0.0.4" {
		t.Errorf("accepted %s after a close, want 127.0.0.4", from(c))
	}
}
