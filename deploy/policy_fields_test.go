package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const policyPath = "manifests/admission-policy.yaml"

// podStatusRefused are the fields of v1.PodStatus that the agent's token may not change through
// pods/status, each with why: every field but the conditions (the agent writes its
// reprieve.io/Interruption and DisruptionTarget conditions, and the policy keeps the others). A
// field that a later k8s.io/api adds fails TestPolicyFieldAllowlists until it is put here or in
// the policy's statusMayChange.
var podStatusRefused = map[string]string{
	"observedGeneration":                   "tells controllers which spec the kubelet has acted on",
	"phase":                                "Failed or Succeeded ends a pod for its controller and the garbage collector",
	"message":                              "the kubelet's explanation, read by people and tools",
	"reason":                               "the kubelet's (Evicted, NodeLost)",
	"nominatedNodeName":                    "the scheduler's preemption target",
	"hostIP":                               "Services and the notice endpoint match pods by their IPs",
	"hostIPs":                              "same",
	"podIP":                                "same: a forged IP would route a Service's traffic",
	"podIPs":                               "same",
	"startTime":                            "the kubelet's; controllers sort by it",
	"initContainerStatuses":                "readiness and restarts the kubelet reports",
	"containerStatuses":                    "same: ready containers put a pod behind its Services",
	"qosClass":                             "set at creation; the kubelet's eviction order",
	"ephemeralContainerStatuses":           "the kubelet's",
	"resize":                               "the kubelet's answer to an in-place resize",
	"resourceClaimStatuses":                "which ResourceClaims the pod uses (DRA)",
	"extendedResourceClaimStatus":          "the claim backing the pod's extended resources (DRA)",
	"allocatedResources":                   "feeds the scheduler's fit check (pod-level resources)",
	"resources":                            "same: what the kubelet has applied",
	"nodeAllocatableResourceClaimStatuses": "node resources allocated through DRA claims",
	"volumeHealth":                         "the kubelet's report of the pod's volumes",
}

// nodeSpecRefused are the fields of v1.NodeSpec that the agent's token may not change on its
// own node, each with why: every field but the taints (the policy limits those to reprieve's
// own keys). A field that a later k8s.io/api adds fails TestPolicyFieldAllowlists until it is
// put here or in the policy's specMayChange.
var nodeSpecRefused = map[string]string{
	"podCIDR":             "the pod network's range, settable once",
	"podCIDRs":            "same",
	"providerID":          "the cloud's instance, settable once; the node's controllers act on it",
	"unschedulable":       "cordoning is the operator's or the drain tool's",
	"configSource":        "the kubelet's configuration (removed feature)",
	"externalID":          "deprecated",
	"podPreemptionPolicy": "the node's preemption rules for in-place resizes",
}

// nodeStatusRefused are the fields of v1.NodeStatus that the agent's token may not change on
// its own node through nodes/status, each with why: every field but the conditions (the agent
// writes reprieve.io/Interruption and, with --lifecycle-conditions, MaintenancePlanned,
// DrainInProgress and Drained; the policy keeps the others). A field that a later k8s.io/api
// adds fails TestPolicyFieldAllowlists until it is put here or in the policy's statusMayChange.
var nodeStatusRefused = map[string]string{
	"capacity":         "the scheduler fits pods on it",
	"allocatable":      "same: a forged figure would draw or starve pods",
	"phase":            "deprecated, the node controller's",
	"addresses":        "Services, the API server's kubelet connections and certificates use them",
	"daemonEndpoints":  "the kubelet's port, where the API server sends exec, logs and port-forward",
	"nodeInfo":         "the kubelet's versions and IDs, read by upgrades and inventory",
	"images":           "the scheduler's image locality score",
	"volumesInUse":     "the attach-detach controller waits on it before detaching",
	"volumesAttached":  "the attach-detach controller's record",
	"config":           "the kubelet's dynamic configuration (removed feature)",
	"runtimeHandlers":  "the RuntimeClasses the node can run; the scheduler reads them",
	"features":         "the kubelet's supported features (supplemental groups policy)",
	"declaredFeatures": "the kubelet's declared features, matched by the scheduler",
}

// shippedPolicy returns the policy named name from the rendered admission-policy.yaml.
func shippedPolicy(t *testing.T, name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	data, err := os.ReadFile(policyPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			var kind struct{ Kind string }
			if yaml.Unmarshal(doc, &kind) == nil && kind.Kind != "ValidatingAdmissionPolicy" {
				continue
			}
			t.Fatalf("parsing %s: %v", policyPath, err)
		}
		if p.Kind == "ValidatingAdmissionPolicy" && p.Name == name {
			return &p
		}
	}
	t.Fatalf("%s has no ValidatingAdmissionPolicy %s", policyPath, name)
	return nil
}

// stringList parses a CEL list of single-quoted strings (['a', 'b']).
func stringList(t *testing.T, expr string) []string {
	t.Helper()
	expr = strings.TrimSpace(expr)
	if !regexp.MustCompile(`^\[\s*('[^'\\]*'\s*(,\s*'[^'\\]*'\s*)*)?\]$`).MatchString(expr) {
		t.Fatalf("%q is not a CEL list of plain strings", expr)
	}
	var out []string
	for _, m := range regexp.MustCompile(`'([^']*)'`).FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestPolicyFieldAllowlists pins what the agent's token may change in a pod's status and in its
// node's spec and status as allowlists in the shipped policies (statusMayChange, specMayChange), applied to
// every key of the object (a rule compares all the others with their old values), and walks
// v1.PodStatus, v1.NodeSpec and v1.NodeStatus field by field: each field is either allowed by the policy or
// refused here on purpose, never neither (a field of a later API) nor both. The policies'
// behaviour is tried on the real API server (test/e2e/policy_hostile_test.go).
func TestPolicyFieldAllowlists(t *testing.T) {
	for _, tc := range []struct {
		policy, variable, part string
		typ                    reflect.Type
		refused                map[string]string
		want                   []string
	}{
		{"reprieve-pod-delete-bound", "statusMayChange", "status", reflect.TypeFor[v1.PodStatus](), podStatusRefused, []string{"conditions"}},
		{"reprieve-node-bound", "specMayChange", "spec", reflect.TypeFor[v1.NodeSpec](), nodeSpecRefused, []string{"taints"}},
		{"reprieve-node-status-bound", "statusMayChange", "status", reflect.TypeFor[v1.NodeStatus](), nodeStatusRefused, []string{"conditions"}},
	} {
		t.Run(tc.typ.Name(), func(t *testing.T) {
			p := shippedPolicy(t, tc.policy)
			var allowed []string
			for _, v := range p.Spec.Variables {
				if v.Name == tc.variable {
					allowed = stringList(t, v.Expression)
				}
			}
			if allowed == nil {
				t.Fatalf("%s has no variable %s", tc.policy, tc.variable)
			}
			if !slices.Equal(allowed, tc.want) {
				t.Errorf("%s.%s allows %v to change; want %v (widen this test only with a reason)", tc.policy, tc.variable, allowed, tc.want)
			}
			// The allowlist governs every key of the object's part as a map: new keys, changed
			// keys and removed keys.
			part := strings.ToUpper(tc.part[:1]) + tc.part[1:]
			for _, v := range []struct{ name, want string }{
				{"new" + part, "dyn(object).?" + tc.part + ".orValue({})"},
				{"old" + part, "dyn(oldObject).?" + tc.part + ".orValue({})"},
			} {
				i := slices.IndexFunc(p.Spec.Variables, func(pv admissionregistrationv1.Variable) bool { return pv.Name == v.name })
				if i < 0 || strings.TrimSpace(p.Spec.Variables[i].Expression) != v.want {
					t.Errorf("%s: want variable %s = %s", tc.policy, v.name, v.want)
				}
			}
			obj, old, may := "variables.new"+part, "variables.old"+part, "variables."+tc.variable
			rule := obj + ".all(k, k in " + may + " || (k in " + old + " && " + obj + "[k] == " + old + "[k]))" +
				" && " + old + ".all(k, k in " + may + " || k in " + obj + ")"
			found := false
			for _, v := range p.Spec.Validations {
				found = found || strings.Contains(strings.Join(strings.Fields(v.Expression), " "), rule)
			}
			if !found {
				t.Errorf("no validation of %s applies %s to every key of the %s:\n%s", tc.policy, tc.variable, tc.part, rule)
			}

			fields := map[string]bool{}
			for i := range tc.typ.NumField() {
				name, _, _ := strings.Cut(tc.typ.Field(i).Tag.Get("json"), ",")
				fields[name] = true
				switch ok, no := slices.Contains(allowed, name), tc.refused[name] != ""; {
				case !ok && !no:
					t.Errorf("%s.%s (%s) is neither allowed by %s nor refused in this test: decide whether the agent's token may change it", tc.typ, name, tc.typ.Field(i).Name, tc.policy)
				case ok && no:
					t.Errorf("%s.%s is both allowed by %s and refused in this test", tc.typ, name, tc.policy)
				}
			}
			for name := range tc.refused {
				if !fields[name] {
					t.Errorf("%q is refused in this test but is no field of %s", name, tc.typ)
				}
			}
			for _, name := range allowed {
				if !fields[name] {
					t.Errorf("%s.%s allows %q, which is no field of %s", tc.policy, tc.variable, name, tc.typ)
				}
			}
		})
	}
}

// TestPolicyExtraIsOptional: the node claim is read from request.userInfo.extra with optional
// selection in every shipped policy, so that a token without extra (a legacy Secret token)
// gets the policy's 403 rather than an evaluation error (422 "no such key: extra"). Selecting
// extra plainly anywhere fails.
func TestPolicyExtraIsOptional(t *testing.T) {
	data, err := os.ReadFile(policyPath)
	if err != nil {
		t.Fatal(err)
	}
	if plain := regexp.MustCompile(`userInfo\.extra\b`).FindAll(data, -1); len(plain) > 0 {
		t.Errorf("%s selects request.userInfo.extra %d times without ?: a token without extra fails the policy instead of being refused", policyPath, len(plain))
	}
	if n := bytes.Count(data, []byte("request.userInfo.?extra[?'authentication.kubernetes.io/node-name'].orValue([])")); n != 4 {
		t.Errorf("%s reads the node claim optionally %d times; want once in each of the four policies that bind to it", policyPath, n)
	}
}

// TestHostPathMountsRecursiveReadOnly checks the shipped DaemonSets: every hostPath volume is
// mounted read-only, recursively where the runtime can (recursiveReadOnly IfPossible, which
// needs mount propagation None).
func TestHostPathMountsRecursiveReadOnly(t *testing.T) {
	files, err := filepath.Glob("manifests/daemonset*.yaml")
	if err != nil || len(files) != 3 {
		t.Fatalf("the shipped DaemonSets: %v %v; want three", files, err)
	}
	for _, f := range files {
		var ds appsv1.DaemonSet
		readYAML(t, f, &ds)
		spec := ds.Spec.Template.Spec
		host := map[string]bool{}
		for _, v := range spec.Volumes {
			host[v.Name] = v.HostPath != nil
		}
		n := 0
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, m := range c.VolumeMounts {
				if !host[m.Name] {
					continue
				}
				n++
				if !m.ReadOnly || m.RecursiveReadOnly == nil || *m.RecursiveReadOnly != v1.RecursiveReadOnlyIfPossible ||
					(m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone) {
					t.Errorf("%s: host path volume %s mounted readOnly %v, recursiveReadOnly %v, propagation %v; want read-only, IfPossible, None",
						f, m.Name, m.ReadOnly, m.RecursiveReadOnly, m.MountPropagation)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s mounts no host path; the test checks nothing", f)
		}
	}
}
