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

// Serve serves HTTPS until ctx ends, then lets the reviews in flight finish.
func Serve(ctx context.Context, opts ServerOptions) error {
	logger := klog.FromContext(ctx)
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
		Handler:           Mux(opts.Handler, opts.Gatherer, opts.Ready),
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
