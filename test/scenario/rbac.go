package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// AgentServiceAccount is the ServiceAccount that deploy/manifests/rbac.yaml binds.
const AgentServiceAccount = "reprieve"

// AgentNamespace is where the shipped manifests install the agent.
const AgentNamespace = "kube-system"

// InstallRBAC applies the ServiceAccount, ClusterRole and ClusterRoleBinding shipped in
// deploy/manifests/rbac.yaml (created, or replaced when present) and returns a kubeconfig for
// that ServiceAccount, so that tests run the agent with exactly the permissions users get.
func InstallRBAC(ctx context.Context, env *testenv.Env) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, "deploy", "manifests", "rbac.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	if err := Apply(ctx, env.Client, b); err != nil {
		return "", fmt.Errorf("applying %s: %w", path, err)
	}
	return env.ServiceAccountKubeconfig(ctx, AgentNamespace, AgentServiceAccount)
}

// Apply creates every object of manifest (a multi-document YAML of ServiceAccounts, cluster
// roles and bindings, admission policies and bindings, and DaemonSets), replacing any of the
// same name. Each edit, in order, may change an object before it is created.
func Apply(ctx context.Context, c kubernetes.Interface, manifest []byte, edits ...func(runtime.Object)) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("decoding: %w", err)
		}
		for _, edit := range edits {
			edit(obj)
		}
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			_ = c.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_ = c.RbacV1().ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.DaemonSet:
			_ = c.AppsV1().DaemonSets(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, o.Name, metav1.DeleteOptions{})
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			return fmt.Errorf("unexpected object %T in the manifest", obj)
		}
		if err != nil {
			return fmt.Errorf("creating %T: %w", obj, err)
		}
	}
}
