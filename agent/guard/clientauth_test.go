package guard

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
)

// testCA is a CA that signs client certificates, as the operator's for the API server.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client is a TLS client certificate named cn, signed by the CA.
func (ca *testCA) client(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientAuth serves the guard with --client-ca-file and --client-allowed-names over real
// TLS: a caller without a certificate reaches the probes but gets no review answered, nor does
// one whose name is not allowed; a certificate of another CA fails the handshake; the API
// server's certificate gets its review answered, and a new CA file takes effect without a restart.
func TestClientAuth(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, serving := writePair(t, dir, "guard", time.Now())
	certs, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ca1, ca2 := newTestCA(t, "apiserver-ca"), newTestCA(t, "other-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(caFile, ca1.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClientAuth(filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("NewClientAuth took a missing file")
	}
	if err := os.WriteFile(filepath.Join(dir, "empty.crt"), []byte("no PEM here"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClientAuth(filepath.Join(dir, "empty.crt"), nil); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("NewClientAuth on a file without a certificate: %v; want an error saying so", err)
	}
	auth, err := NewClientAuth(caFile, []string{"kube-apiserver"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p := &pods{byName: map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", "uid-a")}}
	h := &Handler{Username: agentUser, GetPod: p.get, Metrics: m, ClientAuth: auth}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServerOptions{BindAddress: "127.0.0.1:0", Certs: certs, Handler: h, Gatherer: reg,
			MaxConns: 100, MaxConnsPerSource: 100, Listening: func(a net.Addr) { addrc <- a }})
	}()
	base := "https://" + (<-addrc).String()
	roots := x509.NewCertPool()
	roots.AddCert(serving)
	client := func(certs ...tls.Certificate) *http.Client {
		// A transport per call: no connection, and so no handshake, carries over.
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
	}
	review := func(c *http.Client) (int, string, error) {
		resp, err := c.Post(base+PathValidate, "application/json", bytes.NewReader(reviewBody(t, "on-a")))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String(), nil
	}

	if resp, err := client().Get(base + PathReadyz); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("readyz without a certificate: %v %v; want 200 (the kubelet's probe presents none)", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _, err := review(client()); err != nil || code != http.StatusForbidden {
		t.Errorf("a review without a certificate: %d %v; want 403", code, err)
	}
	if code, _, err := review(client(ca1.client(t, "intruder"))); err != nil || code != http.StatusForbidden {
		t.Errorf("a review with a certificate the CA signed for another name: %d %v; want 403", code, err)
	}
	// Go's client sends no certificate that none of the server's acceptable CAs signed: a 403
	// as without one (another client's certificate would fail the handshake).
	if code, _, err := review(client(ca2.client(t, "kube-apiserver"))); err == nil && code != http.StatusForbidden {
		t.Errorf("a certificate of another CA: %d; want the handshake refused or a 403", code)
	}
	forced := ca2.client(t, "kube-apiserver")
	pushy := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &forced, nil }}}}
	if code, _, err := review(pushy); err == nil {
		t.Errorf("a certificate of another CA, sent anyway: %d; want the handshake refused", code)
	}
	if code, body, err := review(client(ca1.client(t, "kube-apiserver"))); err != nil || code != http.StatusOK || !strings.Contains(body, `"allowed":true`) {
		t.Errorf("the API server's review: %d %s %v; want it allowed", code, body, err)
	}
	if p.calls != 1 {
		t.Errorf("%d pod reads; want 1, for the API server's review only", p.calls)
	}
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultRejected)); got < 2 {
		t.Errorf("rejected = %v; want at least 2", got)
	}

	// A new CA: the kubelet rewrites the mounted file; the next handshake reads it.
	if err := os.WriteFile(caFile, ca2.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(caFile, later, later); err != nil {
		t.Fatal(err)
	}
	if code, _, err := review(client(ca2.client(t, "kube-apiserver"))); err != nil || code != http.StatusOK {
		t.Errorf("the new CA's certificate after the file changed: %d %v; want 200", code, err)
	}
	if code, _, err := review(client(ca1.client(t, "kube-apiserver"))); err == nil && code != http.StatusForbidden {
		t.Errorf("the old CA's certificate after the file changed: %d; want it refused", code)
	}
	// Half written: the previous pool stays.
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, err := review(client(ca2.client(t, "kube-apiserver"))); err != nil || code != http.StatusOK {
		t.Errorf("with a half-written CA file: %d %v; want the previous CA still in force", code, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
