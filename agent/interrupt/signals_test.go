package interrupt

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

// The spec.providerID of a node of each platform, as each cloud's node controller writes it.
const (
	gkeProviderID = "gce://my-project/us-central1-a/gke-pool-1-abcd"
	aksProviderID = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spot-1-vmss/virtualMachines/3"
	eksProviderID = "aws:///us-east-1a/i-0123456789abcdef0"
)

func TestNodeSignals(t *testing.T) {
	seen := t0.Add(time.Minute)
	first := func(string) time.Time { return seen }
	added := metav1.NewTime(t0)
	hourAgo := metav1.NewTime(seen.Add(-time.Hour))
	inAnHour := t0.Add(time.Hour)
	for _, tc := range []struct {
		name     string
		node     v1.Node
		kind     providers.Kind
		source   string
		deadline time.Time // zero: none
		fromSeen bool
		bad      string
	}{
		// Issue 39 item 5: the label was t0 here, a minute before first seen, and that past time
		// was the deadline; a label ahead of the shortest notice is still the deadline, and a
		// past one has its own case below.
		{name: "GKE scheduled maintenance", node: gkeNode(v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: unix(inAnHour)}}}),
			kind: providers.KindScheduledMaintenance, source: SourceGKEScheduledMaintenance, deadline: inAnHour},
		{name: "GKE scheduled maintenance in the past: the shortest notice from first seen", node: gkeNode(v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: unix(seen.Add(-time.Hour))}}}),
			kind: providers.KindScheduledMaintenance, source: SourceGKEScheduledMaintenance, deadline: seen.Add(60 * time.Second), fromSeen: true},
		{name: "GKE maintenance label that does not parse", node: gkeNode(v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: "tomorrow"}}}), bad: LabelGKEScheduledMaintenance},
		{name: "GKE maintenance ongoing", node: gkeNode(v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEActiveMaintenance: "ONGOING"}}}),
			kind: providers.KindScheduledMaintenance, source: SourceGKEActiveMaintenance, deadline: seen.Add(60 * time.Second), fromSeen: true},
		// Issue 39 item 5: timeAdded (t0) is the writer's; it made the deadline t0 + 30 s, 30 s
		// before this process first saw the taint: due at once. The deadline is first seen + 30 s.
		{name: "GKE impending termination with timeAdded", node: gkeNode(v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule, TimeAdded: &added}}}}),
			kind: providers.KindTermination, source: SourceGKEImpendingTermination, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "GKE impending termination with timeAdded an hour ago", node: gkeNode(v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoExecute, TimeAdded: &hourAgo}}}}),
			kind: providers.KindTermination, source: SourceGKEImpendingTermination, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "GKE impending termination without timeAdded", node: gkeNode(v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule}}}}),
			kind: providers.KindTermination, source: SourceGKEImpendingTermination, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "Karpenter disruption is information only", node: v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintKarpenterDisrupted, Effect: v1.TaintEffectNoSchedule}}}},
			kind: providers.KindMaintenanceInformation, source: SourceKarpenterDisrupted},
		{name: "Karpenter disruption on an EKS node", node: withProviderID(v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintKarpenterDisrupted, Effect: v1.TaintEffectNoSchedule}}}}, eksProviderID),
			kind: providers.KindMaintenanceInformation, source: SourceKarpenterDisrupted},
		// Issue 39 item 5: the message's NotBefore (t0 + 30 s) was the deadline although it had
		// passed when this process first saw the condition. Azure gives a Preempt 30 s.
		{name: "AKS preempt", node: aksNode(v1.ConditionTrue, "Preempt Scheduled: Sun, 29 Nov 2026 12:00:30 GMT. EventId: 6C1D3F5E"),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "AKS preempt ahead of its notice: NotBefore", node: aksNode(v1.ConditionTrue, "Preempt Scheduled: Sun, 29 Nov 2026 12:05:00 GMT. EventId: 6C1D3F5E"),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: t0.Add(5 * time.Minute)},
		{name: "AKS preempt written an hour ago for an hour ago", node: aksNodeAt(hourAgo, v1.ConditionTrue, "Preempt Scheduled: "+httpDate(hourAgo.Time)),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "AKS reboot", node: aksNode(v1.ConditionTrue, "Reboot Scheduled: Sun, 29 Nov 2026 12:20:00 GMT"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent, deadline: t0.Add(20 * time.Minute)},
		// Issue 39 item 5: was due at once (lastTransitionTime, t0). Azure's shortest notice of a
		// Preempt, 30 s, from first seen.
		{name: "AKS preempt without a time: its notice from first seen", node: aksNode(v1.ConditionTrue, "Preempt Scheduled: soon"),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "AKS terminate in the past: 5 minutes from first seen", node: aksNodeAt(hourAgo, v1.ConditionTrue, "Terminate Scheduled: "+httpDate(hourAgo.Time)),
			kind: providers.KindTermination, source: SourceAKSScheduledEvent, deadline: seen.Add(5 * time.Minute), fromSeen: true},
		// Was lastTransitionTime + 15 minutes: from first seen now.
		{name: "AKS reboot without a time: 15 minutes from first seen", node: aksNodeAt(hourAgo, v1.ConditionTrue, "Reboot Scheduled: soon"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent, deadline: seen.Add(15 * time.Minute), fromSeen: true},
		{name: "AKS redeploy without a time: 10 minutes from first seen", node: aksNode(v1.ConditionTrue, "Redeploy Scheduled: soon"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent, deadline: seen.Add(10 * time.Minute), fromSeen: true},
		{name: "AKS freeze keeps pods off, no deadline", node: aksNode(v1.ConditionTrue, "Freeze Scheduled: Sun, 29 Nov 2026 12:00:30 GMT"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent},
		{name: "AKS condition False raises nothing", node: aksNode(v1.ConditionFalse, "VM has no scheduled event")},
		{name: "AKS message of no known event type", node: aksNode(v1.ConditionTrue, "something else"), bad: ConditionAKSVMEventScheduled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, bad := NodeSignals(&tc.node, first)
			if tc.bad != "" {
				if _, ok := bad[tc.bad]; !ok || len(ns) != 0 {
					t.Fatalf("notices %+v bad %v: want nothing raised and %s reported", ns, bad, tc.bad)
				}
				return
			}
			if tc.kind == "" {
				if len(ns) != 0 {
					t.Fatalf("notices %+v, want none", ns)
				}
				return
			}
			if len(ns) != 1 {
				t.Fatalf("notices %+v, want one", ns)
			}
			n := ns[0]
			if n.Kind != tc.kind || n.Source != tc.source || !n.Deadline.Equal(tc.deadline) || n.FromFirstSeen != tc.fromSeen {
				t.Fatalf("notice %+v: want kind %s source %s deadline %v fromFirstSeen %v", n, tc.kind, tc.source, tc.deadline, tc.fromSeen)
			}
			// Never due before this process first saw the signal, whatever its writer said.
			if !n.Deadline.IsZero() && !n.Deadline.After(seen) {
				t.Errorf("deadline %v, not after first seen %v: the signal is due at once", n.Deadline, seen)
			}
		})
	}
}

// TestNodeSignalsOnlyOnTheirPlatform (issue 39 item 5): anyone who can patch nodes/status or
// nodes can write another cloud's signal on any node; reprieve reads GKE's only on a node whose
// spec.providerID is gce://, AKS's only on azure://. On another platform's node, or one of no
// known platform, they raise nothing and are not reported as unreadable either.
func TestNodeSignalsOnlyOnTheirPlatform(t *testing.T) {
	seen := t0.Add(time.Minute)
	first := func(string) time.Time { return seen }
	hourAgo := metav1.NewTime(seen.Add(-time.Hour))
	gke := v1.Node{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: unix(seen.Add(-time.Hour)),
			LabelGKEActiveMaintenance:    "ONGOING",
		}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoExecute, TimeAdded: &hourAgo}}},
	}
	gkeBad := v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelGKEScheduledMaintenance: "tomorrow"}}}
	aks := aksNodeAt(hourAgo, v1.ConditionTrue, "Preempt Scheduled: "+httpDate(hourAgo.Time))
	aks.Status.Conditions = append(aks.Status.Conditions, v1.NodeCondition{Type: "PreemptScheduled", Status: v1.ConditionTrue,
		Message: "Preempt Scheduled: soon", LastTransitionTime: hourAgo})
	aksBad := aksNode(v1.ConditionTrue, "something else")
	for _, tc := range []struct {
		name       string
		node       v1.Node
		providerID string
		want       int // notices
	}{
		{name: "GKE's on an EKS node", node: gke, providerID: eksProviderID},
		{name: "GKE's on an AKS node", node: gke, providerID: aksProviderID},
		{name: "GKE's on a node of no known platform", node: gke, providerID: ""},
		{name: "GKE's on a node of an unknown scheme", node: gke, providerID: "kind://docker/kind/kind-worker"},
		{name: "GKE's under a look-alike scheme", node: gke, providerID: "gce-lookalike://p/z/n"},
		{name: "GKE's unreadable on an EKS node", node: gkeBad, providerID: eksProviderID},
		{name: "AKS's on an EKS node", node: aks, providerID: eksProviderID},
		{name: "AKS's on a GKE node", node: aks, providerID: gkeProviderID},
		{name: "AKS's on a node of no known platform", node: aks, providerID: ""},
		{name: "AKS's unreadable on a GKE node", node: aksBad, providerID: gkeProviderID},
		// The same signals on their own platform's node, for contrast: three GKE signals, one
		// AKS event (the first condition that says so).
		{name: "GKE's on a GKE node", node: gke, providerID: gkeProviderID, want: 3},
		{name: "AKS's on an AKS node", node: aks, providerID: aksProviderID, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := withProviderID(*tc.node.DeepCopy(), tc.providerID)
			ns, bad := NodeSignals(&node, first)
			if len(ns) != tc.want || (tc.want == 0 && len(bad) != 0) {
				t.Fatalf("notices %+v, bad %v; want %d notices and nothing reported", ns, bad, tc.want)
			}
			for _, n := range ns {
				if !n.Deadline.IsZero() && !n.Deadline.After(seen) {
					t.Errorf("notice %s: deadline %v, not after first seen %v", n.Source, n.Deadline, seen)
				}
			}
		})
	}
}

// TestPlatformOf: the platform a node is on, from its spec.providerID's scheme.
func TestPlatformOf(t *testing.T) {
	for id, want := range map[string]string{
		gkeProviderID: PlatformGCP, aksProviderID: PlatformAzure, eksProviderID: PlatformAWS,
		"":                              "",
		"gce:":                          "",
		"GCE://p/z/n":                   "",
		"kind://docker/kind/kind-1":     "",
		"gcecloud://p/z/n":              "",
		" gce://p/z/n":                  "",
		"azure:///subscriptions/s/rg/x": PlatformAzure,
	} {
		if got := PlatformOf(id); got != want {
			t.Errorf("PlatformOf(%q) = %q, want %q", id, got, want)
		}
	}
}

func aksNode(status v1.ConditionStatus, msg string) v1.Node {
	return aksNodeAt(metav1.NewTime(t0), status, msg)
}

func aksNodeAt(transition metav1.Time, status v1.ConditionStatus, msg string) v1.Node {
	return withProviderID(v1.Node{Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: ConditionAKSVMEventScheduled, Status: status,
		Reason: "VMEventScheduled", Message: msg, LastTransitionTime: transition}}}}, aksProviderID)
}

func gkeNode(n v1.Node) v1.Node { return withProviderID(n, gkeProviderID) }

func withProviderID(n v1.Node, id string) v1.Node {
	n.Spec.ProviderID = id
	return n
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// httpDate is how AKS node-problem-detector writes NotBefore in its message.
func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }
