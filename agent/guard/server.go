package guard

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Paths the guard serves.
const (
	PathValidate = "/validate-eviction"
	PathHealthz  = "/healthz"
	PathReadyz   = "/readyz"
	PathMetrics  = "/metrics"
)

// errShuttingDown is /readyz's answer while the guard drains.
var errShuttingDown = errors.New("shutting down")

// shutdownTimeout bounds the wait for reviews in flight on SIGTERM: the API server gives a
// review at most timeoutSeconds (3 s in the chart).
const shutdownTimeout = 5 * time.Second

// idleTimeout closes a kept-alive connection with no request for this long: the API server
// reuses its connections far more often than that, and an idle connection holds one of its
// source's ConnsPerSource.
const idleTimeout = 30 * time.Second

// ServerOptions configure Serve.
type ServerOptions struct {
	// BindAddress is host:port of the HTTPS listener.
	BindAddress string
	Certs       *CertReloader
	// Handler answers the reviews. Its ClientAuth, if set, also asks each TLS handshake for a
	// client certificate.
	Handler  *Handler
	Gatherer prometheus.Gatherer
	// Ready, if set, says why the guard is not ready (nil: ready); /readyz answers 503 with it.
	Ready func() error
	// MaxConns and MaxConnsPerSource cap the open connections (Limits.Conns and
	// Limits.ConnsPerSource); zero: no cap.
	MaxConns, MaxConnsPerSource int
	// Listening, if set, is called with the listener's address once it accepts connections.
	Listening func(net.Addr)
	// ShutdownDelay is how long the guard drains once ctx ends, before it closes its
	// connections (zero: none; see Serve). Clock times it (nil: the real clock).
	ShutdownDelay time.Duration
	Clock         clock.Clock
}

// Mux routes the guard's paths: the review, the probes and the metrics. ready (nil: always
// ready) says why the guard is not ready yet.
func Mux(h *Handler, g prometheus.Gatherer, ready func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(PathValidate, h)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc(PathHealthz, ok)
	// Ready once the key pair is loaded (before the listener opened) and ready says so: the pod
	// index's first list (IndexReady). After that a replica stays ready whatever the API server
	// does: what its index knows stays true, and a review whose pod it cannot read answers with
	// an error that the API server's failurePolicy handles.
	mux.HandleFunc(PathReadyz, func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		ok(w, r)
	})
	mux.Handle(PathMetrics, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

// Serve serves HTTPS until ctx ends, drains for opts.ShutdownDelay, then lets the reviews in
// flight finish.
//
// The drain is for the API server's kept-alive connections. A review is a POST, which Go's
// HTTP client (and so kube-apiserver's webhook client) sends again on another connection only
// when nothing of it was written: a server that closes an idle connection just as the API
// server reuses it fails that review ("write: broken pipe"), and with failurePolicy Fail the
// eviction is refused. An HTTP/1.1 server's Shutdown closes every idle connection at once, so
// a rollout of the guard refused an eviction (make test, TestLifecycleGuardCertificateSurvivesReapply,
// issue 52). While it drains, the guard still accepts connections and answers every request
// with "Connection: close", so the API server closes each connection itself after its answer,
// and /readyz fails, so the Service stops routing to it; only then does Shutdown close what is
// left idle.
func Serve(ctx context.Context, opts ServerOptions) error {
	logger := klog.FromContext(ctx)
	var draining atomic.Bool
	ready := func() error {
		if draining.Load() {
			return errShuttingDown
		}
		if opts.Ready != nil {
			return opts.Ready()
		}
		return nil
	}
	mux := Mux(opts.Handler, opts.Gatherer, ready)
	// HTTP/1.1 only. kube-apiserver calls a webhook behind a Service with HTTP/1.1 alone
	// (ClientManager.hookClientConfig, for kubernetes/kubernetes#75791), so HTTP/2 would serve
	// only callers that are not the API server, each connection carrying up to 250 reviews at
	// once past the cap on connections. Set here as well as in Protocols: a ClientAuth's
	// per-handshake config is a clone of this one.
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: opts.Certs.GetCertificate, NextProtos: []string{"http/1.1"}}
	if opts.Handler != nil && opts.Handler.ClientAuth != nil {
		tlsConfig = opts.Handler.ClientAuth.tlsConfig(tlsConfig)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if draining.Load() {
				// net/http closes the connection after this answer.
				w.Header().Set("Connection", "close")
			}
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       idleTimeout,
		TLSConfig:         tlsConfig,
		Protocols:         http1Only(),
		// Failed handshakes (a caller without a certificate, a port scan) are net/http's to
		// report: at most one line a minute, so that a flood does not flood the log.
		ErrorLog: log.New(&sparseLog{logger: logger, every: time.Minute, clock: clock.RealClock{}}, "", 0),
		// Reviews keep the logger but not the cancellation: on SIGTERM those in flight finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	ln, err := net.Listen("tcp", opts.BindAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", opts.BindAddress, err)
	}
	if opts.MaxConns > 0 && opts.MaxConnsPerSource > 0 {
		var refused func()
		if opts.Handler != nil && opts.Handler.Metrics != nil {
			refused = opts.Handler.Metrics.ConnectionsRefused.Inc
		}
		ln = connLimitListener(ln, opts.MaxConns, opts.MaxConnsPerSource, refused)
	}
	logger.Info("Serving the eviction guard", "address", ln.Addr().String(), "path", PathValidate)
	if opts.Listening != nil {
		opts.Listening(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving HTTPS on %s: %w", opts.BindAddress, err)
	case <-ctx.Done():
	}
	if opts.ShutdownDelay > 0 {
		logger.Info("Draining the eviction guard: every answer closes its connection, and /readyz fails", "for", opts.ShutdownDelay)
		draining.Store(true)
		clk := opts.Clock
		if clk == nil {
			clk = clock.RealClock{}
		}
		select {
		case err := <-errc:
			return fmt.Errorf("serving HTTPS on %s: %w", opts.BindAddress, err)
		case <-clk.After(opts.ShutdownDelay):
		}
	}
	logger.Info("Shutting down the eviction guard")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down the HTTPS server: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTPS on %s: %w", opts.BindAddress, err)
	}
	return nil
}

// sparseLog is net/http's error log: one line per interval, with the count of those dropped
// since the last.
type sparseLog struct {
	logger klog.Logger
	every  time.Duration
	clock  clock.PassiveClock

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (s *sparseLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	now := s.clock.Now()
	if !s.last.IsZero() && now.Sub(s.last) < s.every {
		s.dropped++
		s.mu.Unlock()
		return len(p), nil
	}
	dropped := s.dropped
	s.last, s.dropped = now, 0
	s.mu.Unlock()
	s.logger.Info("HTTPS server error", "error", strings.TrimSpace(string(p)), "droppedSinceLast", dropped)
	return len(p), nil
}

func http1Only() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	return p
}
