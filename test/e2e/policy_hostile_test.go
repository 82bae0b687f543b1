package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// refusedWith403 fails the test unless err is the API server's 403 Forbidden naming want: not a
// 422 Invalid (what a policy that cannot evaluate returns with failurePolicy Fail), nor anything
// else. It logs the code and reason it saw, for the record of what each refusal looks like.
func refusedWith403(t *testing.T, what string, err error, want string) {
	t.Helper()
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		t.Errorf("%s: %v; want 403 Forbidden naming %q", what, err, want)
		return
	}
	s := status.Status()
	if s.Code != http.StatusForbidden || s.Reason != metav1.StatusReasonForbidden || apierrors.IsInvalid(err) || !strings.Contains(s.Message, want) {
		t.Errorf("%s: %d %s: %s; want 403 Forbidden naming %q", what, s.Code, s.Reason, s.Message, want)
		return
	}
	t.Logf("refused: %s: %d %s: %s", what, s.Code, s.Reason, s.Message)
}

// TestPolicyHostileTokens tries the shipped policies on the real API server with tokens of the
// agent's ServiceAccount (the shipped RBAC, policies and eviction guard; boundAgents' nodes and
// pods): a legacy Secret token, and the token of node A's agent against the fields of a pod's
// status and of its node's spec.
func TestPolicyHostileTokens(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "hostile", "reprieve-hostile", "hostile-a", "hostile-b"
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	startEvictionGuard(ctx, t, sa, ns)
	t.Run("LegacyTokenRefusedWith403", func(t *testing.T) { legacyTokenRefusedWith403(ctx, t, ns, sa, nodeA) })
	t.Run("PodStatusAndNodeSpecPinned", func(t *testing.T) { podStatusAndNodeSpecPinned(ctx, t, ns, nodeA, clientFor(t, kubeA)) })
}

// legacyTokenRefusedWith403 uses a legacy Secret token of the agent's ServiceAccount ns/sa
// (type kubernetes.io/service-account-token, filled in by kube-controller-manager's token
// controller): its user has no userInfo.extra at all, not even an empty map. Every write the
// agent makes on node A is refused with 403 Forbidden and the rule's message, never 422 Invalid
// with "no such key: extra" (a policy that fails to evaluate under failurePolicy Fail): the
// agent counts a 403 as a refused write and turns not ready. The shipped policies but the
// events one (see below) also type-check without a warning.
func legacyTokenRefusedWith403(ctx context.Context, t *testing.T, ns, sa, nodeA string) {
	c := env.Client
	// The token controller fills the Secret in; the policies' status controller type-checks the
	// shipped expressions against the API's schema.
	if err := env.StartControllerManager(ctx, "serviceaccount-token", "validatingadmissionpolicy-status-controller"); err != nil {
		t.Fatal(err)
	}
	defer env.StopControllerManager()
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sa + "-token", Annotations: map[string]string{v1.ServiceAccountNameKey: sa}},
		Type:       v1.SecretTypeServiceAccountToken,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var token string
	waitFor(ctx, t, "the token controller filling the Secret in", func() bool {
		s, err := c.CoreV1().Secrets(ns).Get(ctx, sa+"-token", metav1.GetOptions{})
		if err != nil {
			return false
		}
		token = string(s.Data[v1.ServiceAccountTokenKey])
		return token != ""
	})
	policies, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range policies.Items {
		// Not the events policy: its rule matches events.k8s.io/v1 too (matchPolicy Equivalent
		// converts those requests to v1 Events, which the expressions are written for), and the
		// type check reports v1's fields as missing from events.k8s.io/v1's Event.
		if !strings.HasPrefix(p.Name, sa+"-"+ns+"-") || strings.HasSuffix(p.Name, "-events-bound") {
			continue
		}
		checked++
		var typeCheck *admissionregistrationv1.TypeChecking
		waitFor(ctx, t, "policy "+p.Name+" type-checked", func() bool {
			got, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			typeCheck = got.Status.TypeChecking
			return got.Status.ObservedGeneration == got.Generation && typeCheck != nil
		})
		for _, w := range typeCheck.ExpressionWarnings {
			t.Errorf("policy %s: %s: %s", p.Name, w.FieldRef, w.Warning)
		}
	}
	if checked != 4 {
		t.Errorf("%d shipped policies type-checked; want 4 (node-bound, node-status-bound, pod-delete-bound, eviction-options)", checked)
	}
	env.StopControllerManager()
	legacy, err := kubernetes.NewForConfig(&rest.Config{Host: env.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	// The premise: the agent's identity, and no extra at all.
	review, err := legacy.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != "system:serviceaccount:"+ns+":"+sa || u.Extra != nil {
		t.Fatalf("the legacy token is %q with extra %v; want the agent's ServiceAccount without extra", u.Username, u.Extra)
	}

	victim, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	spot, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": []v1.Taint{{Key: taint.Key, Value: taint.Value, Effect: taint.Effect}}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = legacy.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, spot, metav1.PatchOptions{})
	refusedWith403(t, "tainting the node", err, "this token is bound to no node")
	// What the agent's write check sends at start and every 10 minutes.
	_, err = legacy.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, []byte("{}"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	refusedWith403(t, "the dry-run write check", err, "this token is bound to no node")
	mark, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{
		Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "DeletionByReprieve", Message: "test", LastTransitionTime: metav1.Now()}}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = legacy.CoreV1().Pods(ns).Patch(ctx, victim.Name, types.StrategicMergePatchType, mark, metav1.PatchOptions{}, "status")
	refusedWith403(t, "patching a pod's status", err, "only pods on the node its token is bound to")
	refusedWith403(t, "deleting a pod", legacy.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}),
		"only pods on the node its token is bound to")
	_, err = legacy.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: "reprieve-"},
		InvolvedObject: v1.ObjectReference{Kind: "Node", Name: nodeA, UID: types.UID(nodeA)},
		Reason:         "Test", Message: "from a legacy token", Type: v1.EventTypeNormal,
		Source:         v1.EventSource{Component: "reprieve", Host: nodeA},
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
	}, metav1.CreateOptions{})
	refusedWith403(t, "recording an event", err, "this token is bound to no node")
	// The eviction guard judges this one: its refusal is generic (issue 22 item 3), the reason,
	// no node claim, is in its log.
	refusedWith403(t, "evicting a pod as the agent does", evict(ctx, legacy, ns, victim.Name, ptr64(1), &victim.UID, false),
		"reprieve's eviction guard refused this eviction")
	refusedWith403(t, "evicting a pod with grace 0", evict(ctx, legacy, ns, victim.Name, ptr64(0), &victim.UID, false),
		"gracePeriodSeconds of at least 1")
	if p, err := c.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod after the refused writes: %v; want it untouched", err)
	}
}

// podStatusChanges are, for each field of v1.PodStatus by its JSON name, a change that a stolen
// token might write through pods/status (or a function of the pod that returns it). conditions
// is the one field the agent writes (its reprieve.io/Interruption and DisruptionTarget
// conditions): another condition type is refused.
var podStatusChanges = map[string]any{
	"observedGeneration": 1,
	"phase":              "Failed",
	"conditions":         []map[string]any{{"type": "Ready", "status": "False"}},
	"message":            "stolen",
	"reason":             "Stolen",
	"nominatedNodeName":  "elsewhere",
	"hostIP":             "10.9.9.9",
	// The first of hostIPs and podIPs must be hostIP and podIP (which win over a different
	// first entry): a second address of the other family.
	"hostIPs":   func(p *v1.Pod) any { return []map[string]any{{"ip": p.Status.HostIP}, {"ip": "fd00::9"}} },
	"podIP":     "10.8.8.8",
	"podIPs":    func(p *v1.Pod) any { return []map[string]any{{"ip": p.Status.PodIP}, {"ip": "fd00::8"}} },
	"startTime": "2020-01-01T00:00:00Z",
	"initContainerStatuses": []map[string]any{{"name": "init", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
		"state": map[string]any{"waiting": map[string]any{}}}},
	"containerStatuses": []map[string]any{{"name": "c", "image": "x", "imageID": "", "ready": false, "restartCount": 7,
		"state": map[string]any{"waiting": map[string]any{"reason": "Stolen"}}}},
	"qosClass": "Guaranteed",
	"ephemeralContainerStatuses": []map[string]any{{"name": "debug", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
		"state": map[string]any{"waiting": map[string]any{}}}},
	"resize":                               "Infeasible",
	"resourceClaimStatuses":                []map[string]any{{"name": "claim", "resourceClaimName": "stolen"}},
	"extendedResourceClaimStatus":          map[string]any{"resourceClaimName": "stolen", "requestMappings": []map[string]any{{"containerName": "c", "resourceName": "example.com/gpu", "requestName": "r"}}},
	"allocatedResources":                   map[string]any{"cpu": "64"},
	"resources":                            map[string]any{"requests": map[string]any{"cpu": "64"}, "limits": map[string]any{"cpu": "64"}},
	"nodeAllocatableResourceClaimStatuses": []map[string]any{{"resourceClaimName": "stolen", "containers": []string{"c"}}},
	"volumeHealth":                         []map[string]any{{"name": "v", "healthConditions": []map[string]any{{"status": "Degraded", "reason": "Stolen"}}}},
}

// nodeSpecChanges are, for each field of v1.NodeSpec by its JSON name except taints (the agent's
// own, tested in TestAdmissionPolicyBindsTheAgentToItsNode), a change a stolen token might
// write on its own node.
var nodeSpecChanges = map[string]any{
	"podCIDR":             "10.77.0.0/24",
	"podCIDRs":            []string{"10.77.0.0/24"},
	"providerID":          "kwok://stolen",
	"unschedulable":       true,
	"configSource":        map[string]any{"configMap": map[string]any{"namespace": "kube-system", "name": "x", "kubeletConfigKey": "kubelet"}},
	"externalID":          "stolen",
	"podPreemptionPolicy": map[string]any{"disableResizePreemption": []string{"example.com/stolen"}},
}

// jsonFields are the JSON names of the fields of struct type typ.
func jsonFields(typ reflect.Type) []string {
	var names []string
	for i := range typ.NumField() {
		if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// podStatusAndNodeSpecPinned tries, with clientA (the token of node A's agent) on pods of node
// A and on node A itself, to change every field of a pod's status and of the node's spec. For
// each change it first asks the API server, as the admin with a server-side dry run, whether the
// change survives the API server's own validation and field dropping (a field of a feature
// gate that is off is dropped before admission, an immutable one is refused): the changes that
// reach admission must be refused to the agent's token with 403 and the policy's message. The
// fields that upstream serves by default must be among those. The agent's own status write,
// its warning with DisruptionTarget, still passes.
func podStatusAndNodeSpecPinned(ctx context.Context, t *testing.T, ns, nodeA string, clientA kubernetes.Interface) {
	c := env.Client
	for _, tc := range []struct {
		typ     reflect.Type
		changes map[string]any
		skip    []string
	}{{reflect.TypeFor[v1.PodStatus](), podStatusChanges, nil}, {reflect.TypeFor[v1.NodeSpec](), nodeSpecChanges, []string{"taints"}}} {
		fields := slices.DeleteFunc(jsonFields(tc.typ), func(f string) bool { return slices.Contains(tc.skip, f) })
		slices.Sort(fields)
		if got := slices.Sorted(maps.Keys(tc.changes)); !slices.Equal(got, fields) {
			t.Fatalf("the changes tried on %s are for %v; want one for each field %v", tc.typ, got, fields)
		}
	}
	// The changes go to victim-<nodeA>, running, but those of the claims' status fields to a
	// pod of node A with an extended resource and a ResourceClaim, so that they name what the
	// API server's validation wants (it need not run: kwok takes seconds).
	gpu := v1.ResourceList{"example.com/gpu": resource.MustParse("1")}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "claims", Namespace: ns},
		Spec: v1.PodSpec{NodeName: nodeA, AutomountServiceAccountToken: new(bool),
			Containers:     []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Requests: gpu, Limits: gpu}}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "claim", ResourceClaimName: new("stolen")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	get := func(podName string) (pod *v1.Pod, node *v1.Node) {
		t.Helper()
		pod, err := c.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node, err = c.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod, node
	}

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	// try sets part.field (status.phase of the pod, spec.unschedulable of node A) with a
	// merge patch: as the admin, then with A's token, both as dry runs (nothing is stored either
	// way). It returns whether the change reached admission.
	try := func(part, field string, value any, want string) bool {
		t.Helper()
		podName := "victim-" + nodeA
		if strings.Contains(strings.ToLower(field), "resourceclaimstatus") {
			podName = "claims"
		}
		pod, node := get(podName)
		if f, ok := value.(func(*v1.Pod) any); ok {
			value = f(pod)
		}
		b, err := json.Marshal(map[string]any{part: map[string]any{field: value}})
		if err != nil {
			t.Fatal(err)
		}
		patch := func(cl kubernetes.Interface) (before, after any, err error) {
			if part == "status" {
				p, err := cl.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, b, dry, "status")
				return pod, p, err
			}
			n, err := cl.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, b, dry)
			return node, n, err
		}
		before, after, err := patch(c)
		if err != nil {
			t.Logf("%s.%s: the API server itself refuses it: %v", part, field, err)
			return false
		}
		if fieldJSON(t, before, part, field) == fieldJSON(t, after, part, field) {
			t.Logf("%s.%s: the API server drops it before admission (its feature gate is off, or the field is retired)", part, field)
			return false
		}
		_, _, err = patch(clientA)
		refusedWith403(t, part+"."+field+" with node A's token", err, want)
		return true
	}
	var reached []string
	for _, f := range jsonFields(reflect.TypeFor[v1.PodStatus]()) {
		want := "reprieve may change no field of a pod's status but its conditions"
		if f == "conditions" {
			want = "only the reprieve.io/Interruption and DisruptionTarget conditions"
		}
		if try("status", f, podStatusChanges[f], want) {
			reached = append(reached, "status."+f)
		}
	}
	for _, f := range jsonFields(reflect.TypeFor[v1.NodeSpec]()) {
		if f != "taints" && try("spec", f, nodeSpecChanges[f], "spec other than taints") {
			reached = append(reached, "spec."+f)
		}
	}
	// Served by default in Kubernetes 1.37: these reach admission, the ones the policy did not
	// list before among them. Some are served by default only from a later minor than the
	// chart's oldest (the version matrix runs this on 1.30 and 1.33): before it their feature
	// gate is off by default and the API server drops them before admission
	// (pkg/features/kube_features.go of each version).
	servedSince := map[string]int{ // field: the first 1.x whose default serves it (0: 1.30 or earlier)
		"status.observedGeneration":          34, // PodObservedGenerationTracking beta in 1.34
		"status.resourceClaimStatuses":       34, // DynamicResourceAllocation GA in 1.34
		"status.extendedResourceClaimStatus": 36, // DRAExtendedResource beta in 1.36
		"status.allocatedResources":          36, // the pod's own: InPlacePodLevelResourcesVerticalScaling beta in 1.36 (no such field before 1.35)
		"status.resources":                   36, // the same
	}
	for _, f := range []string{"status.observedGeneration", "status.phase", "status.conditions", "status.hostIPs", "status.podIPs",
		"status.containerStatuses", "status.resize", "status.resourceClaimStatuses", "status.extendedResourceClaimStatus",
		"status.allocatedResources", "status.resources", "spec.unschedulable", "spec.podCIDR", "spec.providerID"} {
		if minor := servedSince[f]; !env.Version().AtLeast(1, minor) {
			t.Logf("%s: not served by default before 1.%d; kube-apiserver is %s", f, minor, env.Version())
			continue
		}
		if !slices.Contains(reached, f) {
			t.Errorf("the change of %s did not reach admission (reached: %v); the test no longer tries what it says", f, reached)
		}
	}

	// The agent's own writes: its warning (condition and annotations in one patch) and
	// DisruptionTarget.
	now := time.Now().UTC().Format(time.RFC3339)
	b, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{record.AnnotationEvictAt: "2030-01-01T00:00:00Z", record.AnnotationReclaimDeadline: "2030-01-01T00:01:00Z"}},
		"status": map[string]any{"conditions": []map[string]any{
			{"type": string(record.PodConditionInterruption), "status": "True", "reason": "Test", "message": "test", "lastTransitionTime": now},
			{"type": string(v1.DisruptionTarget), "status": "True", "reason": "DeletionByReprieve", "message": "test", "lastTransitionTime": now},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clientA.CoreV1().Pods(ns).Patch(ctx, "victim-"+nodeA, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the agent's warning and DisruptionTarget on a pod of node A: %v; want it allowed", err)
	}
}

// fieldJSON is obj's part.field (status.phase) as JSON, "" when absent.
func fieldJSON(t *testing.T, obj any, part, field string) string {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(top[part], &m); err != nil {
		t.Fatal(err)
	}
	return string(m[field])
}

// TestHostPathMountsStoredRecursiveReadOnly creates, as server-side dry runs on the real API server,
// each shipped DaemonSet and the chart's render with the kubelet's config outside its root (one
// more hostPath mount): the API server keeps recursiveReadOnly IfPossible on every hostPath
// mount, each read-only with no mount propagation, as the kubelet requires for it. A 1.30 API
// server, where the RecursiveReadOnlyMounts gate is alpha and off by default (beta, on, from
// 1.31: pkg/features/kube_features.go), drops the field, as docs/install.md says; the version
// matrix (make test-versions) checks that on 1.30 too.
func TestHostPathMountsStoredRecursiveReadOnly(t *testing.T) {
	t.Parallel()
	// dropDisabledFields (pkg/api/pod/util.go) clears recursiveReadOnly while the gate is off.
	kept := env.Version().AtLeast(1, 31)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sets := map[string]*appsv1.DaemonSet{}
	for _, f := range []string{"daemonset.yaml", "daemonset-gcp.yaml", "daemonset-azure.yaml"} {
		var ds appsv1.DaemonSet
		if err := yaml.UnmarshalStrict(readRepoFile(t, "deploy", "manifests", f), &ds); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		sets[f] = &ds
	}
	sets["kubeletConfig outside the root"], _ = renderDaemonSet(t, "render", "--set", "pressure.kubeletConfig=/etc/kubernetes/kubelet.yaml")
	for name, ds := range sets {
		ds.Namespace = metav1.NamespaceSystem
		stored, err := env.Client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		spec := stored.Spec.Template.Spec
		host := map[string]string{}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				host[v.Name] = v.HostPath.Path
			}
		}
		var mounted []string
		// The init container's mounts too: on AKS it copies the kubelet's two files from
		// /etc/default (reprieve copy-kubelet-files), read-only like every host path.
		var mounts []v1.VolumeMount
		for _, c := range append(spec.InitContainers, spec.Containers[0]) {
			mounts = append(mounts, c.VolumeMounts...)
		}
		for _, m := range mounts {
			if host[m.Name] == "" {
				continue
			}
			mounted = append(mounted, host[m.Name])
			if !m.ReadOnly || (m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone) {
				t.Errorf("%s: %s stored with readOnly %v, propagation %v; want read-only, None", name, host[m.Name], m.ReadOnly, m.MountPropagation)
			}
			switch {
			case kept && (m.RecursiveReadOnly == nil || *m.RecursiveReadOnly != v1.RecursiveReadOnlyIfPossible):
				t.Errorf("%s: %s stored with recursiveReadOnly %v; want IfPossible", name, host[m.Name], m.RecursiveReadOnly)
			case !kept && m.RecursiveReadOnly != nil:
				t.Errorf("%s: %s stored with recursiveReadOnly %v by kube-apiserver %s; want it dropped (the gate is off there)",
					name, host[m.Name], *m.RecursiveReadOnly, env.Version())
			}
		}
		if len(mounted) != len(host) || (name == "kubeletConfig outside the root") != slices.Contains(mounted, "/etc/kubernetes/kubelet.yaml") {
			t.Errorf("%s: host paths mounted %v of %v", name, mounted, host)
		}
	}
}
