package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/serve"
	"github.com/reprieve-dev/reprieve/providers/detect"
)

// providerChoice is the provider the agent runs with, and what decided it.
type providerChoice struct {
	// name is a --provider value other than auto.
	name string
	// providerID is the node's spec.providerID when it was read to decide; "" otherwise.
	providerID string
	// reason says why, for the log; "" when the flag named the provider.
	reason string
	// nodeAccelerator says what the node shows of accelerators once it was read, for GCP's
	// maintenance notice (gcp.Options.NodeAccelerator); nil when nothing will read it.
	nodeAccelerator func() (gpu bool, why string, known bool)
}

// chooseProvider resolves --provider. A named provider needs nothing more. auto asks the host's
// DMI first (detect.FromHost), which needs no API server; only when DMI names no cloud does it
// read the node's spec.providerID, retrying until the API server answers (getNode), and decide
// with detect.Detect. While it waits, serveWait keeps /healthz answering (a liveness probe must
// not restart the process into CrashLoopBackOff for an API server that is down); the function
// it returns stops that, before the agent listens on the same address.
func chooseProvider(ctx context.Context, cfg config.Config, client kube.Interface, clk clock.WithTicker, serveWait func(why string) (stop func(), err error)) (providerChoice, error) {
	logger := klog.FromContext(ctx)
	if cfg.Provider != "auto" {
		return providerChoice{name: cfg.Provider}, nil
	}
	host, ok := detect.FromHost(cfg.HostRoot)
	if ok {
		logger.Info("Detected the provider", "provider", host.Provider, "reason", host.Reason)
		return providerChoice{name: host.Provider, reason: host.Reason}, nil
	}
	logger.Info("DMI names no cloud: reading the node's providerID", "node", klog.KRef("", cfg.NodeName), "dmi", host.Reason)
	why := fmt.Sprintf("--provider auto: DMI under --host-root %s names no cloud; waiting for the API server to read node %s's spec.providerID", cfg.HostRoot, cfg.NodeName)
	var stop func()
	node, err := getNode(ctx, client, cfg.NodeName, clk, "detect its cloud", func() (err error) {
		stop, err = serveWait(why)
		return err
	})
	if stop != nil {
		stop()
	}
	if err != nil {
		return providerChoice{}, err
	}
	d := detect.Detect(node.Spec.ProviderID, cfg.HostRoot)
	logger.Info("Detected the provider", "provider", d.Provider, "reason", d.Reason)
	return providerChoice{name: d.Provider, providerID: node.Spec.ProviderID, reason: d.Reason}, nil
}

// Bounds of getNode: each attempt gets nodeGetTimeout (client-go sets none, and a black-holed
// API server would hold a GET for minutes); failed attempts back off from nodeRetryBase,
// doubling up to nodeRetryCap, the cap of client-go's reflector for a failing list
// (tools/cache/reflector.go, defaultBackoffMax), so that the agent's informers and this read
// come back together.
const (
	nodeGetTimeout = 10 * time.Second
	nodeRetryBase  = 500 * time.Millisecond
	nodeRetryCap   = 30 * time.Second
)

// getNode reads the node, retrying every failure (the API server down or unreachable, the node
// not registered yet, a permission still missing) with jittered exponential backoff on clk,
// until it succeeds or ctx ends; it never gives up on its own. Each failure is logged.
// onFirstFailure, when not nil, runs once, after the first failure; an error from it ends the
// wait.
func getNode(ctx context.Context, client kube.Interface, name string, clk clock.WithTicker, why string, onFirstFailure func() error) (*v1.Node, error) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: nodeRetryBase, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: nodeRetryCap}
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, nodeGetTimeout)
		node, err := client.CoreV1().Nodes().Get(rctx, name, metav1.GetOptions{})
		cancel()
		if err == nil {
			if attempt > 1 {
				logger.Info("Read the node", "node", klog.KObj(node), "purpose", why, "attempts", attempt)
			}
			return node, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading node %s to %s: %w", name, why, context.Cause(ctx))
		}
		if attempt == 1 && onFirstFailure != nil {
			if ferr := onFirstFailure(); ferr != nil {
				return nil, errors.Join(fmt.Errorf("reading node %s to %s: %w", name, why, err), ferr)
			}
		}
		delay := backoff.Step()
		logger.Info("Reading the node failed; retrying", "node", klog.KRef("", name), "purpose", why, "attempt", attempt, "retryIn", delay.Round(time.Millisecond), "err", err.Error())
		t := clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("reading node %s to %s: %w (last error: %v)", name, why, context.Cause(ctx), err)
		case <-t.C():
		}
	}
}

// serveWhileWaiting serves, on the agent's --metrics-bind-address, what the agent serves there
// before it is ready: /healthz ok, /readyz 503 with why, and /metrics. It returns the function
// that stops it and frees the address; nothing is served when the address is empty or "0".
func serveWhileWaiting(ctx context.Context, addr string, gatherer prometheus.Gatherer, why string) (stop func(), err error) {
	if addr == "" || addr == "0" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on --metrics-bind-address %s: %w", addr, err)
	}
	_, stop = serveWaitingOn(ctx, ln, gatherer, why)
	return stop, nil
}

// serveWaitingOn serves serveWhileWaiting's handlers on ln, bounded as the agent's metrics
// server is, and returns the server and the function that stops it and closes ln.
func serveWaitingOn(ctx context.Context, ln net.Listener, gatherer prometheus.Gatherer, why string) (srv *http.Server, stop func()) {
	klog.FromContext(ctx).Info("Serving health checks while waiting", "address", ln.Addr().String(), "why", why)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
	})
	// The agent's own server and listener for this address (issue 39 item 7): the same
	// timeouts, header limit and connection pools, so that a flood that cannot hold the
	// agent's metrics port cannot hold it while the agent waits either.
	srv = serve.NewMetricsServer(ln.Addr().String(), mux)
	bounded := serve.MetricsListener(ln)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(bounded) }()
	return srv, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // closes the listener at once
		<-done
	}
}
