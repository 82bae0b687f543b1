package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The tests of this file try the eviction guard as an attacker who reaches its port would: a
// flood of forged reviews from another address than the API server's, forged reviews that ask
// about pods, and reviews without the API server's client certificate. Then the chart's pieces
// that watch the guard and give it a certificate of the user's.

// guardDeniedText is the part of guard.DeniedMessage that does not depend on the review.
const guardDeniedText = "eviction guard refused this eviction"

// guardLogText is the log of the guard startEvictionGuard started for ns/sa.
func guardLogText(t *testing.T, sa, ns string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(logDir, "eviction-guard-"+sa+"-"+ns+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// guardHost is host:port of the guard startEvictionGuard registered for ns/sa, from its webhook.
func guardHost(ctx context.Context, t *testing.T, sa, ns string) string {
	t.Helper()
	hook, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, sa+"-"+ns+"-eviction-guard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(*hook.Webhooks[0].ClientConfig.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// forgedReview is an AdmissionReview as the API server would send for an eviction of ns/name by
// the agent ns/sa with node as its token's node claim: what anyone who reaches the port can post.
func forgedReview(t testing.TB, reviewUID, sa, ns, node, name string, uid types.UID) []byte {
	t.Helper()
	grace := int64(1)
	ev, err := json.Marshal(policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: ns},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:      types.UID(reviewUID),
			Kind:     metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, SubResource: "eviction",
			Name: name, Namespace: ns, Operation: admissionv1.Create,
			UserInfo: authnv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + sa,
				Extra: map[string]authnv1.ExtraValue{guard.NodeClaim: {node}}},
			Object: runtime.RawExtension{Raw: ev},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// attacker is an HTTPS client whose connections come from the loopback address src: a caller
// that is not the API server (127.0.0.1 in the test environment). It checks no certificate.
func attacker(src string, conns int, certs ...tls.Certificate) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}, MaxIdleConns: conns, MaxIdleConnsPerHost: conns}}
}

func post(c *http.Client, host string, body []byte) (int, string, error) {
	resp, err := c.Post("https://"+host+guard.PathValidate, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// guardCounter reads reprieve_guard_reviews_total{result} from the guard's /metrics.
func guardCounter(t *testing.T, host, result string) float64 {
	t.Helper()
	return guardMetric(t, host, `reprieve_guard_reviews_total{result="`+result+`"}`)
}

// metricsClient reads the guards' /metrics over kept-alive connections: a test that polls a
// series would otherwise open a connection a poll from 127.0.0.1, the API server's own source,
// and fill its connections to the guard (idle ones close only after 30 s).
var metricsClient = attacker("127.0.0.1", 4)

// guardMetric reads one series (name{labels} as exposed) from the guard's /metrics.
func guardMetric(t *testing.T, host, series string) float64 {
	t.Helper()
	resp, err := metricsClient.Get("https://" + host + guard.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("the guard's /metrics lacks %s:\n%s", series, b)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// floodCounts are a flood's answers by kind.
type floodCounts struct {
	sent, answered, refused, failed atomic.Int64
	// busy counts a paced flood's ticks that found every worker waiting on the guard
	// (startPacedFlood): the guard, not the machine, held the flood below its pace.
	busy atomic.Int64
}

// startFlood posts forged reviews from src with workers concurrent connections, as fast as they
// are answered, each of another pod name so that each would cost the guard a pod read, until
// stop is called.
func startFlood(t *testing.T, host, src, sa, ns, node string, workers int) (counts *floodCounts, stop func()) {
	t.Helper()
	bodies := make([][]byte, 1000)
	for i := range bodies {
		bodies[i] = forgedReview(t, fmt.Sprintf("forged-%d", i), sa, ns, node, fmt.Sprintf("forged-%d", i), "uid-forged")
	}
	counts = &floodCounts{}
	c := attacker(src, workers)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; ; i += workers {
				select {
				case <-done:
					return
				default:
				}
				counts.sent.Add(1)
				code, _, err := post(c, host, bodies[i%len(bodies)])
				switch {
				case err != nil:
					counts.failed.Add(1) // a connection past the cap, closed at once
				case code == http.StatusOK:
					counts.answered.Add(1)
				default:
					counts.refused.Add(1)
				}
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			c.CloseIdleConnections()
		})
	}
	t.Cleanup(stop)
	return counts, stop
}

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// TestEvictionGuardUnderFlood floods the eviction guard, wired as the chart wires it to the real
// API server, with forged reviews from 127.0.0.2 (the API server calls it from 127.0.0.1), as
// fast as the test can post them, while node A's agent (a token bound to its pod on A) evicts a
// pod on A as the agent does, again and again (dry runs, then for real). Every one must be answered
// within 1 s and allowed; the flood's reviews are refused past their own source's budget (429,
// counted rejected, not error), so that it cannot take the API server's. Before the flood,
// forged reviews that ask about a pod on another node, a pod that does not exist and a pod with
// another UID get the same answer: the reasons are in the guard's log only.
func TestEvictionGuardUnderFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "evflood", "reprieve-evflood", "evflood-a", "evflood-b"
	c := env.Client
	kubeA := boundAgentsInstant(ctx, t, ns, sa, nodeA, nodeB)
	// The agent's client, without client-side rate limiting: the times are the API server's.
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeA)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Timeout = -1, 10*time.Second
	clientA, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startEvictionGuard(ctx, t, sa, ns)
	host := guardHost(ctx, t, sa, ns)
	get := func(name string) *v1.Pod {
		t.Helper()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	onA, onB := get("victim-"+nodeA), get("victim-"+nodeB)

	// The oracle: from a source of its own, so that the flood's budget is not this one's.
	probe := attacker("127.0.0.3", 1)
	answers := map[string]string{}
	for what, req := range map[string][]byte{
		"a pod on another node":                      forgedReview(t, "oracle", sa, ns, nodeA, onB.Name, onB.UID),
		"a pod that does not exist":                  forgedReview(t, "oracle", sa, ns, nodeA, "no-such-pod", "uid-guess"),
		"a pod on the claimed node with another UID": forgedReview(t, "oracle", sa, ns, nodeA, onA.Name, "uid-guess"),
		"a pod on another node than the claimed one": forgedReview(t, "oracle", sa, ns, nodeB, onA.Name, onA.UID),
	} {
		code, body, err := post(probe, host, req)
		if err != nil || code != http.StatusOK {
			t.Fatalf("a forged review of %s: %d %v", what, code, err)
		}
		answers[what] = body
	}
	var first string
	for what, body := range answers {
		if first == "" {
			first = body
		}
		if body != first || !strings.Contains(body, guardDeniedText) {
			t.Errorf("a forged review of %s got\n%s\nwant the one refusal every other got:\n%s", what, body, first)
		}
		for _, leak := range []string{nodeA, nodeB, string(onA.UID), string(onB.UID), "not found", onA.Name, onB.Name} {
			if strings.Contains(body, leak) {
				t.Errorf("the answer to a forged review of %s names %q: %s", what, leak, body)
			}
		}
	}
	log := guardLogText(t, sa, ns)
	for _, want := range []string{"pod " + ns + "/" + onB.Name + " is on " + nodeB, "pod " + ns + "/no-such-pod not found",
		"uid-guess is not pod " + ns + "/" + onA.Name + "'s UID", "bound to (" + nodeB + "); pod " + ns + "/" + onA.Name + " is on " + nodeA} {
		if !strings.Contains(log, want) {
			t.Errorf("the guard's log lacks the reason %q", want)
		}
	}

	// The flood, from 127.0.0.2: more workers than the connections one source may hold.
	const workers = 80
	flood, stopFlood := startFlood(t, host, "127.0.0.2", sa, ns, nodeA, workers)
	// In full swing once every worker has had answers: each then has a connection or is refused one.
	waitFor(ctx, t, "the flood in full swing", func() bool { return flood.sent.Load() >= 3*workers })
	floodStart, sentAtStart := time.Now(), flood.sent.Load()
	errorsBefore := guardCounter(t, host, guard.ResultError)

	// The agent's evictions meanwhile, as the agent sends them (grace, UID precondition), dry
	// runs so that the same pod serves again: each is reviewed by the guard as a real one.
	// Paced as the API server carries a node's evictions, 25 a second (a pod each 40 ms): the
	// guard keeps the shared budget's reserve for a source below its fair share (half of 100
	// reads a second here, with the flood the other source), not for one that reads back to
	// back. Unpaced, this loop itself outran the fair share whenever the machine answered in
	// under 20 ms, and its own reads were refused (a flake, not the flood's doing). For 3 s
	// (about 75 at that pace) and at least 50.
	var took []time.Duration
	pace := time.NewTicker(40 * time.Millisecond)
	defer pace.Stop()
	for time.Since(floodStart) < 3*time.Second || len(took) < 50 {
		<-pace.C
		start := time.Now()
		err := evict(ctx, clientA, ns, onA.Name, ptr64(1), &onA.UID, true)
		took = append(took, time.Since(start))
		if err != nil {
			t.Fatalf("eviction %d of node A's agent during the flood: %v (after %v); want it allowed", len(took), err, took[len(took)-1])
		}
		if took[len(took)-1] >= time.Second {
			break // failed already (below): no need to wait out fifty slow ones
		}
	}
	// One the guard must refuse, and the pod on A evicted for real, still during the flood.
	start := time.Now()
	if err := evict(ctx, clientA, ns, onB.Name, ptr64(1), &onB.UID, false); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("node A's agent evicting a pod on node B during the flood: %v; want the guard's 403", err)
	}
	refusedIn := time.Since(start)
	start = time.Now()
	if err := evict(ctx, clientA, ns, onA.Name, ptr64(1), &onA.UID, false); err != nil {
		t.Errorf("the real eviction during the flood: %v", err)
	}
	took = append(took, time.Since(start))
	floodFor := time.Since(floodStart)
	sent := flood.sent.Load() - sentAtStart
	rss := guardMetric(t, host, "process_resident_memory_bytes")
	stopFlood()

	slices.Sort(took)
	p50, p99, worst := quantile(took, 0.5), quantile(took, 0.99), took[len(took)-1]
	t.Logf("guard flood: %d forged reviews in %.1f s from 127.0.0.2 (%.0f/s; %d answered, %d refused with 429, %d connections closed at once); "+
		"%d evictions of node A's agent meanwhile: p50 %v, p99 %v, max %v; the refused one in %v; the guard's RSS %.0f MiB",
		sent, floodFor.Seconds(), float64(sent)/floodFor.Seconds(), flood.answered.Load(), flood.refused.Load(), flood.failed.Load(),
		len(took), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), worst.Round(100*time.Microsecond), refusedIn.Round(100*time.Microsecond), rss/(1<<20))
	if worst >= time.Second || refusedIn >= time.Second {
		t.Errorf("an eviction during the flood took %v (the refused one %v); want every one answered within 1 s", worst, refusedIn)
	}
	if float64(sent)/floodFor.Seconds() < 500 {
		t.Errorf("the flood posted %.0f reviews a second; want at least 500 for the test to mean something", float64(sent)/floodFor.Seconds())
	}
	// The flood's answered reviews each cost a pod read: no more than its source's budget.
	limits := guard.DefaultLimits()
	if budget := float64(limits.PodReadBurst) + float64(limits.PodReadsPerSecond)*(time.Since(floodStart).Seconds()+5); float64(flood.answered.Load()) > budget {
		t.Errorf("the guard answered %d forged reviews; want at most its source's pod-read budget, %.0f", flood.answered.Load(), budget)
	}
	if flood.refused.Load() == 0 {
		t.Error("no forged review was refused; want the source's limits reached")
	}
	if rejected := guardCounter(t, host, guard.ResultRejected); rejected < float64(flood.refused.Load()) {
		t.Errorf("reviews_total{result=rejected} = %v; want the %d refused forgeries counted there", rejected, flood.refused.Load())
	}
	if errs := guardCounter(t, host, guard.ResultError); errs != errorsBefore {
		t.Errorf("reviews_total{result=error} went from %v to %v during the flood; want forgeries kept out of it", errorsBefore, errs)
	}
	if log := guardLogText(t, sa, ns); !strings.Contains(log, "Rejected a request before reviewing it") || !strings.Contains(log, `source="127.0.0.2:`) {
		t.Error("the guard's log does not name the flooding source")
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, onA.Name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("the allowed eviction left %s running", onA.Name)
	}
	if p := get(onB.Name); p.DeletionTimestamp != nil {
		t.Errorf("the refused eviction deleted %s", onB.Name)
	}
}

// testPKI is a CA and the certificates it signs, for the API server's client certificate.
type testPKI struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestPKI(t *testing.T, cn string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client returns a client certificate named cn and its key, PEM.
func (p *testPKI) client(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// startAdmissionAPIServer starts a second kube-apiserver on the test environment's etcd (a
// high-availability peer of env's: the same objects), configured as the guard's documentation
// says for a self-managed cluster: --admission-control-config-file gives the
// ValidatingAdmissionWebhook plugin a kubeconfig whose user for hostPort presents the client
// certificate. It authenticates env's admin token. It returns the admin's config for it.
func startAdmissionAPIServer(ctx context.Context, t *testing.T, hostPort string, certPEM, keyPEM []byte) *rest.Config {
	t.Helper()
	bin, err := testenv.ToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := clientcmdapi.NewConfig()
	// The user entry names the webhook's host as the API server dials it: host:port for a URL
	// (a Service: <service>.<namespace>.svc, or with :port when it is not 443).
	kc.AuthInfos[hostPort] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kubeconfig := filepath.Join(dir, "webhook-kubeconfig.yaml")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	admission := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(admission, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: `+kubeconfig+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	servingPEM, servingCert, servingKey := selfSignedPair(t, t.TempDir())
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(env.Token+",testenv-admin,testenv-admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Its own service-account key: the test impersonates the agent through it, with no token.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		t.Fatal(err)
	}
	saFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p, err := testenv.StartProcess(ctx, "kube-apiserver-admission", filepath.Join(logDir, "kube-apiserver-admission.log"), filepath.Join(bin, "kube-apiserver"), []string{
		"--etcd-servers=" + env.EtcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port), "--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + servingCert, "--tls-private-key-file=" + servingKey,
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC,Node",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saFile, "--service-account-signing-key-file=" + saFile,
		"--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false", "--profiling=false",
		"--admission-control-config-file=" + admission,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	cfg := &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(port), BearerToken: env.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: servingPEM}, QPS: -1, Timeout: 10 * time.Second}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("kube-apiserver exited: %s", p.ExitDescription())
		}
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("waiting for the second kube-apiserver: %v\n%s", err, p.LogTail(40))
	}
	return cfg
}

// testEvictionGuardClientCertificate runs the guard with --client-ca-file and
// --client-allowed-names behind a real kube-apiserver configured to present a client
// certificate to it (an admission kubeconfig): that API server's reviews are judged (a pod on the
// token's node allowed, one on another node refused). A caller without the certificate is
// refused before it is judged: a forged review, a certificate of another CA, and the test
// environment's own API server, which has no admission kubeconfig (its evictions then fail
// closed, as on a cluster where the API server was not configured).
func testEvictionGuardClientCertificate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "evmtls", "reprieve-evmtls", "evmtls-a", "evmtls-b"
	c := env.Client
	setupNode(ctx, t, ns, nodeA, nil)
	if _, err := env.CreateNode(ctx, nodeB, nil); err != nil {
		t.Fatal(err)
	}
	agentIdentity(ctx, t, ns, sa)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	for _, node := range []string{nodeA, nodeB} {
		if err := scenario.Create(ctx, c, ns, node, taint, []scenario.Pod{{Name: "victim-" + node, Kind: scenario.Plain, Grace: ptr64(1)}}); err != nil {
			t.Fatal(err)
		}
	}

	// The guard's identity and CA files, then the guard with client authentication.
	objs := chartObjects(t, "eviction-guard", render(t, "reprieve", "--show-only", "templates/eviction-guard.yaml"))
	var hook *admissionregistrationv1.ValidatingWebhookConfiguration
	var role *rbacv1.ClusterRole
	for _, o := range objs {
		switch o := o.(type) {
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			hook = o
		case *rbacv1.ClusterRole:
			// The one that reads pods, not the one for the guard's own caBundle.
			if !isCABundleRole(o) {
				role = o
			}
		}
	}
	if hook == nil || role == nil {
		t.Fatal("the chart's guard render lacks its webhook or ClusterRole")
	}
	guardSA := sa + "-guard"
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: guardSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: sa + "-" + ns + "-eviction-guard"}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: guardSA, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	guardKube, err := env.ServiceAccountKubeconfig(ctx, ns, guardSA)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	servingPEM, certFile, keyFile := selfSignedPair(t, dir)
	apiCA, otherCA := newTestPKI(t, "apiserver-client-ca"), newTestPKI(t, "other-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(caFile, apiCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	host := "127.0.0.1:" + strconv.Itoa(port)
	p, err := testenv.StartProcess(ctx, "eviction-guard", filepath.Join(logDir, "eviction-guard-"+sa+"-"+ns+".log"), reprieveBin,
		[]string{"eviction-guard", "--bind-address=" + host, "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile,
			"--agent-service-account=" + ns + ":" + sa, "--kubeconfig=" + guardKube, "--client-ca-file=" + caFile,
			"--client-allowed-names=kube-apiserver", "-v=4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	waitFor(ctx, t, "the guard's /readyz without a client certificate", func() bool {
		resp, err := attacker("127.0.0.1", 1).Get("https://" + host + guard.PathReadyz)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// The API server that presents the certificate, then the chart's webhook pointing at the guard.
	apiCert, apiKey := apiCA.client(t, "kube-apiserver")
	admissionCfg := startAdmissionAPIServer(ctx, t, host, apiCert, apiKey)
	u := "https://" + host + guard.PathValidate
	wh := &hook.Webhooks[0]
	wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: servingPEM}
	wh.MatchConditions[0].Expression = strings.ReplaceAll(wh.MatchConditions[0].Expression, shippedAgentUser, "system:serviceaccount:"+ns+":"+sa)
	hook.ObjectMeta = metav1.ObjectMeta{Name: sa + "-" + ns + "-eviction-guard", Labels: hook.Labels}
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
	})
	asAgent := func(cfg *rest.Config, node string) kubernetes.Interface {
		imp := rest.CopyConfig(cfg)
		imp.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa, Extra: map[string][]string{guard.NodeClaim: {node}}}
		cl, err := kubernetes.NewForConfig(imp)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	viaCert := asAgent(admissionCfg, nodeA)
	waitFor(ctx, t, "the guard in force behind the second API server", func() bool {
		err := evict(ctx, viaCert, ns, "guard-probe", ptr64(1), ptrUID("probe"), true)
		return err != nil && strings.Contains(err.Error(), guardDeniedText)
	})
	pod := func(name string) *v1.Pod {
		t.Helper()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	onA, onB := pod("victim-"+nodeA), pod("victim-"+nodeB)
	if err := evict(ctx, viaCert, ns, onA.Name, ptr64(1), &onA.UID, true); err != nil {
		t.Errorf("evicting a pod on the token's node through the API server with the certificate: %v; want it allowed", err)
	}
	if err := evict(ctx, viaCert, ns, onB.Name, ptr64(1), &onB.UID, true); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("evicting a pod on another node through the API server with the certificate: %v; want the guard's 403", err)
	}
	// The test environment's API server has no admission kubeconfig: it presents no certificate,
	// the guard refuses the call, and failurePolicy Fail refuses the eviction (500).
	err = evict(ctx, asAgent(env.Config, nodeA), ns, onA.Name, ptr64(1), &onA.UID, true)
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("evicting through an API server without the client certificate: %v; want a 500 (failed calling webhook)", err)
	}
	// Forged reviews: without a certificate, and with one of another CA the handshake refuses.
	forged := forgedReview(t, "forged", sa, ns, nodeA, onA.Name, onA.UID)
	if code, body, err := post(attacker("127.0.0.2", 1), host, forged); err != nil || code != http.StatusForbidden || strings.Contains(body, "allowed") {
		t.Errorf("a forged review without a client certificate: %d %q %v; want 403", code, body, err)
	}
	otherCert, otherKey := otherCA.client(t, "kube-apiserver")
	pair, err := tls.X509KeyPair(otherCert, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	forcing := attacker("127.0.0.2", 1)
	forcing.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	if code, _, err := post(forcing, host, forged); err == nil {
		t.Errorf("a forged review with a certificate of another CA: %d; want the TLS handshake refused", code)
	}
	if got := guardCounter(t, host, guard.ResultAllowed); got < 1 {
		t.Errorf("reviews_total{result=allowed} = %v; want the certified API server's review", got)
	}
	if got := guardCounter(t, host, guard.ResultRejected); got < 2 {
		t.Errorf("reviews_total{result=rejected} = %v; want at least the uncertified API server's and the forgery", got)
	}
	if got := guardCounter(t, host, guard.ResultError); got != 0 {
		t.Errorf("reviews_total{result=error} = %v; want 0", got)
	}
	if log := p.LogTail(200); !strings.Contains(log, "no client certificate") {
		t.Errorf("the guard's log does not say why it refused the uncertified callers:\n%s", log)
	}
}

// renderGuardObjects renders the chart with args and returns the eviction guard's objects (those
// labelled app.kubernetes.io/component=eviction-guard).
func renderGuardObjects(t *testing.T, release string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range manifestObjects(t, "eviction-guard", render(t, release, args...)) {
		if o.GetLabels()["app.kubernetes.io/component"] == "eviction-guard" {
			out = append(out, o)
		}
	}
	return out
}

// byKind returns the objects of kind.
func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// field is the string at path in obj; a number in the path indexes a list.
func field(obj map[string]any, path ...string) string {
	var v any = obj
	for _, p := range path {
		switch c := v.(type) {
		case map[string]any:
			v = c[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i >= len(c) {
				return ""
			}
			v = c[i]
		default:
			return ""
		}
	}
	s, _ := v.(string)
	return s
}

// guardCAFile writes a CA certificate (PEM) for evictionGuard.tls.caBundle and returns its path
// and contents.
func guardCAFile(t *testing.T) (string, []byte) {
	t.Helper()
	ca := newTestPKI(t, "guard-ca")
	path := filepath.Join(t.TempDir(), "guard-ca.pem")
	if err := os.WriteFile(path, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, ca.pem
}

// testEvictionGuardChartPodMonitor checks the guard's PodMonitor: rendered with the agent's
// (podMonitor.enabled) and the guard, never else; it selects the guard's pods and not the
// agent's, scrapes the guard's port over HTTPS verified against the serving Secret's CA under the
// Service's name, and gives the job the guard's alerts select, as they select the Deployment's
// name; for a second release and another monitoring.job too.
func testEvictionGuardChartPodMonitor(t *testing.T) {
	if pm := byKind(renderGuardObjects(t, "reprieve"), "PodMonitor"); len(pm) != 0 {
		t.Errorf("the default render has a guard PodMonitor; want it only with podMonitor.enabled")
	}
	if objs := renderGuardObjects(t, "reprieve-gpu", "-f", "deploy/chart/examples/gpu-pool.yaml", "--set", "podMonitor.enabled=true"); len(objs) != 0 {
		t.Errorf("the per-pool example renders %d eviction-guard objects, a %s among them; want none (a second webhook failing closed)", len(objs), objs[0].GetKind())
	}
	if objs := renderGuardObjects(t, "reprieve", "--set", "podMonitor.enabled=true,evictionGuard.enabled=false"); len(objs) != 0 {
		t.Errorf("with evictionGuard.enabled=false the render still has %d eviction-guard objects, a %s among them", len(objs), objs[0].GetKind())
	}
	for _, c := range []struct {
		release string
		args    []string
		job     string
	}{
		{"reprieve", nil, "reprieve-eviction-guard"},
		// A second release with a guard of its own (the per-pool example has none: the first
		// release's guard reviews the ServiceAccount both share).
		{"reprieve-gpu", []string{"-f", "deploy/chart/examples/gpu-pool.yaml", "--set", "evictionGuard.enabled=true"}, "reprieve-gpu-eviction-guard"},
		{"reprieve", []string{"--set", "monitoring.job=spot-agents"}, "spot-agents-eviction-guard"},
	} {
		name := c.release + " " + strings.Join(c.args, " ")
		args := append([]string{"--set", "podMonitor.enabled=true,prometheusRule.enabled=true"}, c.args...)
		objs := renderGuardObjects(t, c.release, args...)
		pms, deploys, secrets, hooks := byKind(objs, "PodMonitor"), byKind(objs, "Deployment"), byKind(objs, "Secret"), byKind(objs, "ValidatingWebhookConfiguration")
		if len(pms) != 1 || len(deploys) != 1 || len(secrets) != 1 || len(hooks) != 1 {
			t.Fatalf("%s: %d PodMonitors, %d Deployments, %d Secrets, %d webhooks; want one of each", name, len(pms), len(deploys), len(secrets), len(hooks))
		}
		pm, deploy := pms[0].Object, deploys[0].Object
		podLabels, _, _ := unstructured.NestedStringMap(deploy, "spec", "template", "metadata", "labels")
		sel, _, _ := unstructured.NestedStringMap(pm, "spec", "selector", "matchLabels")
		ds, _ := renderDaemonSet(t, name, append([]string{"--show-only", "templates/daemonset.yaml"}, args...)...)
		selectsAgent := len(sel) > 0
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("%s: the PodMonitor selects %s=%s, which the guard's pods do not carry (%v)", name, k, v, podLabels)
			}
			selectsAgent = selectsAgent && ds.Spec.Template.Labels[k] == v
		}
		if len(sel) == 0 || selectsAgent {
			t.Errorf("%s: the guard's PodMonitor selector %v is empty or selects the agent's pods %v too", name, sel, ds.Spec.Template.Labels)
		}
		if field(pm, "spec", "podMetricsEndpoints", "0", "port") != "https" || field(deploy, "spec", "template", "spec", "containers", "0", "ports", "0", "name") != "https" ||
			field(pm, "spec", "podMetricsEndpoints", "0", "scheme") != "https" || field(pm, "spec", "podMetricsEndpoints", "0", "path") != guard.PathMetrics {
			t.Errorf("%s: endpoint %v; want %s over HTTPS on the guard container's port https", name, pm["spec"], guard.PathMetrics)
		}
		svc := field(hooks[0].Object, "webhooks", "0", "clientConfig", "service", "name")
		if got, want := field(pm, "spec", "podMetricsEndpoints", "0", "tlsConfig", "serverName"), svc+".kube-system.svc"; got != want {
			t.Errorf("%s: the scrape checks the name %q; want the Service's %q, as the API server does", name, got, want)
		}
		// The Secret the guard serves from: the one it keeps itself (--tls-secret, rendered empty:
		// the guard writes ca.crt there), else the one mounted.
		tlsSecret, selfKept := field(deploy, "spec", "template", "spec", "volumes", "0", "secret", "secretName"), false
		containers, _, _ := unstructured.NestedSlice(deploy, "spec", "template", "spec", "containers")
		guardArgs, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		for _, a := range guardArgs {
			if v, ok := strings.CutPrefix(a, "--tls-secret=kube-system/"); ok {
				tlsSecret, selfKept = v, true
			}
		}
		if field(pm, "spec", "podMetricsEndpoints", "0", "tlsConfig", "ca", "secret", "name") != tlsSecret ||
			field(pm, "spec", "podMetricsEndpoints", "0", "tlsConfig", "ca", "secret", "key") != "ca.crt" || tlsSecret != secrets[0].GetName() ||
			(field(secrets[0].Object, "data", "ca.crt") == "") != selfKept {
			t.Errorf("%s: the scrape's CA %v; want ca.crt of the Secret the guard serves from, %s", name, pm["spec"], tlsSecret)
		}
		if got := field(pm, "spec", "podMetricsEndpoints", "0", "relabelings", "0", "replacement"); got != c.job ||
			field(pm, "spec", "podMetricsEndpoints", "0", "relabelings", "0", "targetLabel") != "job" {
			t.Errorf("%s: the PodMonitor gives job %q; want %s", name, got, c.job)
		}
		rules := string(render(t, c.release, append(args, "--show-only", "templates/prometheusrule.yaml")...))
		for _, want := range []string{`up{job="` + c.job + `"}`, `reprieve_guard_reviews_total{job="` + c.job + `"`,
			`kube_deployment_status_replicas_available{deployment="` + deploys[0].GetName() + `"}`} {
			if !strings.Contains(rules, want) {
				t.Errorf("%s: the rules lack %s", name, want)
			}
		}
	}
	// A Secret of the user's: the scrape verifies with its ca.crt.
	caPath, _ := guardCAFile(t)
	objs := renderGuardObjects(t, "reprieve", "--set", "podMonitor.enabled=true,evictionGuard.tls.existingSecret=guard-tls", "--set-file", "evictionGuard.tls.caBundle="+caPath)
	if pm := byKind(objs, "PodMonitor"); len(pm) != 1 || field(pm[0].Object, "spec", "podMetricsEndpoints", "0", "tlsConfig", "ca", "secret", "name") != "guard-tls" {
		t.Errorf("with existingSecret the PodMonitor does not verify with guard-tls's ca.crt: %v", pm)
	}
}

// testEvictionGuardChartUserCertificate checks the two ways to bring the guard's certificate, for
// installs that render with helm template (Argo CD): an existing Secret with its CA, and
// cert-manager (a Certificate, and cainjector's annotation on the webhook). Either renders no
// Secret and no key, and the same bytes at every render, unlike the generated pair. The
// objects the API server knows are applied with a server-side dry run. Values that do not go
// together are refused with a message naming them; client authentication mounts its CA.
func testEvictionGuardChartUserCertificate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	caPath, caPEM := guardCAFile(t)
	d := newDryRunner(t)
	apply := func(name string, objs []*unstructured.Unstructured) {
		t.Helper()
		var b bytes.Buffer
		for _, o := range objs {
			if strings.HasSuffix(o.GroupVersionKind().Group, "cert-manager.io") || o.GroupVersionKind().Group == "monitoring.coreos.com" {
				continue // no CRDs here
			}
			j, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString("---\n")
			b.Write(j)
			b.WriteString("\n")
		}
		d.apply(ctx, t, name, b.Bytes())
	}
	stable := func(name string, args ...string) []*unstructured.Unstructured {
		t.Helper()
		first, second := render(t, "reprieve", args...), render(t, "reprieve", args...)
		if !bytes.Equal(first, second) {
			t.Errorf("%s: two renders differ; want the same objects at every sync", name)
		}
		if strings.Contains(string(first), "PRIVATE KEY") || strings.Contains(string(first), "tls.key: ") {
			t.Errorf("%s: the render carries a private key", name)
		}
		objs := renderGuardObjects(t, "reprieve", args...)
		if s := byKind(objs, "Secret"); len(s) != 0 {
			t.Errorf("%s: the render has the Secret %s; want none", name, s[0].GetName())
		}
		return objs
	}
	secretOf := func(objs []*unstructured.Unstructured) string {
		dep := byKind(objs, "Deployment")
		if len(dep) != 1 {
			t.Fatalf("%d guard Deployments", len(dep))
		}
		return field(dep[0].Object, "spec", "template", "spec", "volumes", "0", "secret", "secretName")
	}

	// An existing Secret: mounted as it is, its CA in the webhook.
	objs := stable("existingSecret", "--set", "evictionGuard.tls.existingSecret=guard-tls", "--set-file", "evictionGuard.tls.caBundle="+caPath)
	hooks := byKind(objs, "ValidatingWebhookConfiguration")
	if len(hooks) != 1 {
		t.Fatal("no webhook")
	}
	var hook admissionregistrationv1.ValidatingWebhookConfiguration
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(hooks[0].Object, &hook); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(hook.Webhooks[0].ClientConfig.CABundle, caPEM) || secretOf(objs) != "guard-tls" {
		t.Errorf("existingSecret: caBundle %q, Secret %q; want the given CA and guard-tls", hook.Webhooks[0].ClientConfig.CABundle, secretOf(objs))
	}
	apply("existingSecret", objs)

	// cert-manager with the release's own CA: a SelfSigned Issuer signs the CA Certificate, a CA
	// Issuer with its Secret signs the serving Certificate, into the Secret the guard mounts.
	objs = stable("certManager", "--set", "evictionGuard.tls.certManager.enabled=true")
	certs, issuers := byKind(objs, "Certificate"), byKind(objs, "Issuer")
	hooks = byKind(objs, "ValidatingWebhookConfiguration")
	if len(certs) != 2 || len(issuers) != 2 || len(hooks) != 1 {
		t.Fatalf("certManager: %d Certificates, %d Issuers, %d webhooks; want 2, 2, 1", len(certs), len(issuers), len(hooks))
	}
	var leaf, ca, selfSigned, caIssuer map[string]any
	for _, c := range certs {
		if isCA, _, _ := unstructured.NestedBool(c.Object, "spec", "isCA"); isCA {
			ca = c.Object
		} else {
			leaf = c.Object
		}
	}
	for _, i := range issuers {
		if _, ok := i.Object["spec"].(map[string]any)["selfSigned"]; ok {
			selfSigned = i.Object
		} else {
			caIssuer = i.Object
		}
	}
	if leaf == nil || ca == nil || selfSigned == nil || caIssuer == nil {
		t.Fatalf("certManager: want a serving and a CA Certificate, a SelfSigned and a CA Issuer: %v %v", certs, issuers)
	}
	svc := field(hooks[0].Object, "webhooks", "0", "clientConfig", "service", "name")
	dns, _, _ := unstructured.NestedStringSlice(leaf, "spec", "dnsNames")
	switch {
	case field(leaf, "spec", "secretName") != secretOf(objs):
		t.Errorf("certManager: the Certificate writes %q, the guard mounts %q", field(leaf, "spec", "secretName"), secretOf(objs))
	case !slices.Contains(dns, svc+".kube-system.svc"):
		t.Errorf("certManager: dnsNames %v lack the name the API server checks, %s.kube-system.svc", dns, svc)
	case field(leaf, "spec", "issuerRef", "name") != field(caIssuer, "metadata", "name") || field(caIssuer, "spec", "ca", "secretName") != field(ca, "spec", "secretName") ||
		field(ca, "spec", "issuerRef", "name") != field(selfSigned, "metadata", "name"):
		t.Errorf("certManager: the chain does not hold: leaf %v, CA %v, issuers %v", leaf["spec"], ca["spec"], issuers)
	}
	if got, want := hooks[0].GetAnnotations()["cert-manager.io/inject-ca-from"], "kube-system/"+field(leaf, "metadata", "name"); got != want {
		t.Errorf("certManager: inject-ca-from %q; want %q", got, want)
	}
	if field(hooks[0].Object, "webhooks", "0", "clientConfig", "caBundle") != "" {
		t.Error("certManager: the webhook carries a caBundle; want cainjector's alone")
	}
	apply("certManager", objs)

	// cert-manager with the user's issuer: only the serving Certificate, issued by it.
	objs = stable("certManager issuerRef", "--set", "evictionGuard.tls.certManager.enabled=true,evictionGuard.tls.certManager.issuerRef.name=corp-ca,evictionGuard.tls.certManager.issuerRef.kind=ClusterIssuer,evictionGuard.tls.certManager.issuerRef.group=cert-manager.io")
	if certs, issuers := byKind(objs, "Certificate"), byKind(objs, "Issuer"); len(certs) != 1 || len(issuers) != 0 ||
		field(certs[0].Object, "spec", "issuerRef", "name") != "corp-ca" || field(certs[0].Object, "spec", "issuerRef", "kind") != "ClusterIssuer" {
		t.Errorf("certManager issuerRef: %d Certificates, %d Issuers; want one Certificate issued by ClusterIssuer corp-ca", len(certs), len(issuers))
	}

	// The API server's client CA: mounted from the ConfigMap, named in the flags.
	objs = renderGuardObjects(t, "reprieve", "--set", "evictionGuard.clientAuth.caConfigMap=apiserver-client-ca,evictionGuard.clientAuth.allowedNames={kube-apiserver}")
	dep := byKind(objs, "Deployment")[0].Object
	var spec v1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any), &spec); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(spec.Containers[0].Args, " ")
	var mounted bool
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "apiserver-client-ca" && len(v.ConfigMap.Items) == 1 && v.ConfigMap.Items[0].Path == "ca.crt" {
			for _, m := range spec.Containers[0].VolumeMounts {
				mounted = mounted || (m.Name == v.Name && strings.Contains(args, "--client-ca-file="+m.MountPath+"/ca.crt"))
			}
		}
	}
	if !mounted || !strings.Contains(args, "--client-allowed-names=kube-apiserver") {
		t.Errorf("clientAuth: args %q, volumes %+v; want --client-ca-file on the mounted ConfigMap and --client-allowed-names", args, spec.Volumes)
	}
	apply("clientAuth", objs)
	if strings.Contains(string(render(t, "reprieve", "--show-only", "templates/eviction-guard.yaml")), "--client-ca-file") {
		t.Error("the default render asks for a client certificate; want it off by default")
	}

	for _, bad := range []struct{ set, want string }{
		{"evictionGuard.tls.existingSecret=guard-tls", "evictionGuard.tls.caBundle"},
		{"evictionGuard.tls.caBundle=x", "existingSecret only"},
		{"evictionGuard.tls.existingSecret=guard-tls,evictionGuard.tls.caBundle=x,evictionGuard.tls.certManager.enabled=true", "not both"},
		{"evictionGuard.tls.certManager.enabled=true,evictionGuard.tls.certManager.issuerRef.kind=Issuer", "issuerRef needs a name"},
		{"evictionGuard.tls.certManager.issuerRef.kind=Cluster", "kind"},
		{"evictionGuard.clientAuth.allowedNames={kube-apiserver}", "needs evictionGuard.clientAuth.caConfigMap"},
		{"evictionGuard.tls.secret=x", "secret"},
	} {
		if _, err := helm(t, "template", "reprieve", chartDir, "--set", bad.set); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--set %s: %v; want an error naming %s", bad.set, err, bad.want)
		}
	}
}
