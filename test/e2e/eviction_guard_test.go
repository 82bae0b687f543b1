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
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// shippedAgentUser is the agent's identity in the chart's default render (release reprieve in
// kube-system).
const shippedAgentUser = "system:serviceaccount:kube-system:reprieve"

// startEvictionGuard runs the eviction guard for the agent ServiceAccount ns/sa and registers
// the chart's own ValidatingWebhookConfiguration for it, as the chart renders it (helm template
// --show-only templates/eviction-guard.yaml) with three changes only: its name (sa-ns-...,
// cluster-scoped, so that tests do not collide), its matchConditions' ServiceAccount (ns/sa
// instead of kube-system/reprieve), and its clientConfig (https://127.0.0.1:PORT with a CA the
// call makes, instead of the in-cluster Service). The guard is `$REPRIEVE_BIN eviction-guard`,
// a local process, with its own ServiceAccount (ns/sa-guard) bound to the chart's ClusterRole
// for it (get, list and watch pods: its index).
//
// Call it after binding ns/sa to the shipped ClusterRole "reprieve": it returns once the API
// server calls the guard for that identity (it probes with a dry-run eviction as ns/sa). stop
// ends the guard process (the webhook stays registered, so the agent's evictions then fail with
// a 500, as with every replica down); stop may be called more than once. t.Cleanup stops the
// guard and deletes the webhook configuration and the guard's RBAC.
func startEvictionGuard(ctx context.Context, t *testing.T, sa, ns string) (stop func()) {
	t.Helper()
	return startEvictionGuardVia(ctx, t, sa, ns, nil)
}

// startEvictionGuardVia is startEvictionGuard with the guard's kubeconfig (its ServiceAccount's,
// for the API server) passed through via first, when it is not nil: a test puts a proxy between
// the guard and the API server that way.
func startEvictionGuardVia(ctx context.Context, t *testing.T, sa, ns string, via func(kubeconfig string) string) (stop func()) {
	t.Helper()
	c := env.Client
	prefix := sa + "-" + ns
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
	if hook == nil || role == nil || len(hook.Webhooks) != 1 || len(hook.Webhooks[0].MatchConditions) != 1 ||
		!strings.Contains(hook.Webhooks[0].MatchConditions[0].Expression, `"`+shippedAgentUser+`"`) {
		t.Fatalf("the chart's eviction guard render lacks a webhook for %s, or its ClusterRole: %+v %+v", shippedAgentUser, hook, role)
	}

	// The guard's own identity, with the chart's ClusterRole.
	guardSA := sa + "-guard"
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: guardSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: prefix + "-eviction-guard"}
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
	guardKube, err := env.ServiceAccountKubeconfig(ctx, ns, guardSA)
	if err != nil {
		t.Fatal(err)
	}
	if via != nil {
		guardKube = via(guardKube)
	}

	// A self-signed serving certificate for 127.0.0.1, which is also the webhook's CA.
	dir := t.TempDir()
	certPEM, certFile, keyFile := selfSignedPair(t, dir)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := testenv.StartProcess(ctx, "eviction-guard", filepath.Join(logDir, "eviction-guard-"+prefix+".log"), reprieveBin,
		[]string{"eviction-guard", "--bind-address=" + addr, "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile,
			"--agent-service-account=" + ns + ":" + sa, "--kubeconfig=" + guardKube, "-v=4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop = func() { _ = p.Stop() }
	t.Cleanup(stop)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, os.ErrProcessDone
		}
		resp, err := hc.Get("https://" + addr + guard.PathReadyz)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("waiting for the eviction guard: %v\n%s", err, p.LogTail(30))
	}

	url := "https://" + addr + guard.PathValidate
	wh := &hook.Webhooks[0]
	wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: certPEM}
	wh.MatchConditions[0].Expression = strings.ReplaceAll(wh.MatchConditions[0].Expression, shippedAgentUser, "system:serviceaccount:"+ns+":"+sa)
	hook.ObjectMeta = metav1.ObjectMeta{Name: prefix + "-eviction-guard", Labels: hook.Labels}
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, hook.Name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, role.Name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
	})

	// In force once the guard answers for ns/sa: a dry-run eviction of a pod that does not exist,
	// as ns/sa with a node claim (impersonated by the admin), is refused by the guard (its one
	// refusal message; the reason, "not found", is in its log only) rather than by the registry.
	probe := impersonate(t, sa, ns, prefix+"-probe")
	probeName := prefix + "-guard-probe"
	waitFor(ctx, t, "the eviction guard in force", func() bool {
		err := evict(ctx, probe, ns, probeName, ptr64(1), ptrUID("probe"), true)
		return err != nil && strings.Contains(err.Error(), guardDeniedText) && strings.Contains(err.Error(), "admission webhook")
	})
	return stop
}

// selfSignedPair writes a self-signed ECDSA certificate for 127.0.0.1 and its key into dir.
func selfSignedPair(t *testing.T, dir string) (certPEM []byte, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "eviction-guard-e2e"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPEM, certFile, keyFile
}

func ptrUID(u types.UID) *types.UID { return &u }

// evict posts an Eviction for ns/name with the given grace and UID precondition (nil: none).
func evict(ctx context.Context, cl kubernetes.Interface, ns, name string, grace *int64, uid *types.UID, dryRun bool) error {
	opts := &metav1.DeleteOptions{GracePeriodSeconds: grace}
	if uid != nil {
		opts.Preconditions = &metav1.Preconditions{UID: uid}
	}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return cl.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, DeleteOptions: opts})
}

// TestEvictionGuardBindsEvictionsToTheNode tries, with the token of node A's agent (a real
// ServiceAccount token bound to the agent's pod on A, with the shipped ClusterRole, admission
// policies and eviction guard webhook), to evict a pod on node B (refused by the guard, naming
// both nodes), a pod on A with grace 0 or without a UID precondition (refused by the policy),
// and a pod on A as the agent does (allowed). Then, with the guard stopped, an eviction on A
// fails with a 500 and the real agent still ends A's pods before the reclaim deadline with its
// node-bound DELETE.
func TestEvictionGuardBindsEvictionsToTheNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "evguard", "reprieve-evguard", "evguard-a", "evguard-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, c, ns, nodeA, taint, []scenario.Pod{
		{Name: "evicted", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(5)},
		{Name: "work", Kind: scenario.Plain, Tolerate: ptr64(2), Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) *v1.Pod {
		t.Helper()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	clientA := clientFor(t, kubeA)
	stopGuard := startEvictionGuard(ctx, t, sa, ns)

	onB, onA := pod("victim-"+nodeB), pod("victim-"+nodeA)
	err := evict(ctx, clientA, ns, onB.Name, ptr64(5), &onB.UID, false)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("node A's agent evicting a pod on node B: %v; want a 403 from the guard", err)
	}
	// The reason names both nodes in the guard's log, and only there (guard_hostile_test.go).
	if log := guardLogText(t, sa, ns); !strings.Contains(log, "bound to ("+nodeA+")") || !strings.Contains(log, "pod "+ns+"/"+onB.Name+" is on "+nodeB) {
		t.Errorf("the guard's log does not name %s and %s as the refusal's reason", nodeA, nodeB)
	}
	err = evict(ctx, clientA, ns, onA.Name, ptr64(0), &onA.UID, false)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "gracePeriodSeconds of at least 1") {
		t.Errorf("evicting a pod on node A with grace 0: %v; want a 403 from the policy", err)
	}
	err = evict(ctx, clientA, ns, onA.Name, nil, &onA.UID, false)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "gracePeriodSeconds of at least 1") {
		t.Errorf("evicting a pod on node A without a grace: %v; want a 403 from the policy", err)
	}
	err = evict(ctx, clientA, ns, onA.Name, ptr64(1), nil, false)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "UID precondition") {
		t.Errorf("evicting a pod on node A without a UID precondition: %v; want a 403 from the policy", err)
	}
	if p := pod(onA.Name); p.DeletionTimestamp != nil {
		t.Fatalf("the refused evictions deleted %s", p.Name)
	}
	evicted := pod("evicted")
	if err := evict(ctx, clientA, ns, evicted.Name, ptr64(1), &evicted.UID, false); err != nil {
		t.Errorf("node A's agent evicting a pod on node A as the agent does: %v; want it allowed", err)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, evicted.Name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("the allowed eviction left %s running", evicted.Name)
	}

	// Every guard replica down: the webhook still matches, the API server cannot call it, and
	// failurePolicy Fail refuses the agent's evictions with a 500.
	stopGuard()
	err = evict(ctx, clientA, ns, onA.Name, ptr64(1), &onA.UID, false)
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("evicting a pod on node A with the guard down: %v; want a 500 (failed calling webhook)", err)
	}

	// The real agent, with A's token, through an interruption with the guard down: each pod on A
	// ends by the node-bound DELETE at its last safe moment, before the deadline.
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+kubeA, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	deadline := time.Now().Add(25 * time.Second).Truncate(time.Second)
	setDeadline(ctx, t, nodeA, deadline.UTC().Format(time.RFC3339))
	gone := func(name string) bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 40*time.Second, true, func(context.Context) (bool, error) {
		return gone("work") && gone(onA.Name), nil
	})
	if err != nil {
		t.Fatalf("waiting for node A's pods to end with the guard down: %v\n%s", err, rp.LogTail(60))
	}
	// Their force point is deadline - 5 s margin - 2 s (the kubelet's least grace; the pods' own
	// is 1 s) - 1 s (the kubelet's reaction) - 0.5 s lead: not at once (the agent retried the
	// eviction until then), and before the deadline.
	last := deadline.Add(-5*time.Second - plan.MinGrace - plan.KubeletReaction - plan.EvictionLead)
	if now := time.Now(); !now.Before(deadline) || now.Before(last.Add(-500*time.Millisecond)) {
		t.Errorf("node A's pods were deleted at deadline%+v; want at about deadline%+v, after retrying the eviction\n%s", now.Sub(deadline), last.Sub(deadline), rp.LogTail(80))
	}
	log := rp.LogTail(400)
	for _, want := range []string{"failed calling webhook", "Deleting pod: the reclaim deadline leaves no time"} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log lacks %q:\n%s", want, log)
		}
	}
	if p := pod(onB.Name); p.DeletionTimestamp != nil {
		t.Errorf("the pod on node B was deleted; want it untouched")
	}
	if p := pod("agent-" + nodeA); p.DeletionTimestamp != nil {
		t.Errorf("the agent's own pod was deleted; want it left alone")
	}
}

// installShippedPolicies applies deploy/manifests/admission-policy.yaml for ServiceAccount ns/sa,
// each policy and binding renamed with the prefix sa-ns (they are cluster-scoped, and other
// tests apply the same manifest), and deletes them when the test ends.
func installShippedPolicies(ctx context.Context, t *testing.T, sa, ns string) {
	t.Helper()
	manifest := string(readRepoFile(t, "deploy", "manifests", "admission-policy.yaml"))
	if !strings.Contains(manifest, shippedAgentUser) || !strings.Contains(manifest, "name: reprieve-eviction-options") {
		t.Fatalf("the shipped policies do not name %s or lack the eviction policy", shippedAgentUser)
	}
	prefix := sa + "-" + ns + "-"
	manifest = strings.ReplaceAll(manifest, shippedAgentUser, "system:serviceaccount:"+ns+":"+sa)
	manifest = strings.ReplaceAll(manifest, "name: reprieve-", "name: "+prefix)
	manifest = strings.ReplaceAll(manifest, "policyName: reprieve-", "policyName: "+prefix)
	objs := manifestObjects(t, "admission-policy.yaml", []byte(manifest))
	t.Cleanup(func() {
		ctx := context.Background()
		for _, o := range objs {
			switch o.GetKind() {
			case "ValidatingAdmissionPolicyBinding":
				_ = env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, o.GetName(), metav1.DeleteOptions{})
			case "ValidatingAdmissionPolicy":
				_ = env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, o.GetName(), metav1.DeleteOptions{})
			}
		}
	})
	if err := scenario.Apply(ctx, env.Client, []byte(manifest)); err != nil {
		t.Fatal(err)
	}
	// In force once a dry-run eviction with grace 0 as ns/sa is refused by the policy (it runs
	// before the registry looks the pod up, so the pod need not exist).
	probe := impersonate(t, sa, ns, sa+"-"+ns+"-probe")
	waitFor(ctx, t, "the eviction policy in force", func() bool {
		err := evict(ctx, probe, ns, sa+"-policy-probe", ptr64(0), ptrUID("probe"), true)
		return err != nil && strings.Contains(err.Error(), "gracePeriodSeconds of at least 1")
	})
}

// impersonate is a client that acts as ServiceAccount ns/sa with node as its token's node claim
// (the admin impersonates it, extra included).
func impersonate(t *testing.T, sa, ns, node string) kubernetes.Interface {
	t.Helper()
	imp := rest.CopyConfig(env.Config)
	imp.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
		Extra: map[string][]string{guard.NodeClaim: {node}}}
	cl, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// testEvictionGuardChartKeepsItsKeyPair renders the chart's eviction guard against the real API
// server (helm template --dry-run=server, where lookup would read the cluster) before and after
// its Secret exists: no render carries a key, a certificate or a caBundle, every render is the
// same bytes, and the Secret is rendered empty, so that an upgrade or a re-apply neither rotates
// the pair nor takes the caBundle back. The guard makes and keeps them (its certificate verifies
// for the Service's name against the caBundle: TestLifecycleGuardCertificateSurvivesReapply).
func testEvictionGuardChartKeepsItsKeyPair(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "evguard-tls"
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	renderGuard := func() ([]byte, *v1.Secret, *admissionregistrationv1.ValidatingWebhookConfiguration) {
		t.Helper()
		// A release of its own: the cluster's "reprieve" ClusterRole belongs to no release.
		out, err := helm(t, "template", "evguard", chartDir, "--namespace", ns, "--dry-run=server", "--kubeconfig", env.Kubeconfig,
			"--show-only", "templates/eviction-guard.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var secret *v1.Secret
		var hook *admissionregistrationv1.ValidatingWebhookConfiguration
		for _, o := range chartObjects(t, "eviction-guard", out) {
			switch o := o.(type) {
			case *v1.Secret:
				secret = o
			case *admissionregistrationv1.ValidatingWebhookConfiguration:
				hook = o
			}
		}
		if secret == nil || hook == nil || len(hook.Webhooks) != 1 {
			t.Fatalf("the render lacks the guard's Secret or webhook:\n%s", out)
		}
		return out, secret, hook
	}
	first, secret, hook := renderGuard()
	if len(secret.Data) != 0 || len(secret.StringData) != 0 || len(hook.Webhooks[0].ClientConfig.CABundle) != 0 ||
		bytes.Contains(first, []byte("PRIVATE KEY")) || bytes.Contains(first, []byte("CERTIFICATE")) {
		t.Errorf("the render carries key material (Secret data %d keys, caBundle %d bytes); want none: the guard makes it",
			len(secret.Data), len(hook.Webhooks[0].ClientConfig.CABundle))
	}
	// As the guard leaves it once it has made its pair, owned by the release.
	secret.Namespace = ns
	secret.Annotations = map[string]string{"meta.helm.sh/release-name": "evguard", "meta.helm.sh/release-namespace": ns}
	secret.Data = map[string][]byte{"ca.crt": []byte("x"), "tls.crt": []byte("y"), "tls.key": []byte("z")}
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Secrets(ns).Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	if again, _, _ := renderGuard(); !bytes.Equal(again, first) {
		t.Error("a render with the guard's Secret in the cluster differs from one without; want the same bytes")
	}
}

// testEvictionGuardChartRender checks the chart's eviction guard as rendered: on by default, off
// in the values files of the static manifests; a webhook that fails closed, fast, for the
// agent's evictions only; a guard that may only read pods, runs two replicas off spot capacity
// under a budget, with the agent's container securityContext; and no pod the agent's DaemonSet
// would select.
func testEvictionGuardChartRender(t *testing.T) {
	// The per-cloud values files keep the guard (the chart's default); the static manifests
	// rendered from them (render.sh shows only the agent's templates) carry none of it.
	for _, f := range []string{"aws", "gcp", "azure"} {
		if out := render(t, "reprieve", "-f", "deploy/chart/values-"+f+".yaml"); !strings.Contains(string(out), "kind: ValidatingWebhookConfiguration") {
			t.Errorf("values-%s.yaml renders no eviction guard; want the chart's default (on)", f)
		}
	}
	for _, f := range []string{"rbac.yaml", "admission-policy.yaml", "daemonset.yaml", "daemonset-gcp.yaml", "daemonset-azure.yaml"} {
		if b := string(readRepoFile(t, "deploy", "manifests", f)); strings.Contains(b, "kind: ValidatingWebhookConfiguration") || strings.Contains(b, "PRIVATE KEY") {
			t.Errorf("deploy/manifests/%s carries the eviction guard or a private key; static manifests must not", f)
		}
	}
	var (
		hook   *admissionregistrationv1.ValidatingWebhookConfiguration
		role   *rbacv1.ClusterRole
		deploy *appsv1.Deployment
		pdb    *policyv1.PodDisruptionBudget
	)
	for _, o := range chartObjects(t, "eviction-guard", render(t, "reprieve", "--show-only", "templates/eviction-guard.yaml")) {
		switch o := o.(type) {
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			hook = o
		case *rbacv1.ClusterRole:
			// The one that reads pods, not the one for the guard's own caBundle.
			if !isCABundleRole(o) {
				role = o
			}
		case *appsv1.Deployment:
			deploy = o
		case *policyv1.PodDisruptionBudget:
			pdb = o
		}
	}
	if hook == nil || role == nil || deploy == nil || pdb == nil {
		t.Fatalf("the default render lacks the guard's webhook, ClusterRole, Deployment or budget")
	}
	wh := hook.Webhooks[0]
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail || wh.SideEffects == nil ||
		*wh.SideEffects != admissionregistrationv1.SideEffectClassNone || wh.TimeoutSeconds == nil || *wh.TimeoutSeconds != 3 ||
		!reflect.DeepEqual(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("webhook %+v; want failurePolicy Fail, sideEffects None, timeoutSeconds 3, admission review v1", wh)
	}
	if len(wh.Rules) != 1 || !reflect.DeepEqual(wh.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
		!reflect.DeepEqual(wh.Rules[0].Resources, []string{"pods/eviction"}) {
		t.Errorf("webhook rules %+v; want CREATE pods/eviction only", wh.Rules)
	}
	if len(wh.MatchConditions) != 1 || wh.MatchConditions[0].Expression != `request.userInfo.username == "`+shippedAgentUser+`"` {
		t.Errorf("webhook matchConditions %+v; want the agent's ServiceAccount only", wh.MatchConditions)
	}
	// No caBundle: the guard writes it (evictionGuard.tls default), and a manifest that set it
	// would take it back at every apply.
	if len(wh.ClientConfig.CABundle) != 0 || wh.ClientConfig.Service == nil || wh.ClientConfig.Service.Path == nil ||
		*wh.ClientConfig.Service.Path != guard.PathValidate {
		t.Errorf("webhook clientConfig %+v; want the guard's Service at %s without a caBundle", wh.ClientConfig, guard.PathValidate)
	}
	// Its index: get, list and watch pods, nothing else (TestEvictionGuardRBAC tries them).
	if len(role.Rules) != 1 || !reflect.DeepEqual(role.Rules[0].Verbs, []string{"get", "list", "watch"}) || !reflect.DeepEqual(role.Rules[0].Resources, []string{"pods"}) {
		t.Errorf("the guard's ClusterRole %+v; want get, list and watch pods only", role.Rules)
	}
	// Its limits, each a chart value (evictionGuard.limits).
	args := strings.Join(deploy.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--source-reviews-in-flight=", "--reviews-in-flight=", "--source-connections=", "--connections=", "--source-pod-reads-per-second="} {
		if !strings.Contains(args, want) {
			t.Errorf("the guard's arguments lack %s: %s", want, args)
		}
	}
	if out, err := helm(t, "template", "reprieve", chartDir, "--set", "evictionGuard.limits.reviewsInFlight=10", "--set", "evictionGuard.limits.sourceReviewsInFlight=20"); err == nil ||
		!strings.Contains(err.Error(), "reviewsInFlight 10: want at least sourceReviewsInFlight (20)") {
		t.Errorf("fewer reviews in flight in all than per source: %v\n%s; want the chart to refuse it", err, out)
	}
	// Its own priority level, off workload-high where the agents' evictions wait: every request
	// of its ServiceAccount, matched before kube-system-service-accounts.
	var level *flowcontrolv1.PriorityLevelConfiguration
	var schema *flowcontrolv1.FlowSchema
	for _, o := range chartObjects(t, "eviction-guard-flowcontrol", render(t, "reprieve", "--show-only", "templates/eviction-guard-flowcontrol.yaml")) {
		switch o := o.(type) {
		case *flowcontrolv1.PriorityLevelConfiguration:
			level = o
		case *flowcontrolv1.FlowSchema:
			schema = o
		}
	}
	if level == nil || schema == nil {
		t.Fatal("the default render lacks the guard's priority level or flow schema")
	}
	if l := level.Spec.Limited; l == nil || l.LendablePercent == nil || *l.LendablePercent != 0 || l.NominalConcurrencyShares == nil || *l.NominalConcurrencyShares < 1 {
		t.Errorf("the guard's priority level %+v; want a limited level that lends nothing", level.Spec)
	}
	if schema.Spec.PriorityLevelConfiguration.Name != level.Name || schema.Spec.MatchingPrecedence >= 900 || len(schema.Spec.Rules) != 1 ||
		len(schema.Spec.Rules[0].Subjects) != 1 || schema.Spec.Rules[0].Subjects[0].ServiceAccount == nil ||
		schema.Spec.Rules[0].Subjects[0].ServiceAccount.Name != deploy.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the guard's flow schema %+v; want the guard's ServiceAccount alone, on its level, before 900", schema.Spec)
	}
	// maxUnavailable 1: a drain is never blocked by the guard's budget (issue 49, item 1).
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("budget %+v; want maxUnavailable 1", pdb.Spec)
	}
	spec := deploy.Spec.Template.Spec
	if deploy.Spec.Replicas == nil || *deploy.Spec.Replicas != 2 {
		t.Errorf("replicas %v; want 2", deploy.Spec.Replicas)
	}
	// Off spot capacity where there is any (evictionGuard.offSpot preferred, the default: issue
	// 49 item 1); testEvictionGuardChartPlacement checks offSpot required.
	var offSpot []string
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil {
		for _, term := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			for _, e := range term.Preference.MatchExpressions {
				offSpot = append(offSpot, e.Key+" "+string(e.Operator)+" "+strings.Join(e.Values, ","))
			}
		}
	}
	// Every platform's spot label, the chart's one list (reprieve.spotLabels): an EKS managed
	// spot pool and GKE's preemptible VMs too (issue 36 item 2).
	if want := []string{"karpenter.sh/capacity-type NotIn spot", "eks.amazonaws.com/capacityType NotIn SPOT", "cloud.google.com/gke-spot NotIn true",
		"cloud.google.com/gke-preemptible NotIn true", "kubernetes.azure.com/scalesetpriority NotIn spot"}; !reflect.DeepEqual(offSpot, want) {
		t.Errorf("preferred node affinity %q; want %q", offSpot, want)
	}
	if len(spec.TopologySpreadConstraints) == 0 || spec.TopologySpreadConstraints[0].TopologyKey != v1.LabelHostname {
		t.Errorf("topology spread %+v; want the replicas spread across hosts", spec.TopologySpreadConstraints)
	}
	ds, _ := renderDaemonSet(t, "defaults")
	if got, want := spec.Containers[0].SecurityContext, ds.Spec.Template.Spec.Containers[0].SecurityContext; !reflect.DeepEqual(got, want) {
		t.Errorf("the guard's securityContext %+v; want the agent's %+v", got, want)
	}
	if spec.Containers[0].Resources.Requests == nil || spec.PriorityClassName == "" || spec.ServiceAccountName == ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the guard pod: resources %+v, priority class %q, ServiceAccount %q; want requests, a priority class and an identity of its own",
			spec.Containers[0].Resources, spec.PriorityClassName, spec.ServiceAccountName)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Matches(labels.Set(deploy.Spec.Template.Labels)) {
		t.Errorf("the agent's DaemonSet selector %v matches the guard's pods %v", sel, deploy.Spec.Template.Labels)
	}
}
