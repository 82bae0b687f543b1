package serve

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
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
	var refusals atomic.Int32
	pool := &Pool{Name: "test", Total: 3, PerSource: 2, Refused: func() { refusals.Add(1) }}
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
	// The pool's callback saw each connection it closed (it runs before the close).
	if n := refusals.Load(); n != 2 {
		t.Errorf("Refused called %d times, want 2", n)
	}
}

// TestPoolSourceIPv6Prefix: with SourceBitsV6, the IPv6 addresses of one prefix are one source
// (the guard's /64); IPv4 addresses, and every address without it, stay their own.
func TestPoolSourceIPv6Prefix(t *testing.T) {
	by64 := &Pool{SourceBitsV6: 64}
	each := &Pool{}
	a, b := netip.MustParseAddr("2001:db8:1:2::1"), netip.MustParseAddr("2001:db8:1:2:ffff::9")
	if by64.source(a) != by64.source(b) || by64.source(a) != netip.MustParseAddr("2001:db8:1:2::") {
		t.Errorf("/64 sources %v and %v, want both 2001:db8:1:2::", by64.source(a), by64.source(b))
	}
	if other := netip.MustParseAddr("2001:db8:1:3::1"); by64.source(other) == by64.source(a) {
		t.Errorf("another /64 counted as the same source: %v", by64.source(other))
	}
	if each.source(a) == each.source(b) {
		t.Error("without SourceBitsV6 two IPv6 addresses counted as one source")
	}
	v4 := netip.MustParseAddr("10.0.0.7")
	if by64.source(v4) != v4 {
		t.Errorf("IPv4 source %v, want %v", by64.source(v4), v4)
	}
}
