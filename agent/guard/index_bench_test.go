package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// benchPod is pod i of a cluster of Deployments' pods as the API server serves them: labels,
// annotations, an owner, server-side apply's managedFields, two containers with their images,
// environment, resources, probes and mounts, the projected token volume, the default
// tolerations, and the status the kubelet writes. About 5.5 KiB as JSON, 110 pods a node.
func benchPod(i int) *v1.Pod {
	app := fmt.Sprintf("app-%d", i/20)
	name := fmt.Sprintf("%s-6d4cf56db6-%05d", app, i)
	node := fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i/110/65536%256, i/110/256%256, i/110%256)
	ns := fmt.Sprintf("team-%d", i%200)
	created := metav1.NewTime(time.Unix(1.7e9+int64(i), 0))
	container := func(n string) v1.Container {
		c := v1.Container{Name: n, Image: "registry.example.com/" + app + "/" + n + ":v1.2.3@sha256:" + strings.Repeat("ab", 32),
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}},
			Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("256Mi")}},
			VolumeMounts: []v1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
			ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
				PeriodSeconds: 10},
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: v1.TerminationMessageReadFile, ImagePullPolicy: v1.PullIfNotPresent}
		for e := range 8 {
			c.Env = append(c.Env, v1.EnvVar{Name: fmt.Sprintf("SETTING_%d", e), Value: fmt.Sprintf("value-%d-of-%s", e, app)})
		}
		return c
	}
	status := func(n string) v1.ContainerStatus {
		return v1.ContainerStatus{Name: n, Ready: true, RestartCount: 0, Image: "registry.example.com/" + app + "/" + n + ":v1.2.3",
			ImageID:     "registry.example.com/" + app + "/" + n + "@sha256:" + strings.Repeat("cd", 32),
			ContainerID: "containerd://" + strings.Repeat("ef", 32),
			State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: created}}}
	}
	fields := metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"` +
		strings.Repeat("1", 36) + `\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{},"f:image":{},"f:name":{},"f:ports":{},"f:resources":{}},` +
		`"k:{\"name\":\"sidecar\"}":{".":{},"f:image":{},"f:name":{}}},"f:dnsPolicy":{},"f:restartPolicy":{},"f:schedulerName":{},"f:terminationGracePeriodSeconds":{}}}`)}
	statusFields := metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:status":{},"f:type":{}},` +
		`"k:{\"type\":\"Ready\"}":{".":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:podIPs":{},"f:startTime":{}}}`)}
	ctrl := true
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(fmt.Sprintf("%08x-1234-4abc-8def-%012x", i, i)),
			ResourceVersion: fmt.Sprint(1000 + i), GenerateName: app + "-6d4cf56db6-", CreationTimestamp: created,
			Labels:      map[string]string{"app": app, "pod-template-hash": "6d4cf56db6", "team": ns, "version": "v1"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z", "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-6d4cf56db6",
				UID: types.UID(strings.Repeat("1", 36)), Controller: &ctrl, BlockOwnerDeletion: &ctrl}},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &created, FieldsType: "FieldsV1", FieldsV1: &fields},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &created, FieldsType: "FieldsV1", FieldsV1: &statusFields, Subresource: "status"},
			}},
		Spec: v1.PodSpec{NodeName: node, ServiceAccountName: "default", SchedulerName: "default-scheduler",
			Containers: []v1.Container{container("app"), container("sidecar")},
			Volumes: []v1.Volume{{Name: "kube-api-access-abcde", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: new(int64(3607))}},
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			}}}}},
			Tolerations: []v1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.1.2.3", PodIPs: []v1.PodIP{{IP: "10.1.2.3"}}, StartTime: &created,
			QOSClass: v1.PodQOSBurstable,
			Conditions: []v1.PodCondition{{Type: v1.PodReadyToStartContainers, Status: v1.ConditionTrue, LastTransitionTime: created},
				{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: created}, {Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: created},
				{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: created}, {Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: created}},
			ContainerStatuses: []v1.ContainerStatus{status("app"), status("sidecar")}},
	}
}

// streamedPods is a list and watch of n pods (benchPod) made as they are sent, as a decoder
// makes them from the API server's stream: a watch-list streams them as ADDED events, a list
// returns them all at once (then every one of them is in memory together, as client-go's
// reflector decodes a list).
type streamedPods struct{ n int }

func (s streamedPods) lw(x *PodIndex, watchList bool) cache.ListerWatcher {
	lw := x.ListWatch(func(_ context.Context, o metav1.ListOptions) (*v1.PodList, error) {
		// Pages as the API server serves them, with a continue token when more are left.
		from := 0
		if o.Continue != "" {
			if _, err := fmt.Sscan(o.Continue, &from); err != nil {
				return nil, err
			}
		}
		to := s.n
		if o.Limit > 0 {
			to = min(s.n, from+int(o.Limit))
		}
		l := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: make([]v1.Pod, to-from)}
		for i := range l.Items {
			l.Items[i] = *benchPod(from + i)
		}
		if to < s.n {
			l.Continue = fmt.Sprint(to)
		}
		return l, nil
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		w := watch.NewFake()
		if o.SendInitialEvents != nil && *o.SendInitialEvents {
			go func() {
				for i := range s.n {
					select {
					case <-ctx.Done():
						return
					default:
						w.Add(benchPod(i))
					}
				}
				w.Action(watch.Bookmark, &v1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1",
					Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			}()
		}
		return w, nil
	})
	if watchList {
		return lw
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, notWatchList{})
}

// heapObjects is the bytes of heap objects, live or not yet collected (runtime/metrics): what
// the process holds, read without stopping the world.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkPodIndexMemory measures what the guard's index costs in memory at 10,000 and 100,000
// pods (benchPod, a Deployment's pod as the API server serves it), both ways client-go's
// reflector fills it: a watch-list (kube-apiserver 1.34 and later: WatchList on by default),
// whose pods pass the index's transform one by one, and a list (1.30 to 1.33), which the index
// reads a page at a time, trimming each page before the next (PodIndex.ListWatch). It reports the heap the index keeps once
// synced (after a collection), per pod and in all, and the peak of the heap's objects while it
// syncs (garbage not yet collected included, at the default GOGC). One sync per iteration:
//
//	go test -run '^$' -bench BenchmarkPodIndexMemory -benchtime 1x ./agent/guard/
func BenchmarkPodIndexMemory(b *testing.B) {
	for _, mode := range []string{"watch-list", "list"} {
		for _, n := range []int{10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/pods=%d", mode, n), func(b *testing.B) {
				var kept, peak uint64
				for b.Loop() {
					base := liveHeap()
					var high atomic.Uint64
					stop := make(chan struct{})
					sampled := make(chan struct{})
					go func() {
						defer close(sampled)
						t := time.NewTicker(time.Millisecond)
						defer t.Stop()
						for {
							high.Store(max(high.Load(), heapObjects()))
							select {
							case <-stop:
								return
							case <-t.C:
							}
						}
					}()
					x := NewPodIndex(nil)
					synced := make(chan struct{})
					x.changed = func() {
						if x.Synced() {
							select {
							case <-synced:
							default:
								close(synced)
							}
						}
					}
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() { defer close(done); x.Run(ctx, streamedPods{n}.lw(x, mode == "watch-list")) }()
					<-synced
					close(stop)
					<-sampled
					if x.Len() != n {
						b.Fatalf("the index holds %d pods; want %d", x.Len(), n)
					}
					kept = liveHeap() - base
					peak = high.Load() - min(base, high.Load())
					cancel()
					<-done
					runtime.KeepAlive(x)
				}
				b.ReportMetric(float64(kept)/float64(n), "B/pod-kept")
				b.ReportMetric(float64(kept)/(1<<20), "MiB-kept")
				b.ReportMetric(float64(peak)/(1<<20), "MiB-peak")
			})
		}
	}
}

// BenchmarkPodIndexLocate is the cost of one review's lookup in an index of 100,000 pods.
func BenchmarkPodIndexLocate(b *testing.B) {
	const n = 100_000
	x := NewPodIndex(nil)
	pods := make([]*v1.Pod, n)
	for i := range n {
		pods[i] = benchPod(i)
		pods[i].ManagedFields, pods[i].Spec, pods[i].Status = nil, v1.PodSpec{NodeName: pods[i].Spec.NodeName}, v1.PodStatus{}
		if err := x.Add(pods[i]); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		p := pods[i%n]
		if node, loc := x.Locate(p.Namespace, p.Name, p.UID); loc != Bound || node != p.Spec.NodeName {
			b.Fatalf("pod %d: %q, %v; want its node", i%n, node, loc)
		}
		i++
	}
}

// BenchmarkServeReviewFromIndex is one review as the API server posts it (the body read and
// decoded, the source's limits, the lookup in an index of 100,000 pods, the answer encoded),
// without TLS: the guard's CPU per review once the index is synced.
func BenchmarkServeReviewFromIndex(b *testing.B) {
	const n = 100_000
	x := NewPodIndex(nil)
	var last *v1.Pod
	for i := range n {
		last = benchPod(i)
		if err := x.Add(last); err != nil {
			b.Fatal(err)
		}
	}
	lim, err := NewLimiter(DefaultLimits(), clock.RealClock{})
	if err != nil {
		b.Fatal(err)
	}
	h := &Handler{Username: "system:serviceaccount:kube-system:reprieve", Pods: x, Limits: lim,
		GetPod: func(context.Context, string, string) (*v1.Pod, error) { b.Fatal("a read"); return nil, nil }}
	grace, uid := int64(5), last.UID
	ev, err := json.Marshal(policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta:    metav1.ObjectMeta{Name: last.Name, Namespace: last.Namespace},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}}})
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "review", Kind: metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, SubResource: "eviction", Name: last.Name, Namespace: last.Namespace,
			Operation: admissionv1.Create, Object: k8sruntime.RawExtension{Raw: ev},
			UserInfo: authnv1.UserInfo{Username: h.Username, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
				Extra: map[string]authnv1.ExtraValue{NodeClaim: {last.Spec.NodeName}, "authentication.kubernetes.io/pod-name": {"reprieve-abcde"},
					"authentication.kubernetes.io/pod-uid": {"0b0e5f6a-1234-4abc-8def-000000000001"}, "authentication.kubernetes.io/credential-id": {"JTI=0b0e5f6a-1234"}}}}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, PathValidate, bytes.NewReader(body))
		r.RemoteAddr = "10.0.0.1:443"
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":true`)) {
			b.Fatalf("%d %s", rec.Code, rec.Body.Bytes())
		}
	}
}
