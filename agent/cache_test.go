package agent

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/reference"

	"github.com/reprieve-dev/reprieve/agent/informer"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/podnotice"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// TestInformersTrimWhatNoOneReads runs the agent's informers on the fake API and checks that
// the cached node lost managedFields, its images and the attached volumes' list, and kept
// volumesInUse (the window's summary of released volumes reads it from the cached node), that
// the cached pod is the trimmed pod (informer.TrimPod), and that both kept every field the agent reads.
func TestInformersTrimWhatNoOneReads(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"l": "v"}, Annotations: map[string]string{"a": "v"},
			ManagedFields: managed},
		Spec: v1.NodeSpec{ProviderID: "aws:///us-east-1a/i-1", Taints: []v1.Taint{{Key: "k", Effect: v1.TaintEffectNoSchedule}}},
		Status: v1.NodeStatus{
			Capacity:        v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi")},
			Allocatable:     v1.ResourceList{v1.ResourceMemory: resource.MustParse("7Gi")},
			Conditions:      []v1.NodeCondition{{Type: "VMEventScheduled", Status: v1.ConditionTrue, Message: "m"}},
			Addresses:       []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}},
			DaemonEndpoints: v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: 10250}},
			Images:          []v1.ContainerImage{{Names: []string{"registry.example/app:1"}, SizeBytes: 1 << 30}},
			VolumesInUse:    []v1.UniqueVolumeName{"kubernetes.io/csi/ebs^vol-1"},
			VolumesAttached: []v1.AttachedVolume{{Name: "kubernetes.io/csi/ebs^vol-1", DevicePath: "/dev/xvdba"}},
		},
	}
	del := metav1.NewTime(t0)
	p := withGrace(pod(spotToleration(secs(60))), 30)
	p.Labels, p.Annotations = map[string]string{"app": "a"}, map[string]string{record.AnnotationEvictAt: "x"}
	p.ManagedFields = managed
	p.DeletionTimestamp = &del
	p.Finalizers = []string{"f"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u", Controller: ptr(true)}}
	p.Spec.NodeName, p.Spec.Priority, p.Spec.HostNetwork = nodeName, ptr(int32(7)), true
	p.Spec.Containers = []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}}}}
	p.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("10Mi")}
	p.Status.PodIP, p.Status.PodIPs = "10.0.0.7", []v1.PodIP{{IP: "10.0.0.7"}}
	p.Status.Conditions = []v1.PodCondition{{Type: record.PodConditionInterruption, Status: v1.ConditionTrue}}
	p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", Ready: true}}

	h := newHarness(t, nil, node, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A fresh agent on the same client: harness.build filled the stores by hand.
	h.build(h.prov)
	h.a.nodeInformer.GetIndexer().Replace(nil, "")
	h.a.podInformer.GetIndexer().Replace(nil, "")
	go h.a.nodeInformer.RunWithContext(ctx)
	go h.a.podInformer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), h.a.nodeInformer.HasSynced, h.a.podInformer.HasSynced) {
		t.Fatal("the informers did not sync")
	}
	gotNode, err := h.a.nodeLister.Get(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	gotPod, err := h.a.podLister.Pods(p.Namespace).Get(p.Name)
	if err != nil {
		t.Fatal(err)
	}
	if gotNode.ManagedFields != nil || gotNode.Status.Images != nil || gotNode.Status.VolumesAttached != nil {
		t.Errorf("cached node kept what no one reads: managedFields %v, images %v, attached volumes %v", gotNode.ManagedFields,
			gotNode.Status.Images, gotNode.Status.VolumesAttached)
	}
	if gotPod.ManagedFields != nil {
		t.Errorf("cached pod kept managedFields: %v", gotPod.ManagedFields)
	}
	wantNode := node.DeepCopy()
	wantNode.ManagedFields, wantNode.Status.Images, wantNode.Status.VolumesAttached = nil, nil, nil
	wantNode.ResourceVersion = gotNode.ResourceVersion
	if !reflect.DeepEqual(gotNode, wantNode) {
		t.Errorf("cached node lost more than it should:\n got %+v\nwant %+v", gotNode, wantNode)
	}
	// The pod keeps what the agent reads (informer.TrimPod; TestTrimKeepsWhatEveryUnitReads checks each
	// unit's answers): before issue 39 it kept everything but managedFields, and this compared
	// the whole pod. Finalizers and container statuses are gone now, and the container is the
	// sum of the requests.
	wantPod := informer.TrimPod(p)
	wantPod.ResourceVersion = gotPod.ResourceVersion
	if !reflect.DeepEqual(gotPod, wantPod) {
		t.Errorf("cached pod is not the trimmed pod:\n got %+v\nwant %+v", gotPod, wantPod)
	}
	if gotPod.Finalizers != nil || gotPod.Status.ContainerStatuses != nil {
		t.Errorf("cached pod kept what no one reads: finalizers %v, container statuses %v", gotPod.Finalizers, gotPod.Status.ContainerStatuses)
	}
	// Every field the agent reads that the pod sets, one by one.
	if gotPod.Labels["app"] != "a" || gotPod.Annotations[record.AnnotationEvictAt] != "x" || !gotPod.DeletionTimestamp.Equal(&del) ||
		!reflect.DeepEqual(gotPod.OwnerReferences, p.OwnerReferences) || gotPod.Spec.NodeName != nodeName ||
		*gotPod.Spec.Priority != 7 || !gotPod.Spec.HostNetwork || *gotPod.Spec.TerminationGracePeriodSeconds != 30 ||
		!reflect.DeepEqual(gotPod.Spec.Tolerations, p.Spec.Tolerations) || !reflect.DeepEqual(gotPod.Spec.Overhead, p.Spec.Overhead) ||
		!gotPod.Spec.Containers[0].Resources.Requests.Memory().Equal(resource.MustParse("1Gi")) ||
		gotPod.Status.PodIP != "10.0.0.7" || !reflect.DeepEqual(gotPod.Status.PodIPs, p.Status.PodIPs) ||
		!reflect.DeepEqual(gotPod.Status.Conditions, p.Status.Conditions) || gotPod.Status.Phase != p.Status.Phase {
		t.Errorf("cached pod lost a field the agent reads:\n got %+v\nfrom %+v", gotPod, p)
	}
}

// TestTrimKeepsWhatEveryUnitReads asks every unit of the agent that reads the cached pods for
// its answer about each pod of a table, the whole pod against the trimmed one, and wants the
// same: the plan and the executor's filter (plan.PlanPodAt, Skip, NeedsShortening, PodGrace,
// the DisruptionTarget test), pressure's Keep and ranking for every signal (requests, priority,
// local volumes), the pods' warning (carries, warningPatch), the notice endpoint's claimants,
// Overlaps, the events' object reference and the keys and preconditions (name, namespace, UID).
// Each pod sets what one unit reads, next to the bulk of a tenant's pod.
func TestTrimKeepsWhatEveryUnitReads(t *testing.T) {
	bulk := func(p *v1.Pod) *v1.Pod {
		p.Annotations = map[string]string{"tenant.example/blob": strings.Repeat("a", 64<<10)}
		for k, v := range p.Labels {
			p.Annotations["shadow/"+k] = v
		}
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels["tenant.example/x"] = "y"
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "bulk", Image: "i", Args: []string{strings.Repeat("g", 64<<10)},
			Env: []v1.EnvVar{{Name: "E", Value: strings.Repeat("e", 64<<10)}}, LivenessProbe: &v1.Probe{}})
		p.Finalizers = []string{"example.com/f"}
		p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "bulk", Ready: true}}
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue})
		return p
	}
	req := func(mem, eph string) v1.ResourceRequirements {
		r := v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
		if mem != "" {
			r[v1.ResourceMemory] = resource.MustParse(mem)
		}
		if eph != "" {
			r[v1.ResourceEphemeralStorage] = resource.MustParse(eph)
		}
		return v1.ResourceRequirements{Requests: r, Limits: r}
	}
	del := metav1.NewTime(t0.Add(90 * time.Second))
	var table []*v1.Pod
	add := func(name string, f func(p *v1.Pod)) {
		p := withGrace(pod(spotToleration(secs(60))), 30)
		p.Name, p.UID, p.ResourceVersion, p.Spec.NodeName = name, types.UID("uid-"+name), "42", nodeName
		p.Spec.Containers = []v1.Container{{Name: "app", Resources: req("100Mi", "1Gi")}}
		p.Status.PodIP, p.Status.PodIPs = "10.0.0."+fmt.Sprint(len(table)+1), []v1.PodIP{{IP: "10.0.0." + fmt.Sprint(len(table)+1)}}
		f(p)
		table = append(table, bulk(p))
	}
	add("plain", func(*v1.Pod) {})
	add("tolerations", func(p *v1.Pod) {
		p.Spec.Tolerations = []v1.Toleration{tol("cloud", v1.TolerationOpEqual, "spot", v1.TaintEffectNoSchedule, nil),
			tol("", v1.TolerationOpExists, "", "", secs(20)), spotToleration(nil), tol("other", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil)}
	})
	add("forever", func(p *v1.Pod) { p.Spec.Tolerations = []v1.Toleration{tol("", v1.TolerationOpExists, "", "", nil)} })
	add("mirror", func(p *v1.Pod) {
		p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "hash", "kubernetes.io/config.source": "file"}
	})
	add("static-source", func(p *v1.Pod) {
		p.Annotations = map[string]string{"kubernetes.io/config.source": strings.Repeat("f", 8<<10)}
	})
	add("api-source", func(p *v1.Pod) { p.Annotations = map[string]string{"kubernetes.io/config.source": "api"} })
	add("daemonset", func(p *v1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "c"},
			{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "d", Controller: ptr(true)}}
	})
	add("daemonset-not-controller", func(p *v1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "d"}}
	})
	add("critical", func(p *v1.Pod) { p.Spec.Priority = ptr(int32(2000001000)) })
	add("low-priority", func(p *v1.Pod) { p.Spec.Priority = ptr(int32(-5)) })
	add("no-grace", func(p *v1.Pod) { p.Spec.TerminationGracePeriodSeconds = nil })
	add("terminating", func(p *v1.Pod) { p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &del, secs(90) })
	add("self", func(p *v1.Pod) { p.Namespace = "reprieve" })
	add("sidecars", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: req("2Gi", "")},
			{Name: "sidecar", RestartPolicy: ptr(v1.ContainerRestartPolicyAlways), Resources: req("300Mi", "5Gi")}}
		p.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("10Mi"), v1.ResourceCPU: resource.MustParse("10m")}
	})
	add("pod-level-cpu", func(p *v1.Pod) {
		p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}
	})
	add("pod-level-memory", func(p *v1.Pod) {
		p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("3Gi"), "hugepages-2Mi": resource.MustParse("2Mi")},
			Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("3Gi")}}
	})
	add("pod-level-hugepages", func(p *v1.Pod) {
		p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{"hugepages-1Gi": resource.MustParse("1Gi")}}
	})
	add("best-effort", func(p *v1.Pod) { p.Spec.Containers = []v1.Container{{Name: "app"}} })
	add("volumes", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{
			{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{SizeLimit: ptr(resource.MustParse("1Gi"))}}},
			{Name: "shm", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
			{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/log"}}},
			{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}}}},
			{Name: "repo", VolumeSource: v1.VolumeSource{GitRepo: &v1.GitRepoVolumeSource{Repository: "r"}}},
			{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}},
			{Name: "claim", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
		}
	})
	add("attaching-volumes", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{
			{Name: "claim", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-attaching-volumes", ReadOnly: true}}},
			{Name: "eph", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{
				Spec: v1.PersistentVolumeClaimSpec{StorageClassName: ptr("gp3")}}}}},
			{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-0inline", FSType: "ext4"}}},
			{Name: "pd", VolumeSource: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}},
			{Name: "azure", VolumeSource: v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d"}}},
			{Name: "san", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.9:3260", IQN: "iqn", Lun: 1}}},
			{Name: "share", VolumeSource: v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{SecretName: "s", ShareName: "sh"}}},
		}
	})
	add("host-network", func(p *v1.Pod) { p.Spec.HostNetwork = true })
	add("csi-node-plugin", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{
			{Name: "registration-dir", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins_registry/"}}},
			{Name: "plugin-dir", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins/ebs.csi.aws.com/"}}},
		}
	})
	add("prestop-hook", func(p *v1.Pod) {
		p.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "5"}}}}
	})
	add("sidecar-prestop-hook", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: ptr(v1.ContainerRestartPolicyAlways),
			Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "5"}}}}}}
	})
	add("shared-ip", func(p *v1.Pod) { p.Status.PodIP, p.Status.PodIPs = "10.0.0.1", []v1.PodIP{{IP: "10.0.0.1"}} })
	add("dual-stack", func(p *v1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, v1.PodIP{IP: "fd00::7"}) })
	add("succeeded", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })
	add("refused", func(p *v1.Pod) { p.Status.Phase, p.Status.Reason = v1.PodFailed, "OutOfpods" })
	add("nth", func(p *v1.Pod) {
		p.Labels = map[string]string{"app.kubernetes.io/name": "aws-node-termination-handler"}
	})
	add("nth-app", func(p *v1.Pod) { p.Labels = map[string]string{"app": "aws-node-termination-handler"} })
	warned := func(p *v1.Pod) {
		p.Annotations = map[string]string{record.AnnotationEvictAt: "2026-11-29T12:01:00Z", record.AnnotationReclaimDeadline: "2026-11-29T12:02:00Z"}
		p.Status.Conditions = []v1.PodCondition{{Type: record.PodConditionInterruption, Status: v1.ConditionTrue, Reason: "SpotInterruption",
			Message:            "Eviction planned at 2026-11-29T12:01:00Z with grace 30s; the machine is reclaimed at 2026-11-29T12:02:00Z (an interruption notice)",
			LastTransitionTime: metav1.NewTime(t0)}}
	}
	add("warned", warned)
	add("warned-finished", func(p *v1.Pod) { warned(p); p.Status.Phase = v1.PodSucceeded })
	add("warned-long", func(p *v1.Pod) { warned(p); p.Annotations[record.AnnotationEvictAt] = strings.Repeat("2", 8<<10) })
	add("disrupted", func(p *v1.Pod) {
		p.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "EvictionByEvictionAPI"}}
	})

	// The claims and volumes of the pod "attaching-volumes", as the API server holds them.
	volumeObjs := fake.NewClientset(
		&v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: table[0].Namespace, Name: "data-attaching-volumes"}, Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv-claim"}},
		&v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: table[0].Namespace, Name: "attaching-volumes-eph",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "attaching-volumes", UID: "uid-attaching-volumes", Controller: ptr(true)}}},
			Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv-eph"}},
		&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-claim"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-0claim"}}}},
		&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-eph"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0eph"}}}})
	volumeClient := kubetest.Wrap(volumeObjs)
	trimmed := make([]*v1.Pod, len(table))
	for i, p := range table {
		got, err := informer.Trim(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		trimmed[i] = got.(*v1.Pod)
	}
	same := func(what string, a, b any) {
		t.Helper()
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs on the trimmed pod:\n whole   %v\n trimmed %v", what, a, b)
		}
	}

	taint := v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}
	taints := []v1.Taint{{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute, TimeAdded: ptr(metav1.NewTime(t0))},
		{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: ptr(metav1.NewTime(t0))}, {Key: "dedicated", Effect: v1.TaintEffectNoSchedule}}
	windows := []plan.Window{{}, {Deadline: t0.Add(2 * time.Minute), SafetyMargin: 5 * time.Second, Taint: taint},
		{Deadline: t0.Add(2 * time.Minute), SafetyMargin: 5 * time.Second, Taint: taint, SoftOff: t0.Add(90 * time.Second), ShutdownCut: 20 * time.Second}}
	filters := []plan.PodFilter{{SelfNamespace: "reprieve", SelfName: "self"}, {EvictDaemonSetPods: true}}
	now := t0.Add(10 * time.Second)
	notices := []podnotice.Warning{{}, {Active: true, Reason: "SpotInterruption", EvictAt: t0.Add(time.Minute), Deadline: t0.Add(2 * time.Minute),
		Message: "Eviction planned at 2026-11-29T12:01:00Z with grace 30s; the machine is reclaimed at 2026-11-29T12:02:00Z (an interruption notice)"}}
	disrupted := func(p *v1.Pod) bool { // evict.markDisruptionTarget's test
		for _, c := range p.Status.Conditions {
			if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue {
				return true
			}
		}
		return false
	}
	for i, p := range table {
		tp := trimmed[i]
		name := p.Name
		same(name+": identity (keys, preconditions, events)", []any{p.Name, p.Namespace, p.UID, p.ResourceVersion, p.DeletionTimestamp, p.DeletionGracePeriodSeconds},
			[]any{tp.Name, tp.Namespace, tp.UID, tp.ResourceVersion, tp.DeletionTimestamp, tp.DeletionGracePeriodSeconds})
		refWhole, err1 := reference.GetReference(scheme.Scheme, p)
		refTrim, err2 := reference.GetReference(scheme.Scheme, tp)
		same(name+": the events' object reference", []any{refWhole, err1}, []any{refTrim, err2})
		for _, f := range filters {
			same(name+": plan.PodFilter.Skip", f.Skip(p), f.Skip(tp))
			for _, w := range windows {
				same(name+": plan.PlanPodAt", plan.PlanPodAt(p, taints, t0, w, f, true), plan.PlanPodAt(tp, taints, t0, w, f, true))
				same(name+": plan.NeedsShortening", plan.NeedsShortening(p, w), plan.NeedsShortening(tp, w))
			}
		}
		same(name+": plan.PodGrace", plan.PodGrace(p), plan.PodGrace(tp))
		same(name+": the DisruptionTarget test", disrupted(p), disrupted(tp))
		same(name+": pressure.Keep", pressure.Keep(p, "reprieve", "self"), pressure.Keep(tp, "reprieve", "self"))
		finished := p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
		if !finished {
			// Of a finished pod's condition only the status and transition time are read
			// (carries and warningPatch on a withdrawal, compared below).
			same(name+": interruptionCondition", podnotice.InterruptionCondition(p), podnotice.InterruptionCondition(tp))
		}
		for _, pw := range notices {
			if finished && pw.Active {
				continue // a finished pod is only ever withdrawn (warningFor)
			}
			same(name+": carries", podnotice.Carries(p, pw), podnotice.Carries(tp, pw))
			a, _ := podnotice.WarningPatch(p, pw, now)
			b, _ := podnotice.WarningPatch(tp, pw, now)
			same(name+": warningPatch", string(a), string(b))
		}
		if !finished {
			// The endpoint reads the IPs of unfinished pods only (claimants).
			same(name+": podIPs", podnotice.PodIPs(p), podnotice.PodIPs(tp))
		}
		// The executor's reader of a pod's volumes (volumes_api.go), on the claims and volumes
		// the API server would give it.
		wholeVols, wholeErr := volumes.ReadPod(context.Background(), volumeClient, p)
		trimVols, trimErr := volumes.ReadPod(context.Background(), volumeClient, tp)
		same(name+": ReadPodVolumes", []any{wholeVols, fmt.Sprint(wholeErr)}, []any{trimVols, fmt.Sprint(trimErr)})
		if name == "attaching-volumes" && len(wholeVols.Attach) != 5 {
			t.Errorf("%s: the volumes read %v (%v), want 5 that attach: the comparison must see every kind", name, wholeVols.Attach, wholeErr)
		}
	}

	// Pressure's ranking, over every pod it may evict (Keep, compared above, says which: the
	// loop ranks no other), with usage that puts each pod above or below its requests, on a
	// node with and without a dedicated imagefs.
	var evictable, evictableTrimmed []*v1.Pod
	for i, p := range table {
		if pressure.Keep(p, "reprieve", "self") == "" {
			evictable, evictableTrimmed = append(evictable, p), append(evictableTrimmed, trimmed[i])
		}
	}
	for _, dedicated := range []bool{false, true} {
		usage := map[types.UID]kubelet.PodUsage{}
		for i, p := range table {
			if i%5 == 4 {
				continue // a pod the source has no figures for
			}
			fs := kubelet.FsUsage{Bytes: int64(i) << 28, Inodes: int64(i) * 1000}
			u := kubelet.PodUsage{UID: p.UID, MemoryWorkingSet: int64(i%7) << 28, Processes: int64(i % 3), Rootfs: fs, Logs: fs,
				RootfsOnImageFs: dedicated, Volumes: map[string]kubelet.FsUsage{}}
			for _, v := range []string{"scratch", "shm", "host", "config", "repo", "secret", "claim"} {
				u.Volumes[v] = kubelet.FsUsage{Bytes: 3 << 30, Inodes: 7000}
			}
			usage[p.UID] = u
		}
		for _, s := range []kubelet.Signal{kubelet.MemoryAvailable, kubelet.NodeFsAvailable, kubelet.NodeFsInodesFree,
			kubelet.ImageFsAvailable, kubelet.ImageFsInodesFree, kubelet.PIDAvailable} {
			ranked := func(pods []*v1.Pod) []string {
				var out []string
				for _, c := range pressure.Candidates(s, pods, usage, plan.PodGrace) {
					out = append(out, fmt.Sprintf("%s usage=%d known=%v grace=%s", c.Pod.Name, c.Usage, c.Known, c.Grace))
				}
				return out
			}
			same(fmt.Sprintf("pressure.Candidates(%s, dedicated imagefs %v)", s, dedicated), ranked(evictable), ranked(evictableTrimmed))
		}
	}

	// The notice endpoint's claimants, for every pod's address and a stranger's.
	lister := func(pods []*v1.Pod) corelisters.PodLister {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		for _, p := range pods {
			if err := idx.Add(p); err != nil {
				t.Fatal(err)
			}
		}
		return corelisters.NewPodLister(idx)
	}
	whole, trim := podnotice.NewEndpoint(nil, lister(table), nil, 0), podnotice.NewEndpoint(nil, lister(trimmed), nil, 0)
	names := func(pods []*v1.Pod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.21", "fd00::7", "10.9.9.9"} {
		a := netip.MustParseAddr(ip)
		same("the notice endpoint's claimants of "+ip, names(whole.Claimants(a)), names(trim.Claimants(a)))
	}

	// Overlaps on the node's pods.
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	same("Overlaps", nodefacts.Overlaps(node, table), nodefacts.Overlaps(node, trimmed))
}
