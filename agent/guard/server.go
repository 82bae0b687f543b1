package guard

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
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

// ServerOptions configure Serve.
type ServerOptions struct {
	// BindAddress is host:port of the HTTPS listener.
	BindAddress string
	Certs       *CertReloader
	Handler     *Handler
	Gatherer    prometheus.Gatherer
	// Listening, if set, is called with the listener's address once it accepts connections.
	Listening func(net.Addr)
}

// Mux routes the guard's paths: the review, the probes and the metrics.
func Mux(h *Handler, g prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(PathValidate, h)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc(PathHealthz, ok)
	// Ready as soon as it serves: the key pair loaded before the listener opened, and a review
	// that cannot read its pod answers with an error the API server's failurePolicy handles.
	mux.HandleFunc(PathReadyz, ok)
	mux.Handle(PathMetrics, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

// Serve serves HTTPS until ctx ends, then lets the reviews in flight finish.
func Serve(ctx context.Context, opts ServerOptions) error {
	logger := klog.FromContext(ctx)
	srv := &http.Server{
		Handler:           Mux(opts.Handler, opts.Gatherer),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: opts.Certs.GetCertificate},
		// Reviews keep the logger but not the cancellation: on SIGTERM those in flight finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	ln, err := net.Listen("tcp", opts.BindAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", opts.BindAddress, err)
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
