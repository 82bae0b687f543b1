package agent

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The agent's open ports (--metrics-bind-address, --notice-bind-address) answer anyone who
// reaches the node: on AWS the agent runs on the host network, so they are open on every node
// address. Each open connection costs the agent a goroutine and its buffers (about 18 KiB idle,
// up to serveMaxHeaderBytes more while a request's header arrives), so every connection is
// bounded in time (the timeouts below) and in number (poolListener): a total per pool, and a
// cap per source address, so that one source cannot take a pool and a stranger cannot take what
// the kubelet's probes and the node's pods need.
const (
	// serveReadHeaderTimeout bounds a request's header (a slow sender, slowloris).
	serveReadHeaderTimeout = 5 * time.Second
	// serveReadTimeout bounds a whole request; these servers take no bodies.
	serveReadTimeout = 10 * time.Second
	// serveIdleTimeout closes a kept-alive connection that sends no request. Longer than the
	// PodMonitor's 5 s interval, so that Prometheus keeps its connection between scrapes.
	serveIdleTimeout = 30 * time.Second
	// serveMaxHeaderBytes bounds a request's header. net/http's default, 1 MiB, held by each of
	// a few thousand connections whose header never ends, exceeds the chart's memory limit
	// many times over; a bearer token and Prometheus's headers fit well within 16 KiB.
	serveMaxHeaderBytes = 16 << 10
	// metricsWriteTimeout bounds a response from handler start to its last byte: the agent's
	// scrape is gathered in milliseconds and the PodMonitor's scrapeTimeout is 4 s; only a client
	// that reads slowly on purpose gets near it.
	metricsWriteTimeout = 30 * time.Second
)

// The metrics server's pools. The kubelet's probes of a host-network agent come from the node
// itself: it dials the pod IP, which is a node address, and the kernel's source address for a
// local destination is that same address, so the connection's two ends have one address. The
// host pool keeps /readyz and /healthz answering when strangers fill theirs from many
// addresses. On the pod network the probes come from the node's side of the pod's interface
// (an address per CNI); there they share the others' pool, where the per-source cap keeps one
// flooding address from starving them.
var (
	metricsHostPool   = &connPool{name: "host", total: 32, perSource: 32}
	metricsOthersPool = &connPool{name: "others", total: 256, perSource: 8}
)

// newMetricsServer returns the server of --metrics-bind-address, serving h with every
// timeout; serve it on metricsListener's listener.
func newMetricsServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr: addr, Handler: h,
		ReadHeaderTimeout: serveReadHeaderTimeout, ReadTimeout: serveReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: serveIdleTimeout,
		MaxHeaderBytes: serveMaxHeaderBytes,
	}
}

// metricsListener bounds the metrics server's connections by its pools.
func metricsListener(ln net.Listener) net.Listener { return newPoolListener(ln, metricsPool) }

// metricsPool puts a connection from the host itself in the host pool, any other in the
// others' pool.
func metricsPool(local, remote netip.Addr) *connPool {
	if local == remote {
		return metricsHostPool
	}
	return metricsOthersPool
}

// connPool is a share of a listener's connections: at most total open at once, and at most
// perSource from one source address.
type connPool struct {
	name             string
	total, perSource int
}

// poolListener accepts a connection only while its pool has room, overall and for its source
// address, and closes any other at once (a reset, so that neither end keeps its socket). It
// never blocks on a full pool, unlike golang.org/x/net/netutil.LimitListener: a connection
// waiting in the kernel's backlog behind a stranger's would wait as long as the stranger holds
// on.
type poolListener struct {
	net.Listener
	pool func(local, remote netip.Addr) *connPool

	mu   sync.Mutex
	open map[*connPool]int
	from map[poolSource]int
}

type poolSource struct {
	pool *connPool
	addr netip.Addr
}

// newPoolListener wraps ln; pool picks a new connection's pool from its two addresses (nil
// refuses it).
func newPoolListener(ln net.Listener, pool func(local, remote netip.Addr) *connPool) *poolListener {
	return &poolListener{Listener: ln, pool: pool, open: map[*connPool]int{}, from: map[poolSource]int{}}
}

// Accept returns the next connection its pool has room for.
func (l *poolListener) Accept() (net.Conn, error) {
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

func (l *poolListener) admit(c net.Conn) net.Conn {
	local, ok1 := addrOf(c.LocalAddr())
	remote, ok2 := addrOf(c.RemoteAddr())
	if !ok1 || !ok2 {
		return nil
	}
	p := l.pool(local, remote)
	if p == nil {
		return nil
	}
	key := poolSource{pool: p, addr: remote}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[p] >= p.total || l.from[key] >= p.perSource {
		return nil
	}
	l.open[p]++
	l.from[key]++
	return &poolConn{Conn: c, release: func() { l.release(key) }}
}

func (l *poolListener) release(key poolSource) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open[key.pool]--
	if l.from[key]--; l.from[key] <= 0 {
		delete(l.from, key)
	}
}

// poolConn gives its place in the pool back when closed (net/http closes every connection it
// accepted, whichever way it ends).
type poolConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *poolConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// addrOf is a connection end's IP address, IPv4 in its 4-byte form (an IPv4 client of a dual-
// stack listener arrives as ::ffff:a.b.c.d).
func addrOf(a net.Addr) (netip.Addr, bool) {
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
