package main

import (
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
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// aws-node-termination-handler (NTH) in IMDS mode, one per node, as its Helm chart's DaemonSet
// runs it: for the pool's comparison row. It is built by test/tools/nth.sh into the tools
// cache from its module (pinned in test/tools/nth/go.mod).

// nthBin is NTH's binary in the tools cache.
const nthBin = "node-termination-handler"

// nthServiceAccount is where NTH's chart installs it (kube-system, so APF's default schemas
// put it in workload-high, as reprieve).
const nthNamespace, nthServiceAccount = "kube-system", "aws-node-termination-handler"

// nthRules are the ClusterRole of NTH's chart (config/helm/aws-node-termination-handler/
// templates/clusterrole.yaml at v1.25.1, events off as its default emitKubernetesEvents is).
var nthRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get"}},
	{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
	{APIGroups: []string{"extensions", "apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get"}},
}

// nthPath returns NTH's binary, or an error saying how to build it.
func nthPath() (string, error) {
	bin, err := testenv.ToolsBin()
	if err != nil {
		return "", err
	}
	p := filepath.Join(bin, nthBin)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("aws-node-termination-handler is not built (test/tools/nth.sh): %w", err)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return "", fmt.Errorf("running aws-node-termination-handler needs unshare (util-linux) for its in-cluster paths: %w", err)
	}
	return p, nil
}

// nthToken installs NTH's ServiceAccount and ClusterRole and returns a token of it.
func (b *bench) nthToken(ctx context.Context) (string, error) {
	c := b.env.Client
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nthNamespace, Name: nthServiceAccount}}
	if _, err := c.CoreV1().ServiceAccounts(nthNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating NTH's service account: %w", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: nthServiceAccount}, Rules: nthRules}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating NTH's cluster role: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: nthServiceAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: nthServiceAccount},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: nthNamespace, Name: nthServiceAccount}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating NTH's cluster role binding: %w", err)
	}
	kc, err := b.env.ServiceAccountKubeconfig(ctx, nthNamespace, nthServiceAccount)
	if err != nil {
		return "", err
	}
	return tokenOf(kc)
}

// selfSigned returns a certificate for 127.0.0.1 that is its own CA, and its PEM.
func selfSigned() (*tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bench API proxy"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating a certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// startNTH starts NTH for node in IMDS mode against the IMDS at imds, talking to the API
// server through a TLS proxy of its own (returned) that counts its requests and answers with
// token. NTH reads its API server only from the in-cluster environment (rest.InClusterConfig
// in its cmd/node-termination-handler.go): $KUBERNETES_SERVICE_HOST and _PORT, and the token
// and CA at /var/run/secrets/kubernetes.io/serviceaccount. Each runs in a mount namespace of
// its own (unshare) with a tmpfs on /run holding that node's files, so the host's paths are
// left alone.
func (b *bench) startNTH(ctx context.Context, bin, node, imds, token string) (*testenv.Process, *apiProxy, error) {
	cert, caPEM, err := selfSigned()
	if err != nil {
		return nil, nil, err
	}
	p, err := startAPIProxyWith(b.env.Host, b.env.CAData, token, cert)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		p.Close()
		return nil, nil, fmt.Errorf("parsing %s: %w", p.URL, err)
	}
	dir := filepath.Join(b.logDir, "nth-"+node)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.Close()
		return nil, nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	// The proxy sets the real token; NTH's own is read but replaced.
	if err := errors.Join(os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o644),
		os.WriteFile(filepath.Join(dir, "token"), []byte("replaced-by-the-proxy"), 0o600)); err != nil {
		p.Close()
		return nil, nil, fmt.Errorf("writing NTH's in-cluster files: %w", err)
	}
	unshare, _ := exec.LookPath("unshare")
	script := `set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp "$1/ca.crt" "$1/token" /run/secrets/kubernetes.io/serviceaccount/
exec "$2" --metadata-url="$3"`
	env := []string{
		"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port(),
		"NODE_NAME=" + node,
		// Its IMDS is the mock on loopback: never its default 169.254.169.254 (flag and
		// environment both, config.go's INSTANCE_METADATA_URL).
		"INSTANCE_METADATA_URL=" + imds,
		// The chart's defaults for IMDS mode, apart from the servers that would share ports and the
		// scheduled events, which the mock's spot mode does not serve.
		"ENABLE_SPOT_INTERRUPTION_DRAINING=true", "ENABLE_SCHEDULED_EVENT_DRAINING=false",
		"ENABLE_REBALANCE_MONITORING=false", "ENABLE_REBALANCE_DRAINING=false",
		"ENABLE_PROMETHEUS_SERVER=false", "ENABLE_PROBES_SERVER=false",
		"POD_TERMINATION_GRACE_PERIOD=-1", "NODE_TERMINATION_GRACE_PERIOD=120",
		"IGNORE_DAEMON_SETS=true", "DELETE_LOCAL_DATA=true", "METADATA_TRIES=3",
		"ENABLE_ASG_LIFECYCLE_DRAINING=false", "LOG_LEVEL=info",
	}
	proc, err := testenv.StartProcess(ctx, "nth-"+node, filepath.Join(b.logDir, "nth-"+node+".log"), unshare,
		[]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", dir, bin, imds}, env)
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return proc, p, nil
}
