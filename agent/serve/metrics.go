package serve

import (
	"net"
	"net/http"
	"net/netip"
	"time"
)

// metricsWriteTimeout bounds a response from handler start to its last byte: the agent's
// scrape is gathered in milliseconds and the PodMonitor's scrapeTimeout is 4 s; only a client
// that reads slowly on purpose gets near it.
const metricsWriteTimeout = 30 * time.Second

// The metrics server's pools. The kubelet's probes of a host-network agent come from the node
// itself: it dials the pod IP, which is a node address, and the kernel's source address for a
// local destination is that same address, so the connection's two ends have one address. The
// host pool keeps /readyz and /healthz answering when strangers fill theirs from many
// addresses. On the pod network the probes come from the node's side of the pod's interface
// (an address per CNI); there they share the others' pool, where the per-source cap keeps one
// flooding address from starving them.
var (
	MetricsHostPool   = &Pool{Name: "host", Total: 32, PerSource: 32}
	MetricsOthersPool = &Pool{Name: "others", Total: 256, PerSource: 8}
)

// NewMetricsServer returns the server of --metrics-bind-address, serving h with every timeout and
// the header limit, for the agent and for a server that stands in for it on the same address
// (cmd/reprieve's health server while the agent waits at start). Serve it on MetricsListener's
// listener.
func NewMetricsServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr: addr, Handler: h,
		ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: IdleTimeout,
		MaxHeaderBytes: MaxHeaderBytes,
	}
}

// MetricsListener bounds ln's connections by the metrics server's pools: the host's own
// connections (the kubelet's probes of a host-network agent) apart from any other's, each
// with a total and a per-source cap. Each listener counts its own connections.
func MetricsListener(ln net.Listener) net.Listener { return NewListener(ln, metricsPool) }

// metricsPool puts a connection from the host itself in the host pool, any other in the
// others' pool.
func metricsPool(local, remote netip.Addr) *Pool {
	if local == remote {
		return MetricsHostPool
	}
	return MetricsOthersPool
}
