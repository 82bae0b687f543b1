package testenv

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// KwokNodeAnnotationKey=KwokNodeAnnotationValue is the annotation that marks a Node as
// managed by the environment's kwok; CreateNode sets it, and a Node created otherwise needs
// it to become Ready.
const (
	KwokNodeAnnotationKey   = "kwok.x-k8s.io/node"
	KwokNodeAnnotationValue = "fake"
)

// nodeReadyTimeout bounds how long CreateNode waits for kwok (and nodelifecycle).
const nodeReadyTimeout = 30 * time.Second

// CreateNode creates a Node that kwok manages, with allocatable cpu 32, memory 256Gi and
// pods 300, and no taints of its own, and waits until its Ready condition is True. The
// TaintNodesByCondition admission plugin gives every new node a
// node.kubernetes.io/not-ready:NoSchedule taint that only the node-lifecycle controller
// removes: when kube-controller-manager runs it, CreateNode also waits for that removal;
// otherwise the taint stays (it does not matter for pods bound with spec.nodeName). labels are added to
// the usual kubernetes.io/hostname, kubernetes.io/os and kubernetes.io/arch labels and win
// over them.
func (e *Env) CreateNode(ctx context.Context, name string, labels map[string]string) (*corev1.Node, error) {
	all := map[string]string{
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"type":                   "kwok",
	}
	maps.Copy(all, labels)
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("300"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: all,
			Annotations: map[string]string{
				KwokNodeAnnotationKey:          KwokNodeAnnotationValue,
				"node.alpha.kubernetes.io/ttl": "0",
			},
		},
		Status: corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources.DeepCopy(),
		},
	}
	created, err := e.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", name, err)
	}
	if created.Status.Allocatable.Pods().IsZero() {
		// The API server dropped the status on create: set it through the status subresource.
		created.Status.Capacity = resources
		created.Status.Allocatable = resources.DeepCopy()
		if created, err = e.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("setting the capacity of node %s: %w", name, err)
		}
	}
	waitTaint := e.ControllerManagerRunning("nodelifecycle")
	ctx, cancel := context.WithTimeout(ctx, nodeReadyTimeout)
	defer cancel()
	var last *corev1.Node
	for {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = n
			if nodeReady(n) && (!waitTaint || !hasTaint(n, corev1.TaintNodeNotReady)) {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			state := "never read"
			if last != nil {
				state = fmt.Sprintf("conditions %v, taints %v", last.Status.Conditions, last.Spec.Taints)
			}
			return nil, fmt.Errorf("waiting for node %s to be ready: %w (%s; kwok log %s)",
				name, ctx.Err(), state, filepath.Join(e.LogDir, "kwok.log"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// CreateNamespace creates a namespace and its "default" ServiceAccount, which pod admission
// needs when the serviceaccount controller does not run. A ServiceAccount that already
// exists is fine.
func (e *Env) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := e.Client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service account %s/default: %w", name, err)
	}
	return nil
}

// ServiceAccountKubeconfig writes a kubeconfig file for the ServiceAccount namespace/name
// (which must exist) into the environment's data folder and returns its path. The token is
// requested from the TokenRequest API and is valid for an hour, so a program under test
// can run with exactly the permissions RBAC gives that account.
func (e *Env) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	return e.serviceAccountKubeconfig(ctx, namespace, name, nil)
}

// BoundServiceAccountKubeconfig is ServiceAccountKubeconfig with the token bound to pod (in the
// ServiceAccount's namespace), as the kubelet's projected tokens are: the API server then puts
// the pod's node in the token's claims (authentication.kubernetes.io/node-name), which
// admission policies can check.
func (e *Env) BoundServiceAccountKubeconfig(ctx context.Context, namespace, name string, pod *corev1.Pod) (string, error) {
	return e.serviceAccountKubeconfig(ctx, namespace, name, pod)
}

func (e *Env) serviceAccountKubeconfig(ctx context.Context, namespace, name string, pod *corev1.Pod) (string, error) {
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}
	file := fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name)
	if pod != nil {
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		file = fmt.Sprintf("sa-%s-%s-%s.kubeconfig", namespace, name, pod.Name)
	}
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for service account %s/%s: %w", namespace, name, err)
	}
	path := filepath.Join(e.dataDir, file)
	user := fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
	if err := writeKubeconfig(path, e.Host, e.CAData, user, tr.Status.Token); err != nil {
		return "", err
	}
	return path, nil
}
