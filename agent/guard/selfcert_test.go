package guard

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	testNS, testSecret, testHook = "kube-system", "reprieve-eviction-guard", "reprieve-eviction-guard"
	testHost                     = "reprieve-eviction-guard.kube-system.svc"
)

// selfCertCluster is the chart's render as applied: an empty Secret and a webhook configuration
// with two webhooks and no caBundle. The fake clientset stores what it is given (client-go's
// testing.ObjectTracker); the real API server's behaviour (a Conflict on a stale
// resourceVersion) is the e2e test's (test/e2e/lifecycle_guard_test.go).
func selfCertCluster() *fake.Clientset {
	return fake.NewClientset(
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: testSecret, Namespace: testNS}, Type: v1.SecretTypeOpaque},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: testHook},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "a.reprieve.io"}, {Name: "b.reprieve.io"}}})
}

// fakeWebhooks is the WebhookClient of the binary (JSON in, a JSON patch out: ParseWebhooks,
// CABundlePatch) over the fake clientset, whose tracker applies JSON patches as the API server
// does (k8s.io/client-go/testing's ObjectTracker, with evanphx/json-patch).
type fakeWebhooks struct{ c *fake.Clientset }

func (f fakeWebhooks) CABundles(ctx context.Context, name string) (Webhooks, error) {
	h, err := f.c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Webhooks{}, err
	}
	raw, err := json.Marshal(h)
	if err != nil {
		return Webhooks{}, err
	}
	return ParseWebhooks(raw)
}

func (f fakeWebhooks) SetCABundles(ctx context.Context, name string, read Webhooks, bundle []byte) (Webhooks, error) {
	patch, err := CABundlePatch(read, bundle)
	if err != nil {
		return Webhooks{}, err
	}
	h, err := f.c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return Webhooks{}, err
	}
	raw, err := json.Marshal(h)
	if err != nil {
		return Webhooks{}, err
	}
	return ParseWebhooks(raw)
}

func newTestSelfCert(t *testing.T, c *fake.Clientset, clk *clocktesting.FakeClock, hosts []string, caValidity, certValidity time.Duration, reg prometheus.Registerer) *SelfCert {
	t.Helper()
	var m *CertMetrics
	if reg != nil {
		var err error
		if m, err = NewCertMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewSelfCert(SelfCertOptions{Secrets: c.CoreV1().Secrets(testNS), SecretName: testSecret,
		Webhooks: fakeWebhooks{c}, WebhookName: testHook,
		Hosts: hosts, CAValidity: caValidity, CertValidity: certValidity, Clock: clk, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// state is the Secret and the webhook configuration as stored.
func state(t *testing.T, c *fake.Clientset) (*v1.Secret, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()
	s, err := c.CoreV1().Secrets(testNS).Get(context.Background(), testSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), testHook, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, h
}

// served is the leaf s serves now.
func served(t *testing.T, s *SelfCert) *x509.Certificate {
	t.Helper()
	pair, err := s.Current()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// checkVerifies checks that leaf verifies for host against every webhook's caBundle at now, as
// the API server verifies a webhook's serving certificate.
func checkVerifies(t *testing.T, h *admissionregistrationv1.ValidatingWebhookConfiguration, leaf *x509.Certificate, host string, now time.Time) {
	t.Helper()
	for _, w := range h.Webhooks {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(w.ClientConfig.CABundle) {
			t.Fatalf("webhook %s has no caBundle", w.Name)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("webhook %s: the served certificate does not verify against its caBundle: %v", w.Name, err)
		}
	}
}

func writes(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "update" || a.GetVerb() == "create" || a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func TestSelfCertFirstSyncFillsTheSecretAndTheCABundle(t *testing.T) {
	c := selfCertCluster()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	s := newTestSelfCert(t, c, clk, []string{testHost, "127.0.0.1"}, 0, 0, reg)
	if _, err := s.Current(); err == nil {
		t.Error("Current before any Sync returned a pair; want an error")
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	secret, hook := state(t, c)
	for _, k := range []string{SecretCACert, SecretCAKey, SecretTLSCert, SecretTLSKey} {
		if len(secret.Data[k]) == 0 {
			t.Errorf("the Secret lacks %s", k)
		}
	}
	for _, w := range hook.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, secret.Data[SecretCACert]) {
			t.Errorf("webhook %s: caBundle is not the Secret's ca.crt", w.Name)
		}
	}
	leaf := served(t, s)
	checkVerifies(t, hook, leaf, testHost, clk.Now())
	if leaf.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("the serving certificate does not name 127.0.0.1: %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	if got := leaf.NotAfter.Sub(clk.Now()); got != DefaultCertValidity {
		t.Errorf("the serving certificate is valid for %v; want %v", got, DefaultCertValidity)
	}
	if v := testutil.ToFloat64(s.o.Metrics.Published); v != 1 {
		t.Errorf("reprieve_guard_ca_bundle_published %v; want 1", v)
	}
	if v := testutil.ToFloat64(s.o.Metrics.NotAfter); v != float64(leaf.NotAfter.Unix()) {
		t.Errorf("reprieve_guard_certificate_expiry_timestamp_seconds %v; want %d", v, leaf.NotAfter.Unix())
	}

	// A second replica, and this one again: nothing to write, the same pair served.
	before := writes(c)
	other := newTestSelfCert(t, c, clk, []string{testHost, "127.0.0.1"}, 0, 0, nil)
	for _, r := range []*SelfCert{s, other} {
		if err := r.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := writes(c) - before; n != 0 {
		t.Errorf("syncs with nothing to change wrote %d times; want none", n)
	}
	if !served(t, other).Equal(leaf) {
		t.Error("the second replica serves another certificate; want the Secret's")
	}
}

// A re-apply of the chart that empties the caBundle (kubectl replace, an apply that owned it):
// the next Sync publishes it again, with the same CA and pair.
func TestSelfCertRepublishesAWipedCABundle(t *testing.T) {
	c := selfCertCluster()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	s := newTestSelfCert(t, c, clk, []string{testHost}, 0, 0, prometheus.NewRegistry())
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	secret, hook := state(t, c)
	leaf := served(t, s)
	hook.Webhooks[1].ClientConfig.CABundle = nil
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), hook, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	again, hook := state(t, c)
	if !bytes.Equal(again.Data[SecretCACert], secret.Data[SecretCACert]) || !served(t, s).Equal(leaf) {
		t.Error("republishing the caBundle changed the CA or the pair; want them kept")
	}
	checkVerifies(t, hook, leaf, testHost, clk.Now())
}

// The serving certificate is reissued, by the same CA, once less than a third of its life is
// left; the caBundle does not change.
func TestSelfCertRenewsTheServingCertificate(t *testing.T) {
	c := selfCertCluster()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	s := newTestSelfCert(t, c, clk, []string{testHost}, 0, 0, nil)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := served(t, s)
	_, hook := state(t, c)
	bundle := hook.Webhooks[0].ClientConfig.CABundle
	// Life is the validity plus the hour back: due at a third of it before NotAfter.
	life := first.NotAfter.Sub(first.NotBefore)
	clk.SetTime(first.NotAfter.Add(-life/3 - time.Minute))
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !served(t, s).Equal(first) {
		t.Error("renewed a minute before it was due")
	}
	clk.Step(2 * time.Minute)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	renewed := served(t, s)
	_, hook = state(t, c)
	if renewed.Equal(first) || !bytes.Equal(hook.Webhooks[0].ClientConfig.CABundle, bundle) {
		t.Errorf("at a third of its life left: renewed %v, caBundle changed %v; want renewed with the caBundle kept",
			!renewed.Equal(first), !bytes.Equal(hook.Webhooks[0].ClientConfig.CABundle, bundle))
	}
	checkVerifies(t, hook, renewed, testHost, clk.Now())
	checkVerifies(t, hook, first, testHost, clk.Now())
}

// A new CA is published beside the old one first; the serving certificate moves to it only at
// the Sync after the webhook carries it, so that the certificate served always verifies against
// the caBundle the API server has.
func TestSelfCertRotatesTheCAPublishedFirst(t *testing.T) {
	c := selfCertCluster()
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	// CA: [t0-1h, t0+9h], due after t0+5h40m. Serving: [t0-1h, t0+6h], due after t0+3h40m.
	s := newTestSelfCert(t, c, clk, []string{testHost}, 9*time.Hour, 6*time.Hour, nil)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := served(t, s)
	secret, _ := state(t, c)
	oldCA := parseKeyMaterial(secret.Data).cas[0]

	clk.SetTime(t0.Add(5*time.Hour + 45*time.Minute))
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	secret, hook := state(t, c)
	cas := parseKeyMaterial(secret.Data).cas
	if len(cas) != 2 || !cas[1].Equal(oldCA) || cas[0].Equal(oldCA) {
		t.Fatalf("after the CA was due: ca.crt holds %d CAs; want the new one first and the old one", len(cas))
	}
	if !served(t, s).Equal(first) {
		t.Error("the serving certificate moved to the new CA before the webhook carried it")
	}
	checkVerifies(t, hook, first, testHost, clk.Now())

	clk.Step(time.Minute)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	moved := served(t, s)
	if moved.Equal(first) || moved.CheckSignatureFrom(cas[0]) != nil {
		t.Error("the Sync after the new CA was published did not move the serving certificate to it")
	}
	_, hook = state(t, c)
	checkVerifies(t, hook, moved, testHost, clk.Now())
}

func TestSelfCertReissuesForOtherHostsAndDamagedData(t *testing.T) {
	c := selfCertCluster()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	if err := newTestSelfCert(t, c, clk, []string{testHost}, 0, 0, nil).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	moved := newTestSelfCert(t, c, clk, []string{"other.kube-system.svc"}, 0, 0, nil)
	if err := moved.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if served(t, moved).VerifyHostname("other.kube-system.svc") != nil {
		t.Error("a replica with other hosts serves a certificate that does not name them")
	}

	secret, _ := state(t, c)
	secret.Data[SecretTLSKey] = []byte("not a key")
	secret.Data[SecretCAKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("junk")})
	if _, err := c.CoreV1().Secrets(testNS).Update(context.Background(), secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := moved.Sync(context.Background()); err != nil {
		t.Fatalf("a damaged Secret: %v; want it made anew", err)
	}
	_, hook := state(t, c)
	checkVerifies(t, hook, served(t, moved), "other.kube-system.svc", clk.Now())
}

func TestSelfCertErrorsNameWhatIsMissing(t *testing.T) {
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Now())
	err := newTestSelfCert(t, c, clk, []string{testHost}, 0, 0, nil).Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "reading the guard's Secret "+testSecret) {
		t.Errorf("no Secret: %v; want an error naming it", err)
	}
	if _, err := NewSelfCert(SelfCertOptions{}); err == nil {
		t.Error("NewSelfCert with no options: want an error")
	}
	if _, err := NewSelfCert(SelfCertOptions{Secrets: c.CoreV1().Secrets(testNS), SecretName: "s", Webhooks: fakeWebhooks{c},
		WebhookName: "w", Hosts: []string{"h"}, CAValidity: time.Hour, CertValidity: 2 * time.Hour}); err == nil {
		t.Error("a serving certificate outliving its CA: want an error")
	}
}

// The patch refuses to write into a configuration whose webhooks moved since they were read.
func TestCABundlePatchTestsWhatWasRead(t *testing.T) {
	c := selfCertCluster()
	read, err := fakeWebhooks{c}.CABundles(context.Background(), testHook)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), testHook, metav1.GetOptions{})
	h.Webhooks[0], h.Webhooks[1] = h.Webhooks[1], h.Webhooks[0]
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), h, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := (fakeWebhooks{c}).SetCABundles(context.Background(), testHook, read, []byte("x")); err == nil {
		t.Error("patching webhooks that were reordered since read: want an error")
	}
	patch, err := CABundlePatch(Webhooks{ResourceVersion: "7", Names: []string{"a"}}, []byte("ca"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"op":"test","path":"/metadata/resourceVersion","value":"7"},{"op":"test","path":"/webhooks/0/name","value":"a"},{"op":"add","path":"/webhooks/0/clientConfig/caBundle","value":"Y2E="}]`; string(patch) != want {
		t.Errorf("patch %s; want %s", patch, want)
	}
}
