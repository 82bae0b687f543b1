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
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// The keys of the Secret SelfCert keeps its CA and serving pair in. ca.crt and tls.crt, tls.key
// are the names kubernetes.io/tls Secrets and cert-manager use, so that the chart's PodMonitor
// reads ca.crt whichever way the pair was made.
const (
	SecretCACert  = "ca.crt"
	SecretCAKey   = "ca.key"
	SecretTLSCert = v1.TLSCertKey
	SecretTLSKey  = v1.TLSPrivateKeyKey
)

// SecretClient is what SelfCert calls on Secrets: client-go's typed SecretInterface has it.
type SecretClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Secret, error)
	Update(ctx context.Context, secret *v1.Secret, opts metav1.UpdateOptions) (*v1.Secret, error)
}

// WebhookClient reads and writes the caBundles of a ValidatingWebhookConfiguration. It does not
// take the typed object: the binary links no k8s.io/api/admissionregistration (agent/kube's
// Scheme, TestBinaryLinksOnlyItsGroups); NewSelfCertClients' speaks JSON.
type WebhookClient interface {
	// CABundles returns the caBundle of each webhook, in order, and the resourceVersion read.
	CABundles(ctx context.Context, name string) (Webhooks, error)
	// SetCABundles sets every webhook's caBundle to bundle, if the configuration still has
	// the resourceVersion and webhooks read (else an error).
	SetCABundles(ctx context.Context, name string, read Webhooks, bundle []byte) (Webhooks, error)
}

// Webhooks is a ValidatingWebhookConfiguration as SelfCert sees it.
type Webhooks struct {
	ResourceVersion string
	// Names and CABundles are per webhook, in the configuration's order.
	Names     []string
	CABundles [][]byte
}

// SelfCertOptions configure SelfCert.
type SelfCertOptions struct {
	Secrets SecretClient
	// SecretName is the Secret (in Secrets' namespace) the CA and the pair are kept in. The chart
	// renders it empty; the guard fills it. It must exist: the guard may not create Secrets (a
	// create cannot be scoped to one name, and a Secret of type service-account-token would
	// mint a token for any ServiceAccount of the namespace).
	SecretName string
	Webhooks   WebhookClient
	// WebhookName is the ValidatingWebhookConfiguration whose every webhook's caBundle is kept
	// equal to the Secret's ca.crt.
	WebhookName string
	// Hosts are the serving certificate's DNS names and IP addresses.
	Hosts []string
	// CAValidity and CertValidity are the lifetimes of a new CA and a new serving certificate;
	// each is renewed when less than a third of it is left.
	CAValidity, CertValidity time.Duration
	Clock                    clock.PassiveClock
	// Metrics, if set, is kept up to date by Sync.
	Metrics *CertMetrics
}

// DefaultCAValidity and DefaultCertValidity are SelfCertOptions' defaults: a CA for ten years, so
// that the caBundle rarely changes; a serving certificate for one year, renewed after eight
// months by whichever replica syncs first.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
)

// SelfCert makes, rotates and publishes the guard's own certificate, so that no install path
// (helm install, `helm template`, Argo CD, kustomize) has to generate one at render time: the
// chart renders an empty Secret and a webhook without a caBundle, and every replica's Sync
// converges both, whoever applies the chart and however often.
//
// The replicas share the Secret. Each Sync reads it, and writes it only when something must
// change, with the resourceVersion read (optimistic concurrency): of two replicas that decide
// at once, one write wins and the other gets a Conflict and serves the winner's pair at its
// next Sync. A new CA goes into the caBundle beside the old one (kept until it expires), and
// the serving certificate moves to the new CA only at a later Sync that reads the new CA in the
// webhook's caBundle, so that the API server never meets a certificate its caBundle does not
// verify.
type SelfCert struct {
	o SelfCertOptions

	mu   sync.Mutex
	pair *tls.Certificate
}

// NewSelfCert checks the options; nothing is read until Sync.
func NewSelfCert(o SelfCertOptions) (*SelfCert, error) {
	if o.Secrets == nil || o.Webhooks == nil || o.SecretName == "" || o.WebhookName == "" || len(o.Hosts) == 0 {
		return nil, errors.New("the guard's own certificate needs a Secret, a webhook configuration and at least one host")
	}
	if o.CAValidity == 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.CertValidity == 0 {
		o.CertValidity = DefaultCertValidity
	}
	if o.CertValidity > o.CAValidity {
		return nil, fmt.Errorf("a serving certificate valid for %v outlives its CA (%v)", o.CertValidity, o.CAValidity)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &SelfCert{o: o}, nil
}

// Current is the pair the last successful Sync loaded: CertReloader's source (NewCertSource).
func (s *SelfCert) Current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pair == nil {
		return nil, errors.New("the guard has no certificate yet: no Sync has succeeded")
	}
	return s.pair, nil
}

// keyMaterial is the Secret's content, parsed.
type keyMaterial struct {
	cas    []*x509.Certificate // ca.crt, the current CA first
	caKey  *ecdsa.PrivateKey
	leaf   *x509.Certificate
	tlsCrt []byte
	tlsKey []byte
}

// Sync brings the Secret and the webhook's caBundle to a CA and a serving certificate that are
// valid, not due for renewal, and for Hosts; then serves the Secret's pair. An error leaves the
// pair in use as it was.
func (s *SelfCert) Sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	now := s.o.Clock.Now()
	secret, err := s.o.Secrets.Get(ctx, s.o.SecretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the guard's Secret %s: %w", s.o.SecretName, err)
	}
	hook, err := s.o.Webhooks.CABundles(ctx, s.o.WebhookName)
	if err != nil {
		return fmt.Errorf("reading the ValidatingWebhookConfiguration %s: %w", s.o.WebhookName, err)
	}
	km := parseKeyMaterial(secret.Data)
	changed := false

	// 1. The CA: kept while more than a third of its life is left. A new one goes first in
	// ca.crt, and the old ones stay there until they expire: the serving certificates they
	// signed (this replica's, the others') keep verifying meanwhile.
	if len(km.cas) == 0 || km.caKey == nil || !sameKey(km.cas[0], km.caKey) || dueForRenewal(km.cas[0], now) {
		ca, key, err := newCA(now, s.o.CAValidity)
		if err != nil {
			return err
		}
		kept := []*x509.Certificate{ca}
		for _, old := range km.cas {
			if now.Before(old.NotAfter) {
				kept = append(kept, old)
			}
		}
		km.cas, km.caKey = kept, key
		changed = true
		logger.Info("Made a new CA for the eviction guard", "secret", s.o.SecretName, "notAfter", ca.NotAfter)
	}
	bundle := encodeCerts(km.cas)
	// The CA is in force for the API server once the webhook's caBundle, as read at the start
	// of this Sync, holds it.
	published := webhookHas(hook, km.cas[0])

	// 2. The serving certificate: reissued when it does not load, is due, names other hosts,
	// or is signed by a CA that is no longer current, the last only once the current CA is
	// published (see SelfCert).
	reissue := km.leaf == nil || dueForRenewal(km.leaf, now) || !namesHosts(km.leaf, s.o.Hosts) || !verifies(km.leaf, km.cas, now)
	if !reissue && published && km.leaf.CheckSignatureFrom(km.cas[0]) != nil {
		reissue = true
	}
	if reissue && !published && km.leaf != nil && verifies(km.leaf, km.cas, now) && now.Before(km.leaf.NotAfter) &&
		namesHosts(km.leaf, s.o.Hosts) {
		// Due, but the new CA is not published yet: keep the old certificate until it is.
		reissue = false
	}
	if reissue {
		crt, key, leaf, err := newLeaf(now, s.o.CertValidity, s.o.Hosts, km.cas[0], km.caKey)
		if err != nil {
			return err
		}
		km.tlsCrt, km.tlsKey, km.leaf = crt, key, leaf
		changed = true
		logger.Info("Issued the eviction guard's serving certificate", "secret", s.o.SecretName, "hosts", s.o.Hosts, "notAfter", leaf.NotAfter)
	}

	if changed {
		caKeyDER, err := x509.MarshalECPrivateKey(km.caKey)
		if err != nil {
			return fmt.Errorf("encoding the guard's CA key: %w", err)
		}
		secret = secret.DeepCopy()
		secret.Data = map[string][]byte{
			SecretCACert:  bundle,
			SecretCAKey:   pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: caKeyDER}),
			SecretTLSCert: km.tlsCrt,
			SecretTLSKey:  km.tlsKey,
		}
		// Update with the resourceVersion read: another replica's write in between is a
		// Conflict, and the next Sync serves the winner's.
		if secret, err = s.o.Secrets.Update(ctx, secret, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("writing the guard's Secret %s: %w", s.o.SecretName, err)
		}
	}

	// 3. The caBundle: every webhook of the configuration carries ca.crt. Written after the
	// Secret, so that a caBundle never names a CA the Secret lost to a Conflict.
	if !webhookCarries(hook, bundle) {
		if hook, err = s.o.Webhooks.SetCABundles(ctx, s.o.WebhookName, hook, bundle); err != nil {
			return fmt.Errorf("writing the caBundle of the ValidatingWebhookConfiguration %s: %w", s.o.WebhookName, err)
		}
		logger.Info("Published the eviction guard's CA in its webhook configuration", "webhookConfiguration", s.o.WebhookName)
	}

	// 4. Serve the Secret's pair.
	pair, err := tls.X509KeyPair(secret.Data[SecretTLSCert], secret.Data[SecretTLSKey])
	if err != nil {
		return fmt.Errorf("loading the pair in the guard's Secret %s: %w", s.o.SecretName, err)
	}
	s.mu.Lock()
	s.pair = &pair
	s.mu.Unlock()
	if m := s.o.Metrics; m != nil {
		m.NotAfter.Set(float64(km.leaf.NotAfter.Unix()))
		v := 0.0
		if webhookHasAll(hook, km.leaf, km.cas, now) {
			v = 1
		}
		m.Published.Set(v)
	}
	return nil
}

// Run syncs every interval until ctx ends, and sooner (every interval/10, at least a second)
// after a Sync that failed. Each failure is logged; the pair in use stays.
func (s *SelfCert) Run(ctx context.Context, interval time.Duration, clk clock.WithTicker) {
	logger := klog.FromContext(ctx)
	retry := max(interval/10, time.Second)
	wait := interval
	for {
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		wait = interval
		if err := s.Sync(ctx); err != nil {
			logger.Error(err, "Keeping the eviction guard's certificate failed; retrying", "in", retry)
			if s.o.Metrics != nil {
				s.o.Metrics.SyncErrors.Inc()
			}
			wait = retry
		}
	}
}

// fieldManager names the guard's writes in managedFields, so that a server-side apply of the
// chart (Argo CD, Flux) leaves the caBundle and the Secret's data, which it does not set, alone.
const fieldManager = "reprieve-eviction-guard"

// CertMetrics are the guard's certificate series.
type CertMetrics struct {
	// NotAfter is when the serving certificate expires.
	NotAfter prometheus.Gauge
	// Published is 1 when every webhook of the configuration carries a caBundle that verifies
	// the certificate served; 0 means the API server cannot call the guard.
	Published  prometheus.Gauge
	SyncErrors prometheus.Counter
}

// NewCertMetrics registers the certificate series.
func NewCertMetrics(reg prometheus.Registerer) (*CertMetrics, error) {
	m := &CertMetrics{
		NotAfter: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "reprieve", Subsystem: "guard", Name: "certificate_expiry_timestamp_seconds",
			Help: "When the serving certificate this replica serves expires, as a Unix timestamp."}),
		Published: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "reprieve", Subsystem: "guard", Name: "ca_bundle_published",
			Help: "1 when every webhook of the guard's ValidatingWebhookConfiguration carries a caBundle that verifies the certificate this replica serves; 0: the API server cannot call it."}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "reprieve", Subsystem: "guard", Name: "certificate_sync_errors_total",
			Help: "Syncs of the guard's own certificate (its Secret and its webhook's caBundle) that failed."}),
	}
	for _, c := range []prometheus.Collector{m.NotAfter, m.Published, m.SyncErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the guard's certificate metrics: %w", err)
		}
	}
	return m, nil
}

func parseKeyMaterial(data map[string][]byte) keyMaterial {
	var km keyMaterial
	rest := data[SecretCACert]
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && c.IsCA {
			km.cas = append(km.cas, c)
		}
	}
	if b, _ := pem.Decode(data[SecretCAKey]); b != nil {
		km.caKey, _ = x509.ParseECPrivateKey(b.Bytes)
	}
	if _, err := tls.X509KeyPair(data[SecretTLSCert], data[SecretTLSKey]); err == nil {
		if b, _ := pem.Decode(data[SecretTLSCert]); b != nil {
			km.leaf, _ = x509.ParseCertificate(b.Bytes)
			km.tlsCrt, km.tlsKey = data[SecretTLSCert], data[SecretTLSKey]
		}
	}
	return km
}

// dueForRenewal: less than a third of c's life left, or not yet valid (a clock that went back).
func dueForRenewal(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return now.Before(c.NotBefore) || c.NotAfter.Sub(now) < life/3
}

func sameKey(c *x509.Certificate, key *ecdsa.PrivateKey) bool {
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	return ok && pub.Equal(&key.PublicKey)
}

func namesHosts(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func verifies(leaf *x509.Certificate, cas []*x509.Certificate, now time.Time) bool {
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err == nil
}

func webhookHas(hook Webhooks, ca *x509.Certificate) bool {
	if len(hook.CABundles) == 0 {
		return false
	}
	for _, b := range hook.CABundles {
		if !slices.ContainsFunc(parseKeyMaterial(map[string][]byte{SecretCACert: b}).cas, ca.Equal) {
			return false
		}
	}
	return true
}

func webhookHasAll(hook Webhooks, leaf *x509.Certificate, cas []*x509.Certificate, now time.Time) bool {
	if len(hook.CABundles) == 0 {
		return false
	}
	for _, b := range hook.CABundles {
		if !verifies(leaf, parseKeyMaterial(map[string][]byte{SecretCACert: b}).cas, now) {
			return false
		}
	}
	return true
}

func webhookCarries(hook Webhooks, bundle []byte) bool {
	for _, b := range hook.CABundles {
		if !bytes.Equal(b, bundle) {
			return false
		}
	}
	return true
}

func encodeCerts(cs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range cs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("drawing a certificate serial number: %w", err)
	}
	return n, nil
}

// newCA makes a self-signed ECDSA P-256 CA. NotBefore is an hour back, for API servers whose
// clock is behind this one's.
func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the guard's CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: fmt.Sprintf("reprieve-eviction-guard-ca@%d", now.Unix())},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the guard's CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the guard's CA: %w", err)
	}
	return ca, key, nil
}

// newLeaf issues a serving certificate for hosts (DNS names, or IP addresses) signed by ca.
func newLeaf(now time.Time, validity time.Duration, hosts []string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (crtPEM, keyPEM []byte, leaf *x509.Certificate, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating the guard's serving key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("signing the guard's serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encoding the guard's serving key: %w", err)
	}
	leaf, err = x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parsing the guard's serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), leaf, nil
}
