package guard

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// CertReloader serves a TLS key pair from files and reloads it when either file's modification
// time or size changes, so that a rotated Secret (the kubelet updates the mounted files) takes
// effect without a restart. One stat of each file per handshake is the whole cost: the API
// server keeps its connections to a webhook alive.
type CertReloader struct {
	certFile, keyFile string
	// source, when set, replaces the files: the pair the guard keeps itself (SelfCert).
	source func() (*tls.Certificate, error)

	mu      sync.Mutex
	cert    *tls.Certificate
	certMod fileVersion
	keyMod  fileVersion
}

type fileVersion struct {
	mod  time.Time
	size int64
}

// NewCertReloader loads the pair once; a pair that does not load is an error.
func NewCertReloader(certFile, keyFile string) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.current(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate is tls.Config's GetCertificate: the current pair, reloaded if the files
// changed. A changed pair that does not load (the kubelet swaps the files one at a time) leaves
// the previous one in use until both agree.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current()
}

// NewCertSource serves the pair that get returns, for a pair kept in memory rather than in
// files (SelfCert.Current). It must return a pair already.
func NewCertSource(get func() (*tls.Certificate, error)) (*CertReloader, error) {
	if _, err := get(); err != nil {
		return nil, err
	}
	return &CertReloader{source: get}, nil
}

func (r *CertReloader) current() (*tls.Certificate, error) {
	if r.source != nil {
		return r.source()
	}
	cv, err := stat(r.certFile)
	if err != nil {
		return r.fallback(err)
	}
	kv, err := stat(r.keyFile)
	if err != nil {
		return r.fallback(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && cv == r.certMod && kv == r.keyMod {
		return r.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		if r.cert != nil {
			return r.cert, nil
		}
		return nil, fmt.Errorf("loading the TLS key pair %s, %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.certMod, r.keyMod = &pair, cv, kv
	return r.cert, nil
}

func (r *CertReloader) fallback(err error) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil {
		return r.cert, nil
	}
	return nil, fmt.Errorf("reading the TLS key pair: %w", err)
}

func stat(path string) (fileVersion, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileVersion{}, err
	}
	return fileVersion{mod: st.ModTime(), size: st.Size()}, nil
}
