package guard

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
)

// ClientAuth admits only reviews whose caller presented a TLS client certificate that verifies
// against the CAs of a file, and, when names are given, whose subject CommonName is one of them
// (as kube-apiserver's --requestheader-allowed-names checks a front proxy). kube-apiserver presents
// such a certificate to a webhook when its --admission-control-config-file gives the
// ValidatingAdmissionWebhook plugin a kubeconfig with a user for the webhook's host
// (k8s.io/apiserver/pkg/util/webhook, defaultAuthenticationInfoResolver.ClientConfigFor).
//
// The TLS handshake asks for a certificate without requiring one (VerifyClientCertIfGiven): the
// kubelet's probes and Prometheus present none, and they must still reach /readyz and /metrics.
// A certificate that is given must verify, and the review path refuses a caller without one.
type ClientAuth struct {
	caFile       string
	allowedNames []string

	mu   sync.Mutex
	pool *x509.CertPool
	ver  fileVersion
}

// NewClientAuth loads the CA bundle once; a file without a certificate is an error.
func NewClientAuth(caFile string, allowedNames []string) (*ClientAuth, error) {
	a := &ClientAuth{caFile: caFile, allowedNames: slices.Clone(allowedNames)}
	if _, err := a.ClientCAs(); err != nil {
		return nil, err
	}
	return a, nil
}

// ClientCAs returns the CA pool, read again when the file's modification time or size changed.
// A changed file that holds no certificate (half written) leaves the previous pool in use.
func (a *ClientAuth) ClientCAs() (*x509.CertPool, error) {
	v, statErr := stat(a.caFile)
	a.mu.Lock()
	defer a.mu.Unlock()
	if statErr != nil {
		if a.pool != nil {
			return a.pool, nil
		}
		return nil, fmt.Errorf("reading the client CA file: %w", statErr)
	}
	if a.pool != nil && v == a.ver {
		return a.pool, nil
	}
	data, err := os.ReadFile(a.caFile)
	pool := x509.NewCertPool()
	if err == nil && !pool.AppendCertsFromPEM(data) {
		err = errors.New("it holds no PEM certificate")
	}
	if err != nil {
		if a.pool != nil {
			return a.pool, nil
		}
		return nil, fmt.Errorf("loading the client CA file %s: %w", a.caFile, err)
	}
	a.pool, a.ver = pool, v
	return pool, nil
}

// errNoClientCert and errClientName are the reasons Verify refuses a caller.
var (
	errNoClientCert = errors.New("the caller presented no client certificate that verifies against --client-ca-file")
	errClientName   = errors.New("the caller's client certificate has a CommonName that --client-allowed-names does not list")
)

// Verify says why the connection's caller may not post reviews, or nil when it may.
func (a *ClientAuth) Verify(cs *tls.ConnectionState) error {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return errNoClientCert
	}
	if len(a.allowedNames) > 0 && !slices.Contains(a.allowedNames, cs.VerifiedChains[0][0].Subject.CommonName) {
		return fmt.Errorf("%w (%q)", errClientName, cs.VerifiedChains[0][0].Subject.CommonName)
	}
	return nil
}

// tlsConfig is base with client certificates asked for and verified against the current pool,
// read again at each handshake.
func (a *ClientAuth) tlsConfig(base *tls.Config) *tls.Config {
	cfg := base.Clone()
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := a.ClientCAs()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.ClientAuth, c.ClientCAs = tls.VerifyClientCertIfGiven, pool
		return c, nil
	}
	return cfg
}
