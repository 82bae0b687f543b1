package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// doctorClient answers SelfSubjectAccessReviews: everything allowed but deny.
func doctorClient(deny permission, nodes ...string) func(config.Config) (kube.Interface, error) {
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	c := fake.NewClientset(objs...)
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		ra := r.Spec.ResourceAttributes
		r.Status.Allowed = !(ra.Verb == deny.verb && ra.Resource == deny.resource && ra.Subresource == deny.subresource)
		return true, r, nil
	})
	return func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
}

func TestDoctorNamesTheMissingPermission(t *testing.T) {
	var out, errOut bytes.Buffer
	code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + t.TempDir()}, &out, &errOut,
		doctorClient(permission{"delete", "pods", ""}, "n1"))
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "FAIL  permission delete pods") || !strings.Contains(out.String(), `resources: ["pods"], verbs: ["delete"]`) {
		t.Errorf("the missing permission and its fix are not named:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "  ok    permission "); n != len(agentPermissions)+len(agentReads)-1 {
		t.Errorf("%d permissions ok, want %d:\n%s", n, len(agentPermissions)+len(agentReads)-1, out.String())
	}
}

// TestDoctorWarnsOfAMissingRead: without get on persistentvolumeclaims the agent still works,
// and cannot say per pod which volumes were released: doctor warns, names the fix, exits 0.
func TestDoctorWarnsOfAMissingRead(t *testing.T) {
	var out, errOut bytes.Buffer
	host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
	code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/"}, &out, &errOut,
		doctorClient(permission{"get", "persistentvolumeclaims", ""}, "n1"))
	if code != 0 {
		t.Errorf("exit %d, want 0 (a warning)\n%s%s", code, out.String(), errOut.String())
	}
	if want := "WARN  permission get persistentvolumeclaims: not granted"; !strings.Contains(out.String(), want) ||
		!strings.Contains(out.String(), "each pod's volumes are unknown") || !strings.Contains(out.String(), `resources: ["persistentvolumeclaims"], verbs: ["get"]`) {
		t.Errorf("want %q with what is lost and the fix:\n%s", want, out.String())
	}
}

func TestDoctorAllGreenAndMissingNode(t *testing.T) {
	var out, errOut bytes.Buffer
	// The kubelet package's cgroup v2 fixture stands in for the host.
	host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	if code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/", "--interruption-eviction=kube-controller-manager"}, &out, &errOut,
		doctorClient(permission{}, "n1")); code != 0 {
		t.Errorf("exit %d, want 0:\n%s%s", code, out.String(), errOut.String())
	}
	// The fixture carries GKE's kubelet configuration, which doctor finds at GKE's path.
	for _, want := range []string{"ok    kubelet config ", "(GKE): evictionHard memory.available<100Mi", "graceful node shutdown 30s (15s of it for critical pods)",
		"ok    memory.available ", "ok    pid.available ", "ok    volume release: a pod with a volume that attaches is gone 15.4s before the deadline (auto: 5s unmount allowance", "interruption eviction: kube-controller-manager: under the interruption taint cloud=spot:NoExecute"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	// The mode that keeps budgets says so, and which taint the node gets.
	out.Reset()
	if code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/", "--interruption-eviction=reprieve"}, &out, &errOut,
		doctorClient(permission{}, "n1")); code != 0 || !strings.Contains(out.String(), "interruption eviction: reprieve: the interruption taint cloud=spot:NoSchedule keeps kube-controller-manager's taint eviction out") {
		t.Errorf("exit %d; want 0 and the reprieve mode named:\n%s", code, out.String())
	}
	out.Reset()
	if code := runDoctor(context.Background(), []string{"--node=n2", "--provider=none", "--host-root=/nonexistent"}, &out, &errOut,
		doctorClient(permission{}, "n1")); code != 1 || !strings.Contains(out.String(), "FAIL  node n2") || !strings.Contains(out.String(), "FAIL  --host-root /nonexistent") {
		t.Errorf("exit %d, want 1 naming the node and the host root:\n%s", code, out.String())
	}
}

func TestDoctorBadFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	var out, errOut bytes.Buffer
	if code := runDoctor(context.Background(), []string{"--provider=none"}, &out, &errOut, doctorClient(permission{})); code != 2 || !strings.Contains(errOut.String(), "--node (or $NODE_NAME) is required") {
		t.Errorf("exit %d, stderr %q; want 2 naming --node", code, errOut.String())
	}
}

// A kubelet config whose threshold does not parse fails the check, quoting it.
func TestDoctorBadKubeletConfig(t *testing.T) {
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "var", "lib", "kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "var", "lib", "kubelet", "config.yaml"), []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + host}, &out, &errOut, doctorClient(permission{}, "n1"))
	if code != 1 || !strings.Contains(out.String(), "FAIL  reading the kubelet's eviction thresholds: kubelet config ") || !strings.Contains(out.String(), "lots") {
		t.Errorf("exit %d, want 1 quoting the bad threshold:\n%s%s", code, out.String(), errOut.String())
	}
}

// A threshold of reprieve's at or below the kubelet's hard one fails: the kubelet would act first.
func TestDoctorThresholdBelowTheKubelets(t *testing.T) {
	host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
	var out, errOut bytes.Buffer
	code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/",
		"--pressure-thresholds=memory.available<50Mi"}, &out, &errOut, doctorClient(permission{}, "n1"))
	if code != 1 || !strings.Contains(out.String(), "FAIL  memory.available: reprieve's threshold 50Mi is not above the kubelet's hard threshold 100Mi") {
		t.Errorf("exit %d, want 1 naming the threshold:\n%s", code, out.String())
	}
}

// TestDoctorNodeClaim: the token's node claim from the SelfSubjectReview and the dry-run
// writes. A ServiceAccount token without the claim whose dry-run patch the policy refuses fails
// with the fix; one bound to another node fails; one bound to this node passes, with the
// dry-run eviction of a pod of the node.
func TestDoctorNodeClaim(t *testing.T) {
	const sa = "system:serviceaccount:kube-system:reprieve"
	for _, c := range []struct {
		name   string
		extra  map[string]authenticationv1.ExtraValue
		refuse bool
		code   int
		want   []string
	}{
		{"no claim, refused", nil, true, 1, []string{"WARN  the token has no node claim", "FAIL  patching node n1 (dry run)", "ServiceAccountTokenPodNodeInfo"}},
		{"no claim, no policy", nil, false, 0, []string{"WARN  the token has no node claim", "ok    node n1 may be patched", "WARN  writes pass without a node claim"}},
		{"another node", map[string]authenticationv1.ExtraValue{nodeClaim: {"n2"}}, false, 1, []string{"FAIL  the token is bound to node n2, not n1"}},
		{"this node", map[string]authenticationv1.ExtraValue{nodeClaim: {"n1"}}, false, 0, []string{"ok    token bound to node n1", "ok    node n1 may be patched", "ok    pod ns/web may be evicted (server-side dry run)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c0 := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
				&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "u1"}, Spec: v1.PodSpec{NodeName: "n1"}})
			c0.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				r.Status.Allowed = true
				return true, r, nil
			})
			c0.PrependReactor("create", "selfsubjectreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, &authenticationv1.SelfSubjectReview{Status: authenticationv1.SelfSubjectReviewStatus{
					UserInfo: authenticationv1.UserInfo{Username: sa, Extra: c.extra}}}, nil
			})
			var dryRuns int
			c0.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if p := a.(k8stesting.PatchActionImpl); len(p.PatchOptions.DryRun) == 1 {
					dryRuns++
				}
				if c.refuse {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("this token is bound to no node"))
				}
				return false, nil, nil
			})
			var evicted []*policyv1.Eviction
			c0.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				evicted = append(evicted, a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction))
				return true, nil, nil
			})
			var out, errOut bytes.Buffer
			// The fixture host holds a kubelet configuration (GKE's), so that this machine's own
			// (or its absence) does not decide the exit code.
			host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
			code := runDoctor(context.Background(), []string{"--node=n1", "--provider=none", "--pressure-source=off", "--host-root=" + host}, &out, &errOut,
				func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c0), nil })
			if code != c.code {
				t.Errorf("exit %d, want %d:\n%s%s", code, c.code, out.String(), errOut.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			if dryRuns != 1 {
				t.Errorf("%d dry-run node patches, want 1", dryRuns)
			}
			if len(evicted) != 1 || evicted[0].DeleteOptions == nil || len(evicted[0].DeleteOptions.DryRun) != 1 ||
				evicted[0].DeleteOptions.Preconditions == nil || *evicted[0].DeleteOptions.Preconditions.UID != "u1" ||
				*evicted[0].DeleteOptions.GracePeriodSeconds < 1 {
				t.Errorf("evictions %+v; want one dry run with a UID precondition and a grace of at least 1 s", evicted)
			}
			if _, err := c0.CoreV1().Pods("ns").Get(context.Background(), "web", metav1.GetOptions{}); err != nil {
				t.Errorf("the dry-run eviction removed the pod: %v", err)
			}
		})
	}
}

// TestDoctorKubeletConfig: the kubelet's configuration is checked with pressure handling off too
// (the interruption plan reads the shutdown grace from it). Not found fails with the paths tried
// and the fix; an explicit path is the only one tried; a platform's drop-ins are listed.
func TestDoctorKubeletConfig(t *testing.T) {
	const hdr = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	write := func(t *testing.T, root, p, body string) {
		t.Helper()
		path := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		files  map[string]string
		args   []string
		code   int
		want   []string // each with the host root written as ROOT
		reject []string
	}{
		{
			name: "none found",
			code: 1,
			want: []string{
				"FAIL  kubelet configuration not found (tried ROOT/etc/kubernetes/kubelet/config.json, ROOT/etc/kubernetes/kubelet/kubelet-config.json, ",
				"ROOT/etc/default/kubeletconfig.json, ROOT/var/lib/kubelet/config.yaml): the kubelet's eviction thresholds and graceful node shutdown are unknown",
				"reprieve assumes the kubelet's defaults (evictionHard memory.available<100Mi",
				"fix: set --kubelet-config (the chart's pressure.kubeletConfig)", "EKS AL2023 (nodeadm) /etc/kubernetes/kubelet/config.json",
			},
			reject: []string{"ok    kubelet config"},
		},
		{
			name:  "explicit path missing",
			files: map[string]string{"/var/lib/kubelet/config.yaml": hdr},
			args:  []string{"--kubelet-config=/etc/kubelet.yaml"},
			code:  1,
			want:  []string{"FAIL  kubelet configuration not found (tried ROOT/etc/kubelet.yaml): "},
		},
		{
			name: "EKS AL2023 with a drop-in",
			files: map[string]string{
				"/etc/kubernetes/kubelet/config.json":                   `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"100Mi","nodefs.available":"10%"}}`,
				"/etc/kubernetes/kubelet/config.json.d/00-nodeadm.conf": hdr + "evictionHard:\n  memory.available: 300Mi\n",
			},
			code: 0,
			want: []string{"ok    kubelet config ROOT/etc/kubernetes/kubelet/config.json (EKS AL2023 (nodeadm)) with the drop-ins ROOT/etc/kubernetes/kubelet/config.json.d/00-nodeadm.conf: " +
				"evictionHard memory.available<300Mi,nodefs.available<10%, and its copy allocatableMemory.available<300Mi (enforceNodeAllocatable holds pods); graceful node shutdown off"},
			reject: []string{"FAIL"},
		},
		{
			// The kubelet evicts on allocatableMemory.available too, with the memory.available
			// threshold copied (addAllocatableThresholds); not when enforceNodeAllocatable leaves
			// the pods out, nor when it has a higher one of its own. Soft thresholds with their
			// grace periods.
			name: "the allocatable copy and soft thresholds",
			files: map[string]string{"/var/lib/kubelet/config.yaml": hdr + "evictionHard:\n  memory.available: 200Mi\n  nodefs.available: 5%\n" +
				"evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 15s\nevictionMaxPodGracePeriod: 4\n"},
			code: 0,
			want: []string{"(kubeadm): evictionHard memory.available<200Mi,nodefs.available<5%, and its copy allocatableMemory.available<200Mi (enforceNodeAllocatable holds pods); " +
				"evictionSoft memory.available<1Gi (held for memory.available 15s; evictionMaxPodGracePeriod 4s); graceful node shutdown off"},
		},
		{
			name:   "enforceNodeAllocatable without pods",
			files:  map[string]string{"/var/lib/kubelet/config.yaml": hdr + "enforceNodeAllocatable: [system-reserved]\nevictionHard:\n  memory.available: 200Mi\n"},
			code:   0,
			want:   []string{"(kubeadm): evictionHard memory.available<200Mi, no allocatableMemory.available (enforceNodeAllocatable without pods); graceful node shutdown off"},
			reject: []string{"its copy"},
		},
		{
			name:   "an allocatable threshold of its own above the copy",
			files:  map[string]string{"/var/lib/kubelet/config.yaml": hdr + "evictionHard:\n  memory.available: 200Mi\n  allocatableMemory.available: 500Mi\n"},
			code:   0,
			want:   []string{"(kubeadm): evictionHard memory.available<200Mi,allocatableMemory.available<500Mi; graceful node shutdown off"},
			reject: []string{"its copy"},
		},
		{
			name:  "a drop-in the kubelet refuses",
			files: map[string]string{"/etc/kubernetes/kubelet/config.json": hdr, "/etc/kubernetes/kubelet/config.json.d/00-nodeadm.conf": "evictionHard: {}\n"},
			code:  1,
			want:  []string{"FAIL  reading the kubelet's configuration: ", "00-nodeadm.conf", "are unknown"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, body := range tt.files {
				write(t, root, p, body)
			}
			var out, errOut bytes.Buffer
			args := append([]string{"--node=n1", "--provider=none", "--pressure-source=off", "--host-root=" + root}, tt.args...)
			code := runDoctor(context.Background(), args, &out, &errOut, doctorClient(permission{}, "n1"))
			if code != tt.code {
				t.Errorf("exit %d, want %d:\n%s%s", code, tt.code, out.String(), errOut.String())
			}
			for _, w := range tt.want {
				if w = strings.ReplaceAll(w, "ROOT", root); !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			for _, w := range tt.reject {
				if strings.Contains(out.String(), w) {
					t.Errorf("%q in\n%s", w, out.String())
				}
			}
		})
	}
}

// Doctor lists the other interruption handlers the node and its pods show, as warnings that do
// not fail it, and says so when there are none.
func TestDoctorOverlaps(t *testing.T) {
	host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
	args := []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/"}
	var out, errOut bytes.Buffer
	if code := runDoctor(context.Background(), args, &out, &errOut, doctorClient(permission{}, "n1")); code != 0 ||
		!strings.Contains(out.String(), "ok    no other interruption handler seen on node n1") {
		t.Errorf("exit %d, want 0 and no overlap:\n%s%s", code, out.String(), errOut.String())
	}
	c := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"karpenter.sh/nodepool": "spot"}}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "nth-1", Labels: map[string]string{"app.kubernetes.io/name": "aws-node-termination-handler"}},
			Spec: v1.PodSpec{NodeName: "n1"}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "nth-2", Labels: map[string]string{"app.kubernetes.io/name": "aws-node-termination-handler"}},
			Spec: v1.PodSpec{NodeName: "n2"}},
	)
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	out.Reset()
	code := runDoctor(context.Background(), args, &out, &errOut, func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil })
	if code != 0 {
		t.Errorf("exit %d, want 0: an overlap is a warning\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"WARN  Karpenter also acts on this node's interruptions (label karpenter.sh/nodepool=spot)",
		"leave its nodes to it with the chart value excludeNodes: [karpenter.sh/nodepool]",
		"WARN  aws-node-termination-handler also acts on this node's interruptions (pod kube-system/nth-1)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "nth-2") {
		t.Errorf("a pod of another node is named:\n%s", out.String())
	}
}
