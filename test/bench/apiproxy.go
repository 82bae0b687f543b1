package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// apiProxy sits between one agent and kube-apiserver and counts the agent's requests by verb
// and resource, and its open watches. kube-apiserver's own metrics carry no client label, so
// this is how a request is attributed to one agent among kwok, kube-controller-manager and
// the other agents.
type apiProxy struct {
	mu      sync.Mutex
	counts  map[string]int // "VERB resource"
	codes   map[string]int // "VERB resource code", the answers' status codes
	watches int
	srv     *http.Server
	URL     string
	tlsCert *tls.Certificate // nil: plain HTTP
}

// startAPIProxy forwards to target with token: client-go sends credentials only over TLS, so
// the agent's kubeconfig for the proxy carries none and the proxy adds them.
func startAPIProxy(target string, caPEM []byte, token string) (*apiProxy, error) {
	return startAPIProxyWith(target, caPEM, token, nil)
}

// startAPIProxyWith is startAPIProxy serving TLS with cert when it is not nil.
func startAPIProxyWith(target string, caPEM []byte, token string, cert *tls.Certificate) (*apiProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", target, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	rp := httputil.NewSingleHostReverseProxy(u)
	direct := rp.Director
	rp.Director = func(r *http.Request) {
		direct(r)
		r.Header.Set("Authorization", "Bearer "+token)
	}
	rp.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 16,
	}
	rp.FlushInterval = -1 // watches stream
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the API proxy: %w", err)
	}
	p := &apiProxy{counts: map[string]int{}, codes: map[string]int{}, URL: "http://" + ln.Addr().String(), tlsCert: cert}
	if cert != nil {
		p.URL = "https://" + ln.Addr().String()
	}
	p.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		verb, resource := classify(r)
		p.mu.Lock()
		p.counts[verb+" "+resource]++
		if verb == "WATCH" {
			p.watches++
		}
		p.mu.Unlock()
		if verb == "WATCH" {
			defer func() { p.mu.Lock(); p.watches--; p.mu.Unlock() }()
		}
		if verb == "WATCH" {
			rp.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		rp.ServeHTTP(sw, r)
		p.mu.Lock()
		p.codes[fmt.Sprintf("%s %s %d", verb, resource, sw.code)]++
		p.mu.Unlock()
	})}
	if p.tlsCert != nil {
		// Set before the server's goroutine starts, not in it.
		p.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*p.tlsCert}, MinVersion: tls.VersionTLS12}
	}
	go func() {
		if err := p.serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("bench: API proxy: %v\n", err)
		}
	}()
	return p, nil
}

// serve serves plain HTTP, or TLS when tlsCert is set (for programs that, like client-go's
// in-cluster config, only speak HTTPS).
func (p *apiProxy) serve(ln net.Listener) error {
	if p.tlsCert == nil {
		return p.srv.Serve(ln)
	}
	return p.srv.ServeTLS(ln, "", "")
}

// counts returns a copy of the request counts and the number of open watches.
func (p *apiProxy) snapshot() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.counts), p.watches
}

func (p *apiProxy) Close() { _ = p.srv.Close() }

// codeCounts returns a copy of the answers' status codes by "VERB resource code" (watches
// apart).
func (p *apiProxy) codeCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.codes)
}

// statusWriter remembers the status code of a response.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// kubeconfig writes a kubeconfig for the proxy into dir and returns its path.
func (p *apiProxy) kubeconfig(dir, name string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["bench"] = &clientcmdapi.Cluster{Server: p.URL}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "agent"}
	cfg.CurrentContext = "bench"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}

// classify names a request as kube-apiserver's metrics do: verb (WATCH, LIST, GET, CREATE,
// PATCH, UPDATE, DELETE) and resource (with /subresource).
func classify(r *http.Request) (verb, resource string) {
	path := strings.Trim(r.URL.Path, "/")
	seg := strings.Split(path, "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return r.Method, "/" + path
	}
	if len(seg) >= 2 && seg[0] == "namespaces" && len(seg) > 2 {
		seg = seg[2:]
	}
	named := len(seg) >= 2
	if len(seg) > 0 {
		resource = seg[0]
	}
	if len(seg) >= 3 {
		resource += "/" + seg[2]
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			verb = "WATCH"
		case named:
			verb = "GET"
		default:
			verb = "LIST"
		}
	case http.MethodPost:
		verb = "CREATE"
	case http.MethodPatch:
		verb = "PATCH"
	case http.MethodPut:
		verb = "UPDATE"
	case http.MethodDelete:
		verb = "DELETE"
	default:
		verb = r.Method
	}
	return verb, resource
}

// requestDiff is the requests between two snapshots, by "VERB resource".
func requestDiff(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// nonWatch adds up the requests of d that are not watches.
func nonWatch(d map[string]int) int {
	n := 0
	for k, v := range d {
		if !strings.HasPrefix(k, "WATCH ") {
			n += v
		}
	}
	return n
}

// total adds up every request of d.
func total(d map[string]int) int {
	n := 0
	for _, v := range d {
		n += v
	}
	return n
}
