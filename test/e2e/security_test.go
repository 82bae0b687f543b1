package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestAgentTokenAttacks takes the token of node A's agent (a real ServiceAccount token bound to
// the agent's pod on A, so with the node claim), and with the shipped RBAC, the shipped admission
// policies and the eviction guard on the real API server tries what a thief of that token would:
// each attempt is refused with the status and message that name the rule, while the same
// actions on A pass. Then the same identity with a token bound to no pod (no node claim):
// `reprieve doctor` fails naming the claim, and the agent turns not ready.
func TestAgentTokenAttacks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "attack", "reprieve-attack", "attack-a", "attack-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, c, ns, nodeA, taint, []scenario.Pod{
		{Name: "evictee-" + nodeA, Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db-password"},
		StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clientA := clientFor(t, kubeA)
	startEvictionGuard(ctx, t, sa, ns)
	pod := func(name string) *v1.Pod {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want 403 Forbidden naming %q", what, err, want)
		} else {
			t.Logf("refused as expected: %s: %v", what, err)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v; want it allowed", what, err)
		}
	}
	patch := func(node string, p map[string]any) error {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = clientA.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	event := func(involved v1.ObjectReference, host, component string) error {
		ev := &v1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "reprieve-", Namespace: involved.Namespace},
			InvolvedObject: involved, Reason: "Test", Message: "from the agent's token", Type: v1.EventTypeNormal,
			Source:         v1.EventSource{Component: component, Host: host},
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
			ReportingController: component, ReportingInstance: host,
		}
		if ev.Namespace == "" {
			ev.Namespace = metav1.NamespaceDefault
		}
		_, err := clientA.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		return err
	}
	nodeRef := func(n string) v1.ObjectReference { return v1.ObjectReference{Kind: "Node", Name: n, UID: types.UID(n)} }
	podRef := func(p *v1.Pod) v1.ObjectReference {
		return v1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	}
	victimB, victimA, evicteeA := pod("victim-"+nodeB), pod("victim-"+nodeA), pod("evictee-"+nodeA)
	spot := v1.Taint{Key: taint.Key, Value: taint.Value, Effect: taint.Effect, TimeAdded: &metav1.Time{Time: time.Now().Truncate(time.Second)}}

	// The attacks.
	denied("patch node B", patch(nodeB, map[string]any{"spec": map[string]any{"taints": []v1.Taint{spot}}}),
		"bound to ("+nodeA+"), not "+nodeB)
	// The guard's refusal tells the caller nothing (issue 22 item 3); its log names the reason.
	denied("evict a pod on node B", evict(ctx, clientA, ns, victimB.Name, ptr64(30), &victimB.UID, false),
		"reprieve's eviction guard refused this eviction")
	if log := guardLogText(t, sa, ns); !strings.Contains(log, "is on "+nodeB) {
		t.Errorf("the guard's log does not say the pod is on %s", nodeB)
	}
	denied("evict a pod on node A with grace 0", evict(ctx, clientA, ns, victimA.Name, ptr64(0), &victimA.UID, false),
		"gracePeriodSeconds of at least 1")
	denied("evict a pod on node A without a UID precondition", evict(ctx, clientA, ns, victimA.Name, ptr64(30), nil, false),
		"UID precondition")
	denied("DELETE a pod on node B", clientA.CoreV1().Pods(ns).Delete(ctx, victimB.Name, metav1.DeleteOptions{}),
		"only pods on the node its token is bound to")
	denied("create an event about node B", event(nodeRef(nodeB), nodeA, "reprieve"), "only about its own node ("+nodeA+")")
	denied("create an event about node A as the kubelet", event(nodeRef(nodeA), nodeA, "kubelet"), "name reprieve as their source")
	denied("create an event about node A reported from node B", event(nodeRef(nodeA), nodeB, "reprieve"), "the token's node as their host")
	denied("create an event about a Secret", event(v1.ObjectReference{Kind: "Secret", Namespace: ns, Name: "db-password"}, nodeA, "reprieve"),
		"or about pods")
	_, err := clientA.CoreV1().Secrets(ns).Get(ctx, "db-password", metav1.GetOptions{})
	denied("read a Secret", err, `cannot get resource "secrets"`)
	_, err = clientA.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	denied("list Secrets", err, `cannot list resource "secrets"`)
	// A claim and its volume (issue 40): the agent reads one of each by name during a window,
	// and nothing else of them: no list or watch to find the others, no write.
	claim, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-db-0"},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, StorageClassName: new(string),
			VolumeName: "attack-pv", Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The volume's driver, as the EBS chart ships it (a CSIDriver is cluster-wide: the first
	// test to make it keeps it).
	if _, err := c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "ebs.csi.aws.com"},
		Spec: storagev1.CSIDriverSpec{AttachRequired: new(true)}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "attack-pv"},
		Spec: v1.PersistentVolumeSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-0attack"}},
			ClaimRef:               &v1.ObjectReference{Namespace: ns, Name: claim.Name, UID: claim.UID}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.CoreV1().PersistentVolumes().Delete(context.Background(), "attack-pv", metav1.DeleteOptions{})
	}()
	_, err = clientA.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	denied("list PersistentVolumeClaims", err, `cannot list resource "persistentvolumeclaims"`)
	_, err = clientA.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	denied("watch PersistentVolumeClaims", err, `cannot watch resource "persistentvolumeclaims"`)
	denied("delete a PersistentVolumeClaim", clientA.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}),
		`cannot delete resource "persistentvolumeclaims"`)
	_, err = clientA.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	denied("list PersistentVolumes", err, `cannot list resource "persistentvolumes"`)
	_, err = clientA.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{})
	denied("list CSIDrivers", err, `cannot list resource "csidrivers"`)
	denied("delete a CSIDriver", clientA.StorageV1().CSIDrivers().Delete(ctx, "ebs.csi.aws.com", metav1.DeleteOptions{}),
		`cannot delete resource "csidrivers"`)
	_, err = clientA.CoreV1().PersistentVolumes().Patch(ctx, "attack-pv", types.MergePatchType,
		[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`), metav1.PatchOptions{})
	denied("patch a PersistentVolume's reclaim policy", err, `cannot patch resource "persistentvolumes"`)
	_, err = clientA.CoreV1().Pods(ns).Create(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "planted"},
		Spec: v1.PodSpec{NodeName: nodeA, Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	denied("create a pod", err, `cannot create resource "pods"`)
	for _, p := range []*v1.Pod{victimB, victimA} {
		if got := pod(p.Name); got.DeletionTimestamp != nil {
			t.Errorf("pod %s is terminating after the refused attempts", p.Name)
		}
	}

	// The agent's own work on node A passes.
	n, err := c.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allowed("taint node A", patch(nodeA, map[string]any{"spec": map[string]any{"taints": append(n.Spec.Taints, spot)}}))
	allowed("a reprieve.io/ annotation on node A", patch(nodeA, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"reprieve.io/test": "y"}}}))
	allowed("an event about node A", event(nodeRef(nodeA), nodeA, "reprieve"))
	allowed("an event about a pod", event(podRef(victimA), nodeA, "reprieve"))
	// What the agent reads of a pod's volumes, through its own reader (volumes.ReadPod).
	withClaim := victimA.DeepCopy()
	withClaim.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}}}
	vols, err := volumes.ReadPod(ctx, kubetest.Wrap(clientA), withClaim)
	allowed("get a pod's claim and its volume", err)
	_, err = clientA.StorageV1().CSIDrivers().Get(ctx, "ebs.csi.aws.com", metav1.GetOptions{})
	allowed("get the volume's CSIDriver", err)
	if want := []v1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-0attack"}; !slices.Equal(vols.Attach, want) {
		t.Errorf("the pod's volumes read with the agent's token: %v, want %v", vols.Attach, want)
	}

	// Updates (the recorder patches repeated events): its own events, never another
	// component's, not even restamped as reprieve's.
	kubeletEvent, err := c.CoreV1().Events(ns).Create(ctx, &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: "kubelet-"},
		InvolvedObject: podRef(victimB), Reason: "Killing", Message: "Stopping container", Type: v1.EventTypeNormal,
		Source: v1.EventSource{Component: "kubelet", Host: nodeB}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restamp, err := json.Marshal(map[string]any{"message": "nothing happened", "source": map[string]any{"component": "reprieve", "host": nodeA},
		"reportingComponent": "reprieve", "reportingInstance": nodeA})
	if err != nil {
		t.Fatal(err)
	}
	_, err = clientA.CoreV1().Events(ns).Patch(ctx, kubeletEvent.Name, types.MergePatchType, restamp, metav1.PatchOptions{})
	denied("rewrite the kubelet's event as reprieve's", err, "update only the events its agent on this node recorded")
	own, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "source=reprieve"})
	if err != nil || len(own.Items) == 0 {
		t.Fatalf("listing the agent's own events: %v (%d)", err, len(own.Items))
	}
	_, err = clientA.CoreV1().Events(ns).Patch(ctx, own.Items[0].Name, types.MergePatchType, []byte(`{"count": 2}`), metav1.PatchOptions{})
	allowed("count a repeat of its own event", err)
	allowed("evict a pod on node A with grace 1 s and its UID", evict(ctx, clientA, ns, evicteeA.Name, ptr64(1), &evicteeA.UID, false))
	allowed("DELETE a pod on node A", clientA.CoreV1().Pods(ns).Delete(ctx, victimA.Name, metav1.DeleteOptions{}))

	// Without the node claim: a token of the same ServiceAccount bound to no pod.
	unboundKube, err := env.ServiceAccountKubeconfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, reprieveBin, "doctor", "--kubeconfig="+unboundKube, "--node="+nodeA, "--provider=none", "--pressure-source=off")
	cmd.Env = append(os.Environ(), "NODE_NAME=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("reprieve doctor without the node claim: %v; want exit 1\n%s", err, out)
	}
	for _, want := range []string{"WARN  the token has no node claim", "FAIL  patching node " + nodeA + " (dry run)", "ServiceAccountTokenPodNodeInfo"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("reprieve doctor without the node claim lacks %q:\n%s", want, out)
		}
	}
	cmd = exec.CommandContext(ctx, reprieveBin, "doctor", "--kubeconfig="+kubeA, "--node="+nodeA, "--provider=none", "--pressure-source=off",
		"--kubelet-config="+kubeletConfigFile(t))
	cmd.Env = append(os.Environ(), "NODE_NAME=", "POD_NAME=agent-"+nodeA)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "ok    token bound to node "+nodeA) ||
		!strings.Contains(string(out), "may be evicted (server-side dry run)") {
		t.Errorf("reprieve doctor with A's token: %v; want every check passing, the claim and the dry-run eviction\n%s", err, out)
	}

	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+unboundKube, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	var why string
	waitFor(ctx, t, "the agent without the node claim not ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b := make([]byte, 512)
		n, _ := resp.Body.Read(b)
		why = string(b[:n])
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if !strings.Contains(why, "node writes refused in a row") {
		t.Errorf("/readyz: %q; want the refused writes named", why)
	}
	metrics, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	var inARow, refused float64
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, "reprieve_node_write_refusals_in_a_row "); ok {
			inARow, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(l, "reprieve_node_writes_refused_total "); ok {
			refused, _ = strconv.ParseFloat(v, 64)
		}
	}
	if inARow < 3 || refused < inARow {
		t.Errorf("refusals in a row %v, in all %v; want at least 3 (--node-write-refusals):\n%s", inARow, refused, grepLines(metrics, "reprieve_node_"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
