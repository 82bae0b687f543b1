package podnotice

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

func TestNoticeAPIWaitersBounded(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns", UID: "uid-job"},
		Spec:   v1.PodSpec{NodeName: "n1"},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.5", PodIPs: []v1.PodIP{{IP: "10.0.0.5"}}}}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := idx.Add(pod); err != nil {
		t.Fatal(err)
	}
	pods := corelisters.NewPodLister(idx)
	clk := clocktesting.NewFakeClock(t0)
	n := New(config.DefaultConfig(), kubetest.Wrap(fake.NewClientset(pod)), pods, clk)
	// Every waiting slot taken: a wait is answered at once instead of held.
	s := NewEndpoint(n, pods, clk, 1)
	s.waiters <- struct{}{}
	req := httptest.NewRequest(http.MethodGet, "/v1/pods/ns/job/notice?wait=true", nil)
	req.RemoteAddr = "10.0.0.5:40000"
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	var a NoticeAnswer
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", rec.Body.String(), err)
		}
	}
	if rec.Code != http.StatusOK || a.Notice {
		t.Errorf("a wait past the bound: %d %+v; want the current answer at once", rec.Code, a)
	}
}
