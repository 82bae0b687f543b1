package realnode

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// daemonSetCase is the memory case with the hog a real DaemonSet's pod (issue 37 case 2): a log
// agent leaking far past its 200Mi request, of a priority above the web pod's, beside that web
// pod within its request. The kubelet ranks a DaemonSet's pod like any other, and ranks by usage
// above the request before priority (rankMemoryPressure): the leak first. reprieve's host source
// must see the same from the pods' cgroups; by priority alone it would pick the web pod.
var daemonSetCase = func() pressureCase {
	c := memoryCase
	c.daemonSet, c.hogOutranks, c.hogRequest, c.prefix, c.figures = true, true, "200Mi", "daemonset", "memory.available-daemonset"
	// It runs until it is killed, so that its SIGTERM to its end is the grace it was given.
	c.keepOnTerm = true
	c.title = "a DaemonSet's pod leaking past its request"
	return c
}()

// A leaking DaemonSet pod against the real kubelet, with and without reprieve (issue 37 case 2;
// and the host source ranking with per-pod usage where priority alone would pick wrongly). The
// kubelet's evictionHard memory.available goes 900 MiB under the machine's; the DaemonSet's pod
// allocates 50 MiB a second up to 2000 MiB. Without reprieve the kubelet evicts it at its hard
// threshold; with reprieve (its threshold 600 MiB above), reprieve taints the node and evicts that
// same pod through the Eviction API with its own 3 s grace (or what fits before the kubelet's
// threshold, when the trend steepens between two readings), the kubelet never reaches its
// threshold, the web pod stays, and the DaemonSet's controller puts no new pod on the node while
// reprieve's taint is there.
func TestDaemonSetLeakOnRealNode(t *testing.T) {
	testPressure(t, daemonSetCase)
}

// runDaemonSet runs pod's spec as the template of a DaemonSet named after it on the real node,
// as a user's log agent would run, and returns the name of the pod its controller creates there.
// The pod records under /out/<its name>, so that a pod the controller puts back does not write
// over the first one's moments.
// It returns "" when no pod is there within a minute, which the verdict records with the node's
// taints then.
func runDaemonSet(ctx context.Context, t *verdict, pod *v1.Pod) string {
	t.Helper()
	spec := *pod.Spec.DeepCopy()
	spec.NodeName = "" // the DaemonSet's controller places it (node affinity), the scheduler binds it
	spec.NodeSelector = map[string]string{"type": nodeLabels["type"]}
	ctr := &spec.Containers[0]
	ctr.Env = append(ctr.Env, v1.EnvVar{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	if i := slices.Index(ctr.Args, "-out"); i >= 0 && i+1 < len(ctr.Args) {
		ctr.Args[i+1] = "/out/$(POD_NAME)"
	}
	labels := map[string]string{"app": pod.Name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	// The kubelet registers its node with node.kubernetes.io/not-ready:NoSchedule, which the node
	// lifecycle controller removes once the node is Ready. That controller does not run here, so
	// the taint stays, and a DaemonSet's pod (which tolerates not-ready only as NoExecute) is
	// neither created by its controller nor bound by the scheduler: take it off as that
	// controller would. (The test pods name their node and skip both; the chart's DaemonSet
	// tolerates every taint.)
	clearPressureTaint(ctx, t.T, v1.TaintNodeNotReady)
	if _, err := env.Client.AppsV1().DaemonSets(pod.Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var name string
	t.waitFor(ctx, 60*time.Second, "the DaemonSet's pod on the real node", func() bool {
		list, err := env.Client.CoreV1().Pods(pod.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + pod.Name})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		p := list.Items[0]
		if p.Spec.NodeName != nodeName {
			return false
		}
		if !metav1.IsControlledBy(&p, mustGetDaemonSet(ctx, t.T, pod.Namespace, pod.Name)) {
			t.Fatalf("the pod %s is not the DaemonSet's: owners %v", p.Name, p.OwnerReferences)
		}
		name = p.Name
		return true
	})
	return name
}

func mustGetDaemonSet(ctx context.Context, t *testing.T, ns, name string) *appsv1.DaemonSet {
	t.Helper()
	ds, err := env.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// checkDaemonSet checks what is particular to the DaemonSet's pod: it had the whole grace of the
// eviction (its own, or less when the trend left less before the kubelet's threshold: the
// machine's other work moves its memory too), and with reprieve's NoSchedule taint on the node
// the DaemonSet's controller put no new pod there (the kubelet's own memory-pressure taint is one DaemonSet pods tolerate; without
// reprieve, and with no node lifecycle controller here to write even that, it puts one back).
func checkDaemonSet(ctx context.Context, t *verdict, c pressureCase, ns, name string, withReprieve bool, hogName string, evictGrace int64, evs []pressureEvent) {
	t.Helper()
	at := map[string]time.Duration{}
	for _, e := range evs {
		at[e.what] = e.at
	}
	ran := at[momentGone] - at[momentSIGTERM]
	own := cmp.Or(c.hogGrace, 3)
	if withReprieve {
		t.Logf("with reprieve: evicted with a %d s grace (its own %d s), ran %.2f s after its SIGTERM", evictGrace, own, ran.Seconds())
		if evictGrace < 1 || evictGrace > own {
			t.Errorf("with reprieve: the DaemonSet's pod was evicted with a %d s grace, want its own %d s or what fits before the kubelet's threshold", evictGrace, own)
		}
		// The kubelet gives a container at least 2 s to stop (minimumGracePeriodInSeconds,
		// pkg/kubelet/kuberuntime/kuberuntime_container.go).
		if want := time.Duration(max(evictGrace, 2)) * time.Second; ran < want-500*time.Millisecond || ran > want+1500*time.Millisecond {
			t.Errorf("with reprieve: the DaemonSet's pod ran %.2f s after its SIGTERM, want the eviction's grace of %s", ran.Seconds(), want)
		}
	}
	// The controller reacts within a second to the pod's end; give it a few.
	time.Sleep(3 * time.Second)
	list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=hog"})
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, p := range list.Items {
		if p.Name != hogName {
			others = append(others, p.Name+" ("+string(p.Status.Phase)+")")
		}
	}
	t.Logf("%s: the DaemonSet's pods besides the evicted %s, 3 s after it was gone: %s", name, hogName, strings.Join(others, ", "))
	if withReprieve && len(others) > 0 {
		n, _ := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		t.Errorf("with reprieve: the DaemonSet's controller put %v on the node while reprieve's taint was there (taints %v)", others, n.Spec.Taints)
	}
}
