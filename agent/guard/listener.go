package guard

import (
	"net"
	"net/netip"

	"github.com/reprieve-dev/reprieve/agent/serve"
)

// connLimitListener closes, as soon as it is accepted, a connection past perSource open
// connections from its source or past max in all, as the agent's own ports do (serve.Listener):
// closing costs no TLS handshake and does not block Accept, so the connections of other sources
// keep being accepted, unlike netutil.LimitListener, which stops accepting at its cap and so
// queues every source behind it. An IPv6 source is its /64, as for the review limits
// (SourceKey). refused is called for each connection closed at once (a metric); it may be nil.
func connLimitListener(ln net.Listener, max, perSource int, refused func()) net.Listener {
	pool := &serve.Pool{Name: "reviews", Total: max, PerSource: perSource, SourceBitsV6: 64, Refused: refused}
	return serve.NewListener(ln, func(netip.Addr, netip.Addr) *serve.Pool { return pool })
}
