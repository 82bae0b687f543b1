// Package faultproxy is an HTTP reverse proxy that puts faults between reprieve and a metadata
// endpoint (amazon-ec2-metadata-mock, the GCP or Azure fakes) for the end-to-end fault tests:
// 5xx bursts, hanging requests, malformed and truncated bodies, 401 (an expired IMDSv2 token),
// 429 (Azure's throttling) and reset connections. It can also be started late, on an address
// chosen up front, so that the endpoint is down when the agent starts.
//
// Faults apply to reads (GET) only: the IMDSv2 token request (PUT) and Azure approvals (POST)
// always pass, so that a fault hits the notice sources and not the credentials, which
// the providers' unit tests cover. BlackHole is the exception: it swallows every request,
// the token PUT included, as a route that drops packets does (an IMDSv2 token answer lost to
// the hop limit of 1 from inside a container: AWS, "Use IMDSv2", the hop limit; a stalled GCP
// metadata server: issue 13).
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
)

// Mode is the fault the proxy applies to each read.
type Mode string

// The faults.
const (
	Pass         Mode = "pass"         // forward to the backend
	ServerError  Mode = "server-error" // 503
	Hang         Mode = "hang"         // no answer until the client gives up; reset when the mode changes
	Malformed    Mode = "malformed"    // 200 with a body no provider can parse
	Truncated    Mode = "truncated"    // 200 whose body ends before its Content-Length
	Unauthorized Mode = "unauthorized" // 401, as IMDSv2 answers an expired token
	Throttled    Mode = "throttled"    // 429 with Retry-After: 1, as Azure IMDS throttles
	Reset        Mode = "reset"        // the connection closed without an answer
	// BlackHole accepts every request, of every method, and never answers nor resets it, not
	// even when the mode changes: only the client's own timeout ends it.
	BlackHole Mode = "black-hole"
)

// MalformedBody is what Malformed serves: not JSON, and no value a metadata server sends.
const MalformedBody = "\x00{\"garbage"

// Proxy forwards to a backend with a settable fault.
type Proxy struct {
	rp *httputil.ReverseProxy

	mu      sync.Mutex
	mode    Mode
	counts  map[Mode]int
	srv     *http.Server
	closing chan struct{}
	// release is closed when the mode changes: requests in flight (held by Hang, or passed to
	// the backend and waiting there, as GCP's hanging GETs do for up to a minute) are then
	// reset, as a metadata server that restarts drops its connections. Without it, a GCP
	// client would meet a new fault only when its hanging GET returned.
	release chan struct{}
}

// New returns a proxy to backend (http://host:port) in Pass mode.
func New(backend string) (*Proxy, error) {
	u, err := url.Parse(backend)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: backend %q is not an http://host:port URL", backend)
	}
	// Transparent: no X-Forwarded-For (GCP's and Azure's metadata servers refuse requests that
	// carry one, as the fakes do) and the client's Host kept.
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host
		},
		// Hanging GETs (GCP) must stream their answer when it comes.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(context.Cause(r.Context()), errReleased) {
				reset(w)
				return
			}
			http.Error(w, "faultproxy: "+err.Error(), http.StatusBadGateway)
		},
	}
	return &Proxy{rp: rp, mode: Pass, counts: map[Mode]int{}, closing: make(chan struct{}), release: make(chan struct{})}, nil
}

// ReserveAddr returns a free 127.0.0.1 address for Start, so that a client can be pointed at
// the proxy before it listens (the endpoint down at start).
func ReserveAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("faultproxy: reserving an address: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("faultproxy: reserving an address: %w", err)
	}
	return addr, nil
}

// Start serves on addr ("127.0.0.1:0" for any port) and returns the proxy's http:// URL.
func (p *Proxy) Start(addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("faultproxy: listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: p}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), nil
}

// Close stops serving and releases hanging requests.
func (p *Proxy) Close() {
	p.mu.Lock()
	srv := p.srv
	select {
	case <-p.closing:
	default:
		close(p.closing)
	}
	p.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Set changes the fault for the requests that arrive from now on.
func (p *Proxy) Set(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m != p.mode {
		close(p.release)
		p.release = make(chan struct{})
	}
	p.mode = m
}

// Count returns how many reads the proxy answered (or held) with mode m.
func (p *Proxy) Count(m Mode) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[m]
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mode := Pass
	p.mu.Lock()
	release := p.release
	if r.Method == http.MethodGet || p.mode == BlackHole {
		mode = p.mode
		p.counts[mode]++
	}
	p.mu.Unlock()
	switch mode {
	case BlackHole:
		select {
		case <-r.Context().Done():
		case <-p.closing:
		}
	case ServerError:
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
	case Hang:
		select {
		case <-r.Context().Done():
		case <-p.closing:
		case <-release:
			reset(w)
		}
	case Malformed:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(MalformedBody))
	case Truncated:
		body := []byte(`{"Document`)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(10*len(body)))
		_, _ = w.Write(body)
		// Returning with less than Content-Length written makes the server close the
		// connection: the client reads an unexpected EOF.
	case Unauthorized:
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	case Throttled:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "Too many requests", http.StatusTooManyRequests)
	case Reset:
		reset(w)
	default:
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		go func() {
			select {
			case <-release:
				cancel(errReleased)
			case <-ctx.Done():
			}
		}()
		p.rp.ServeHTTP(w, r.WithContext(ctx))
	}
}

// errReleased cancels a passed request when the mode changes.
var errReleased = errors.New("faultproxy: mode changed")

// reset closes the request's connection with a TCP RST and no answer.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "cannot reset", http.StatusInternalServerError)
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // RST, not FIN
	}
	_ = conn.Close()
}
