package agent

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/podnotice"
)

func podWithIP(name, ip string, grace int64, tol ...v1.Toleration) *v1.Pod {
	p := testPod(name, grace, tol...)
	p.Status.PodIP = ip
	p.Status.PodIPs = []v1.PodIP{{IP: ip}}
	return p
}

// ask sends GET path from src to the endpoint and returns the status, the ETag and the answer.
func ask(t *testing.T, s *podnotice.Endpoint, src, path string) (int, string, podnotice.NoticeAnswer) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = src + ":40000"
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	var a podnotice.NoticeAnswer
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", rec.Body.String(), err)
		}
	}
	return rec.Code, rec.Header().Get("ETag"), a
}

func TestNoticeAPIAnswersAPodAboutItself(t *testing.T) {
	h := newHarness(t, nil, testNode(),
		podWithIP("job", "10.0.0.5", 30, spotToleration(secs(3600))),
		podWithIP("other", "10.0.0.6", 30, spotToleration(secs(3600))),
	)
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, h.clock, 0)
	const path = "/v1/pods/ns/job/notice"

	code, before, a := ask(t, s, "10.0.0.5", path)
	if code != http.StatusOK || a.Notice || before == "" {
		t.Fatalf("before a notice: %d %q %+v; want 200, an ETag and notice false", code, before, a)
	}

	h.notice(t0.Add(120 * time.Second))
	h.syncAll("job", "other")
	code, etag, a := ask(t, s, "10.0.0.5", path)
	if code != http.StatusOK || !a.Notice || a.Reason != events.ReasonSpotInterruption || etag == before {
		t.Fatalf("after the notice: %d %q %+v; want 200, a new ETag and notice true", code, etag, a)
	}
	if a.EvictAt == nil || !a.EvictAt.Equal(t0.Add(84*time.Second)) || a.ReclaimDeadline == nil || !a.ReclaimDeadline.Equal(t0.Add(120*time.Second)) {
		t.Errorf("times %v %v; want evict at t0+84s (120 - 5 - 30 - the kubelet's 1 s reaction), deadline t0+120s", a.EvictAt, a.ReclaimDeadline)
	}
	if _, again, _ := ask(t, s, "10.0.0.5", path); again != etag {
		t.Errorf("the same answer has ETag %q, then %q", etag, again)
	}

	hostNet := podWithIP("host-agent", "10.0.0.1", 30, spotToleration(secs(3600)))
	hostNet.Spec.HostNetwork = true
	done := podWithIP("done", "10.0.0.7", 30, spotToleration(secs(3600)))
	done.Status.Phase = v1.PodSucceeded
	for _, p := range []*v1.Pod{hostNet, done} {
		if err := h.a.podInformer.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, src, path string }{
		{"a host-network pod (its IP is the node's)", "10.0.0.1", "/v1/pods/ns/host-agent/notice"},
		{"a finished pod (its IP may be another's)", "10.0.0.7", "/v1/pods/ns/done/notice"},
		{"a neighbour asking about the pod", "10.0.0.6", path},
		{"an address of no pod", "192.0.2.1", path},
		{"a pod not on the node", "10.0.0.5", "/v1/pods/ns/elsewhere/notice"},
		{"another namespace", "10.0.0.5", "/v1/pods/other-ns/job/notice"},
		{"another path", "10.0.0.5", "/v1/pods/ns/job"},
	} {
		if code, _, _ := ask(t, s, tc.src, tc.path); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", tc.name, code)
		}
	}
}

func TestNoticeAPIWaitReturnsOnChange(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30, spotToleration(secs(3600))))
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, h.clock, 0)
	_, etag, _ := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice")

	type result struct {
		code int
		etag string
		a    podnotice.NoticeAnswer
	}
	done := make(chan result, 1)
	go func() {
		code, e, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&last_etag="+etag)
		done <- result{code, e, a}
	}()
	// Whether the request is already waiting or not, it must answer the new state.
	h.notice(t0.Add(120 * time.Second))
	h.syncAll("job")
	r := <-done
	if r.code != http.StatusOK || !r.a.Notice || r.etag == etag {
		t.Errorf("wait=true after the notice: %d %q %+v; want the notice with a new ETag", r.code, r.etag, r.a)
	}
}

func TestNoticeAPIWaitTimesOut(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30))
	// A clock of its own: the harness's clock always has the workqueues' timers waiting.
	clk := clocktesting.NewFakeClock(t0)
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, clk, 0)
	done := make(chan podnotice.NoticeAnswer, 1)
	var code int
	go func() {
		c, _, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&timeout_sec=5")
		code = c
		done <- a
	}()
	for !clk.HasWaiters() {
		runtime.Gosched()
	}
	clk.Step(4 * time.Second)
	select {
	case <-done:
		t.Fatal("returned before timeout_sec")
	default:
	}
	clk.Step(time.Second)
	if a := <-done; code != http.StatusOK || a.Notice {
		t.Errorf("after timeout_sec: %d %+v; want 200 and the unchanged answer", code, a)
	}
	if code, _, _ := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&timeout_sec=x"); code != http.StatusBadRequest {
		t.Errorf("timeout_sec=x: %d, want 400", code)
	}
	// A timeout_sec whose nanoseconds overflow int64 waits the longest wait (300 s), not 0.
	go func() {
		c, _, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&timeout_sec=9300000000")
		code = c
		done <- a
	}()
	for !clk.HasWaiters() {
		runtime.Gosched()
	}
	clk.Step(podnotice.WaitMax - time.Second)
	select {
	case <-done:
		t.Fatal("a huge timeout_sec returned before 300 s")
	default:
	}
	clk.Step(time.Second)
	if a := <-done; code != http.StatusOK || a.Notice {
		t.Errorf("a huge timeout_sec after 300 s: %d %+v; want 200 and the unchanged answer", code, a)
	}
}

func TestNoticeEndpointWithoutPodNoticeWritesNothing(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.PodNotice, c.NoticeBindAddress = false, "127.0.0.1:0" }, testNode(),
		podWithIP("job", "10.0.0.5", 30))
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, h.clock, 0)
	h.notice(t0.Add(60 * time.Second))
	h.syncAll("job")
	if _, _, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice"); !a.Notice {
		t.Errorf("the endpoint without --pod-notice: %+v, want the notice", a)
	}
	if n := h.a.podNotice.Pending(); n != 0 {
		t.Errorf("%d pod writes queued with --pod-notice=false", n)
	}
}

// waitAsync starts a hanging GET from src in the background and returns once it is either
// waiting on clk or answered.
func waitAsync(t *testing.T, s *podnotice.Endpoint, clk *clocktesting.FakeClock, src, path string) <-chan int {
	t.Helper()
	before := clk.Waiters()
	done := make(chan int, 1)
	go func() {
		code, _, _ := ask(t, s, src, path)
		done <- code
	}()
	for clk.Waiters() == before && len(done) == 0 {
		runtime.Gosched()
	}
	return done
}

// A pod that loops on wait=true about itself gets a few wait slots, not the node's: every
// other pod's wait still hangs (issue 22, item 5).
func TestNoticeAPIWaitSlotsPerPod(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30), podWithIP("hog", "10.0.0.6", 30))
	clk := clocktesting.NewFakeClock(t0)
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, clk, podnotice.WaitersMax)
	const hogPath = "/v1/pods/ns/hog/notice?wait=true&timeout_sec=300"
	var held []<-chan int
	for range podnotice.WaitersMax {
		done := waitAsync(t, s, clk, "10.0.0.6", hogPath)
		if len(done) == 1 {
			if code := <-done; code != http.StatusOK {
				t.Fatalf("the hog's wait past its slots: %d, want 200 at once", code)
			}
			break
		}
		held = append(held, done)
	}
	if len(held) > 8 {
		t.Errorf("one pod holds %d hanging GETs; want a few of its own", len(held))
	}
	job := waitAsync(t, s, clk, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&timeout_sec=60")
	select {
	case code := <-job:
		t.Errorf("the job's wait=true returned at once (%d) while the hog held %d waits; want it to hang", code, len(held))
	default:
		held = append(held, job)
	}
	clk.Step(podnotice.WaitMax)
	for _, d := range held {
		<-d
	}
}

// Two unfinished pods that list the same IP (a node reboot, a sandbox re-created while the
// cache still shows the old pod): a request from it may come from either, so both get 404
// (issue 22, item 6); once one has finished, the other is answered again.
func TestNoticeAPISharedIPAnswersNeither(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30), podWithIP("twin", "10.0.0.5", 30))
	h.notice(t0.Add(120 * time.Second))
	h.syncAll("job", "twin")
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, h.clock, 0)
	for _, name := range []string{"job", "twin"} {
		if code, _, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/"+name+"/notice"); code != http.StatusNotFound {
			t.Errorf("%s from the shared IP: %d %+v; want 404", name, code, a)
		}
	}
	twin := h.pod("twin")
	twin.Status.Phase = v1.PodFailed
	if err := h.a.podInformer.GetIndexer().Update(twin); err != nil {
		t.Fatal(err)
	}
	if code, _, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice"); code != http.StatusOK || !a.Notice {
		t.Errorf("job once the twin has failed: %d %+v; want 200 and its notice", code, a)
	}
}

// A source that is no pod of the node gets its 404 and its connection closed: keeping it
// alive would let a stranger hold the endpoint's connections (issue 22, item 4).
func TestNoticeAPIClosesStrangersConnections(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30), podWithIP("other", "10.0.0.6", 30))
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, h.clock, 0)
	for _, tc := range []struct{ what, src, path string }{
		{"an address of no pod", "192.0.2.1", "/v1/pods/ns/job/notice"},
		{"a neighbour", "10.0.0.6", "/v1/pods/ns/job/notice"},
		{"another path", "10.0.0.5", "/v1/pods/ns/job"},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.RemoteAddr = tc.src + ":40000"
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound || rec.Header().Get("Connection") != "close" {
			t.Errorf("%s: %d, Connection %q; want 404 and close", tc.what, rec.Code, rec.Header().Get("Connection"))
		}
	}
}

// A hanging GET about a pod that is deleted while it waits answers 404, never the pod's last
// notice: at once when the informer reports the deletion, and at its timeout when the cache
// has dropped the pod before the handler ran (issue 20, item 10).
func TestNoticeAPIWaitForgetsADeletedPod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler bool
	}{{"the informer's delete handler ran", true}, {"only the cache has dropped the pod", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, testNode(), podWithIP("job", "10.0.0.5", 30, spotToleration(secs(3600))))
			h.notice(t0.Add(120 * time.Second))
			h.syncAll("job")
			clk := clocktesting.NewFakeClock(t0)
			s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, clk, 0)
			_, etag, a := ask(t, s, "10.0.0.5", "/v1/pods/ns/job/notice")
			if !a.Notice {
				t.Fatalf("before the deletion: %+v, want the notice", a)
			}
			done := waitAsync(t, s, clk, "10.0.0.5", "/v1/pods/ns/job/notice?wait=true&timeout_sec=60&last_etag="+etag)
			pod := h.pod("job")
			if err := h.a.podInformer.GetIndexer().Delete(pod); err != nil {
				t.Fatal(err)
			}
			if tc.handler {
				h.a.podNotice.PodDeleted(pod)
			} else {
				clk.Step(60 * time.Second)
			}
			select {
			case code := <-done:
				if code != http.StatusNotFound {
					t.Errorf("the wait after the deletion: %d, want 404", code)
				}
			case <-time.After(5 * time.Second):
				clk.Step(podnotice.WaitMax)
				t.Errorf("the wait did not return when the pod was deleted (answered %d at its timeout)", <-done)
			}
		})
	}
}

// TestNoticeEndpointListensBeforeReady: once the agent says it is ready, the notice endpoint
// accepts connections. It used to open its listener after /readyz turned ready, and under load
// a pod polling it then was refused (the e2e test saw ready at .98 s, listening at 18.07 s).
func TestNoticeEndpointListensBeforeReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *config.Config) { c.NoticeBindAddress = addr }, testNode())
	dialed := make(chan error, 1)
	h.a.onReady = func() {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		dialed <- err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.a.Run(ctx) }()
	select {
	case err := <-dialed:
		if err != nil {
			t.Errorf("the agent turned ready before its notice endpoint listened: %v", err)
		}
	case err := <-done:
		t.Fatalf("the agent stopped before it was ready: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
