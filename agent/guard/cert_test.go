package guard

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"
)

// writePair writes a self-signed certificate for 127.0.0.1 named cn, and its key, and sets both
// files' modification time to mod (a reload must not depend on the file system's resolution).
func writePair(t *testing.T, dir, cn string, mod time.Time) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func servedCN(t *testing.T, r *CertReloader) string {
	t.Helper()
	c, err := r.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

func TestCertReloader(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	certFile, keyFile, _ := writePair(t, dir, "first", t0)
	r, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, r); cn != "first" {
		t.Fatalf("serving %q; want first", cn)
	}
	writePair(t, dir, "second", t0.Add(time.Minute))
	if cn := servedCN(t, r); cn != "second" {
		t.Errorf("after rotation serving %q; want second", cn)
	}
	// Half a rotation (a key that does not match, or none): the previous pair stays.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, r); cn != "second" {
		t.Errorf("with a broken key serving %q; want the previous pair, second", cn)
	}
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, r); cn != "second" {
		t.Errorf("with the certificate gone serving %q; want the previous pair, second", cn)
	}
	if _, err := NewCertReloader(certFile, keyFile); err == nil {
		t.Error("NewCertReloader loaded a missing pair; want an error")
	}
}

// TestServe serves HTTPS with the reloader's pair until the context ends, and returns nil.
func TestServe(t *testing.T) {
	certFile, keyFile, cert := writePair(t, t.TempDir(), "guard", time.Now())
	certs, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServerOptions{BindAddress: "127.0.0.1:0", Certs: certs, Handler: &Handler{},
			Gatherer: prometheus.NewRegistry(), Listening: func(a net.Addr) { addr <- a }})
	}()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	// A client that offers HTTP/2 gets HTTP/1.1: the one protocol the API server calls a
	// Service's webhook with.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := client.Get("https://" + (<-addr).String() + PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Errorf("readyz: %d over %s; want 200 over HTTP/1.1", resp.StatusCode, resp.Proto)
	}
	client.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v; want nil", err)
	}
}

// TestServeDrainsBeforeClosing (issue 52): on SIGTERM the guard drains for ShutdownDelay before
// it closes its connections. The API server sends a review again on another connection only
// when nothing of it was written, so closing a kept-alive connection as the API server reused it
// refused an eviction during a rollout (TestLifecycleGuardCertificateSurvivesReapply). While it
// drains, the idle connection is still there and answers, with "Connection: close"; /readyz
// fails; the guard stops only when the delay has passed.
func TestServeDrainsBeforeClosing(t *testing.T) {
	certFile, keyFile, cert := writePair(t, t.TempDir(), "guard", time.Now())
	certs, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServerOptions{BindAddress: "127.0.0.1:0", Certs: certs, Handler: &Handler{},
			Gatherer: prometheus.NewRegistry(), Listening: func(a net.Addr) { addr <- a },
			ShutdownDelay: 10 * time.Second, Clock: clk})
	}()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	base := "https://" + (<-addr).String()
	get := func(path string) (*http.Response, bool) {
		t.Helper()
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, reused
	}
	if resp, _ := get(PathReadyz); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("before SIGTERM: readyz %d, Connection: close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	cancel()
	// The drain has begun once Serve waits on the clock.
	for !clk.HasWaiters() {
		select {
		case err := <-done:
			t.Fatalf("Serve returned %v before its drain", err)
		default:
			runtime.Gosched()
		}
	}
	resp, reused := get(PathHealthz)
	if resp.StatusCode != http.StatusOK || !reused || !resp.Close {
		t.Errorf("draining: healthz %d on the kept-alive connection %v, Connection: close %v; want 200 on it, closed after the answer", resp.StatusCode, reused, resp.Close)
	}
	if resp, _ := get(PathReadyz); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("draining: readyz %d; want 503, so that the Service stops routing to the replica", resp.StatusCode)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v during its drain", err)
	default:
	}
	clk.Step(10 * time.Second)
	if err := <-done; err != nil {
		t.Errorf("Serve after its drain: %v; want nil", err)
	}
}
