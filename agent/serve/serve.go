// Package serve bounds the agent's open ports: every connection in time (the timeouts) and in
// number (Listener): a total per pool, and a cap per source address, so that one source cannot
// take a pool and a stranger cannot take what the kubelet's probes and the node's pods need.
package serve

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

const (
	// ReadHeaderTimeout bounds a request's header (a slow sender, slowloris).
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds a whole request; these servers take no bodies.
	ReadTimeout = 10 * time.Second
	// IdleTimeout closes a kept-alive connection that sends no request. Longer than the
	// PodMonitor's 5 s interval, so that Prometheus keeps its connection between scrapes.
	IdleTimeout = 30 * time.Second
	// MaxHeaderBytes bounds a request's header. net/http's default, 1 MiB, held by each of
	// a few thousand connections whose header never ends, exceeds the chart's memory limit
	// many times over; a bearer token and Prometheus's headers fit well within 16 KiB.
	MaxHeaderBytes = 16 << 10
)

// Pool is a share of a listener's connections: at most Total open at once, and at most
// PerSource from one source address.
type Pool struct {
	// Name says which pool refused a connection, in logs.
	Name             string
	Total, PerSource int
	// SourceBitsV6, when set, makes an IPv6 source the prefix of that many bits of its
	// address (64: a host is usually given a whole /64, and one address each would be no
	// limit at all); 0 counts each address on its own.
	SourceBitsV6 int
	// Refused, when set, is called for each connection the pool closes at once (a metric).
	Refused func()
}

// source is the source that remote's connections count against.
func (p *Pool) source(remote netip.Addr) netip.Addr {
	if p.SourceBitsV6 > 0 && remote.Is6() {
		if pfx, err := remote.Prefix(p.SourceBitsV6); err == nil {
			return pfx.Addr()
		}
	}
	return remote
}

// Listener accepts a connection only while its pool has room, overall and for its source
// address, and closes any other at once (a reset, so that neither end keeps its socket). It
// never blocks on a full pool, unlike golang.org/x/net/netutil.LimitListener: a connection
// waiting in the kernel's backlog behind a stranger's would wait as long as the stranger holds
// on.
type Listener struct {
	net.Listener
	pool func(local, remote netip.Addr) *Pool

	mu   sync.Mutex
	open map[*Pool]int
	from map[poolSource]int
}

type poolSource struct {
	pool *Pool
	addr netip.Addr
}

// NewListener wraps ln; pool picks a new connection's pool from its two addresses (nil
// refuses it).
func NewListener(ln net.Listener, pool func(local, remote netip.Addr) *Pool) *Listener {
	return &Listener{Listener: ln, pool: pool, open: map[*Pool]int{}, from: map[poolSource]int{}}
}

// Accept returns the next connection its pool has room for.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if pc := l.admit(c); pc != nil {
			return pc, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

func (l *Listener) admit(c net.Conn) net.Conn {
	local, ok1 := AddrOf(c.LocalAddr())
	remote, ok2 := AddrOf(c.RemoteAddr())
	if !ok1 || !ok2 {
		return nil
	}
	p := l.pool(local, remote)
	if p == nil {
		return nil
	}
	key := poolSource{pool: p, addr: p.source(remote)}
	if !l.take(key) {
		if p.Refused != nil {
			p.Refused()
		}
		return nil
	}
	return OnClose(c, func() { l.release(key) })
}

// take counts a connection against key's pool and source, if both have room.
func (l *Listener) take(key poolSource) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key.pool] >= key.pool.Total || l.from[key] >= key.pool.PerSource {
		return false
	}
	l.open[key.pool]++
	l.from[key]++
	return true
}

func (l *Listener) release(key poolSource) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open[key.pool]--
	if l.from[key]--; l.from[key] <= 0 {
		delete(l.from, key)
	}
}

// OnClose returns c, calling release once when it is first closed: a listener that limits its
// connections gives a place back (net/http closes every connection it accepted, whichever way
// it ends).
func OnClose(c net.Conn, release func()) net.Conn {
	return &releaseConn{Conn: c, release: release}
}

type releaseConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Open is how many connections of pool p are open now.
func (l *Listener) Open(p *Pool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[p]
}

// AddrOf is a connection end's IP address, IPv4 in its 4-byte form (an IPv4 client of a dual-
// stack listener arrives as ::ffff:a.b.c.d).
func AddrOf(a net.Addr) (netip.Addr, bool) {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(ta.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}
