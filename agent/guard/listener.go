package guard

import (
	"net"
	"net/netip"
	"sync"

	"github.com/reprieve-dev/reprieve/agent/serve"
)

// connLimitListener closes, as soon as it is accepted, a connection past perSource open
// connections from its source or past total in all, as the agent's own ports do (serve.Listener):
// closing costs no TLS handshake and does not block Accept, so the connections of other sources
// keep being accepted, unlike netutil.LimitListener, which stops accepting at its cap and so
// queues every source behind it. An IPv6 source is its /64, as for the review limits
// (SourceKey). refused is called for each connection closed at once (a metric); it may be nil.
//
// The last quarter of total is a reserve for sources that hold few connections (perSource/16, at
// least 1): sources that each hold all they may fill only the rest, so that the API server,
// whose kept-alive connections close after 30 s idle, can still open some while they flood.
// Eight sources of 64 filled all 512 before; it now takes six such and 32 more.
func connLimitListener(ln net.Listener, total, perSource int, refused func()) net.Listener {
	return &reserveListener{Listener: ln, max: total, perSource: perSource, reserve: total / 4,
		reservePerSource: max(1, perSource/16), refused: refused, from: map[netip.Addr]int{}}
}

type reserveListener struct {
	net.Listener
	max, perSource, reserve, reservePerSource int
	refused                                   func()

	mu   sync.Mutex
	open int
	from map[netip.Addr]int
}

// Accept returns the next connection there is room for.
func (l *reserveListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if pc := l.admit(c); pc != nil {
			return pc, nil
		}
		if l.refused != nil {
			l.refused()
		}
		// A reset, so that neither end keeps its socket (as serve.Listener).
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

func (l *reserveListener) admit(c net.Conn) net.Conn {
	remote, ok := serve.AddrOf(c.RemoteAddr())
	if !ok {
		return nil
	}
	if remote.Is6() {
		if p, err := remote.Prefix(64); err == nil {
			remote = p.Addr()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.from[remote]
	switch {
	case l.open < l.max-l.reserve && n < l.perSource:
	case l.open < l.max && n < l.reservePerSource:
	default:
		return nil
	}
	l.open++
	l.from[remote]++
	return serve.OnClose(c, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if l.from[remote]--; l.from[remote] <= 0 {
			delete(l.from, remote)
		}
	})
}
