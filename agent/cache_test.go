package agent

import (
	"context"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestInformersTrimWhatNoOneReads runs the agent's informers on the fake API and checks that
// the cached node and pod lost managedFields (and the node its images and volumes) and kept
// every field the agent reads.
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
	p.Labels, p.Annotations = map[string]string{"app": "a"}, map[string]string{AnnotationEvictAt: "x"}
	p.ManagedFields = managed
	p.DeletionTimestamp = &del
	p.Finalizers = []string{"f"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u"}}
	p.Spec.NodeName, p.Spec.Priority, p.Spec.HostNetwork = nodeName, ptr(int32(7)), true
	p.Spec.Containers = []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}}}}
	p.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("10Mi")}
	p.Status.PodIP, p.Status.PodIPs = "10.0.0.7", []v1.PodIP{{IP: "10.0.0.7"}}
	p.Status.Conditions = []v1.PodCondition{{Type: PodConditionInterruption, Status: v1.ConditionTrue}}
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
	if gotNode.ManagedFields != nil || gotNode.Status.Images != nil || gotNode.Status.VolumesInUse != nil || gotNode.Status.VolumesAttached != nil {
		t.Errorf("cached node kept what no one reads: managedFields %v, images %v, volumes %v %v", gotNode.ManagedFields,
			gotNode.Status.Images, gotNode.Status.VolumesInUse, gotNode.Status.VolumesAttached)
	}
	if gotPod.ManagedFields != nil {
		t.Errorf("cached pod kept managedFields: %v", gotPod.ManagedFields)
	}
	wantNode := node.DeepCopy()
	wantNode.ManagedFields, wantNode.Status.Images, wantNode.Status.VolumesInUse, wantNode.Status.VolumesAttached = nil, nil, nil, nil
	wantNode.ResourceVersion = gotNode.ResourceVersion
	if !reflect.DeepEqual(gotNode, wantNode) {
		t.Errorf("cached node lost more than it should:\n got %+v\nwant %+v", gotNode, wantNode)
	}
	wantPod := p.DeepCopy()
	wantPod.ManagedFields = nil
	wantPod.ResourceVersion = gotPod.ResourceVersion
	if !reflect.DeepEqual(gotPod, wantPod) {
		t.Errorf("cached pod lost more than it should:\n got %+v\nwant %+v", gotPod, wantPod)
	}
}
