package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

const agentUser = "system:serviceaccount:kube-system:reprieve"

// pods is a PodGetter over a fixed set of pods, counting its calls.
type pods struct {
	byName map[string]*v1.Pod
	err    error
	calls  int
}

func (p *pods) get(_ context.Context, ns, name string) (*v1.Pod, error) {
	p.calls++
	if p.err != nil {
		return nil, p.err
	}
	if pod, ok := p.byName[ns+"/"+name]; ok {
		return pod, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("pods"), name)
}

func pod(name, node string, uid types.UID) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid}, Spec: v1.PodSpec{NodeName: node}}
}

// eviction is an admission request as the API server sends it for POST pods/NAME/eviction.
func eviction(t *testing.T, user, node, name string, uid *types.UID) *admissionv1.AdmissionRequest {
	t.Helper()
	secs := int64(5)
	ev := policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: "ns"},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &secs}}
	if uid != nil {
		ev.DeleteOptions.Preconditions = &metav1.Preconditions{UID: uid}
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	req := &admissionv1.AdmissionRequest{
		UID:         "review-1",
		Resource:    metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		SubResource: "eviction",
		Name:        name, Namespace: "ns",
		Operation: admissionv1.Create,
		UserInfo:  authnv1.UserInfo{Username: user},
		Object:    runtime.RawExtension{Raw: raw},
	}
	if node != "" {
		req.UserInfo.Extra = map[string]authnv1.ExtraValue{NodeClaim: {node}}
	}
	return req
}

func TestReview(t *testing.T) {
	uidA, other := types.UID("uid-a"), types.UID("uid-other")
	cluster := map[string]*v1.Pod{
		"ns/on-a":    pod("on-a", "node-a", uidA),
		"ns/on-b":    pod("on-b", "node-b", "uid-b"),
		"ns/unbound": pod("unbound", "", "uid-u"),
	}
	for _, c := range []struct {
		name      string
		req       func(t *testing.T) *admissionv1.AdmissionRequest
		getErr    error
		allowed   bool
		wantErr   bool
		wantMsg   []string
		wantReads int
	}{
		{name: "own node with the pod's UID", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "on-a", &uidA)
		}, allowed: true, wantReads: 1},
		{name: "own node without a UID precondition (refused without the policy too)", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "on-a", nil)
		}, wantMsg: []string{"UID precondition"}},
		{name: "own node with grace 0", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-a", &uidA)
			r.Object.Raw = []byte(strings.Replace(string(r.Object.Raw), `"gracePeriodSeconds":5`, `"gracePeriodSeconds":0`, 1))
			return r
		}, wantMsg: []string{"gracePeriodSeconds of at least 1"}},
		{name: "own node without a grace", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-a", &uidA)
			r.Object.Raw = []byte(strings.Replace(string(r.Object.Raw), `"gracePeriodSeconds":5`, `"dryRun":["All"]`, 1))
			return r
		}, wantMsg: []string{"gracePeriodSeconds of at least 1"}},
		{name: "another node", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "on-b", &uidA)
		}, wantMsg: []string{"(node-a)", "ns/on-b is on node-b"}, wantReads: 1},
		{name: "an unscheduled pod", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "unbound", &uidA)
		}, wantMsg: []string{"(node-a)", "no node"}, wantReads: 1},
		{name: "own node, another pod's UID", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "on-a", &other)
		}, wantMsg: []string{"uid-other", "uid-a"}, wantReads: 1},
		{name: "no node claim", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "", "on-a", &uidA)
		}, wantMsg: []string{"bound to no node"}},
		{name: "two node claims", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-a", &uidA)
			r.UserInfo.Extra[NodeClaim] = authnv1.ExtraValue{"node-a", "node-b"}
			return r
		}, wantMsg: []string{"bound to no node"}},
		{name: "no such pod", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "gone", &uidA)
		}, wantMsg: []string{"ns/gone not found"}, wantReads: 1},
		{name: "the API fails", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "on-a", &uidA)
		}, getErr: apierrors.NewServiceUnavailable("etcd"), wantErr: true, wantReads: 1},
		{name: "another identity is not judged", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, "system:serviceaccount:kube-system:other", "node-a", "on-b", nil)
		}, allowed: true},
		{name: "a pod delete is not judged", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-b", nil)
			r.SubResource, r.Operation = "", admissionv1.Delete
			return r
		}, allowed: true},
		{name: "a name no pod can have is refused without a read", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "../on-a", &uidA)
		}, wantMsg: []string{"is not a pod name"}},
		{name: "no name", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return eviction(t, agentUser, "node-a", "", &uidA)
		}, wantMsg: []string{"is not a pod name"}},
		{name: "no namespace", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-a", &uidA)
			r.Namespace = ""
			return r
		}, wantMsg: []string{"is not a namespace name"}},
		{name: "an undecodable Eviction", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			r := eviction(t, agentUser, "node-a", "on-a", nil)
			r.Object.Raw = []byte(`{"deleteOptions": 7}`)
			return r
		}, wantMsg: []string{"decoding the Eviction"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &pods{byName: cluster, err: c.getErr}
			h := &Handler{Username: agentUser, GetPod: p.get}
			v, err := h.Review(context.Background(), c.req(t))
			if (err != nil) != c.wantErr {
				t.Fatalf("error %v; want one: %v", err, c.wantErr)
			}
			if v.Allowed != c.allowed {
				t.Errorf("allowed %v (%q); want %v", v.Allowed, v.Message, c.allowed)
			}
			for _, m := range c.wantMsg {
				if !strings.Contains(v.Message, m) {
					t.Errorf("message %q; want it to name %q", v.Message, m)
				}
			}
			if p.calls != c.wantReads {
				t.Errorf("%d pod reads; want %d", p.calls, c.wantReads)
			}
		})
	}
}

// TestServeHTTP posts AdmissionReviews as the API server does and checks the response and the
// counter of each result.
func TestServeHTTP(t *testing.T) {
	uidA := types.UID("uid-a")
	p := &pods{byName: map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", uidA), "ns/on-b": pod("on-b", "node-b", "uid-b")}}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{Username: agentUser, GetPod: p.get, Metrics: m}
	srv := httptest.NewServer(Mux(h, reg, nil))
	defer srv.Close()
	post := func(req *admissionv1.AdmissionRequest) (*http.Response, admissionv1.AdmissionReview) {
		t.Helper()
		b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(srv.URL+PathValidate, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
		}
		return resp, out
	}

	resp, out := post(eviction(t, agentUser, "node-a", "on-a", &uidA))
	if resp.StatusCode != http.StatusOK || out.Response == nil || !out.Response.Allowed || out.Response.UID != "review-1" ||
		out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Errorf("own node: %d %+v; want an allowed v1 AdmissionReview answering review-1", resp.StatusCode, out)
	}
	resp, out = post(eviction(t, agentUser, "node-a", "on-b", &uidA))
	if resp.StatusCode != http.StatusOK || out.Response == nil || out.Response.Allowed || out.Response.Result == nil ||
		out.Response.Result.Code != http.StatusForbidden || out.Response.Result.Message != DeniedMessage("review-1") {
		t.Errorf("node B: %d %+v; want a 403 refusal with the generic message", resp.StatusCode, out.Response)
	}
	p.err = errors.New("connection refused")
	if resp, _ = post(eviction(t, agentUser, "node-a", "on-a", &uidA)); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("the API failing: status %d; want 500, for the API server's failurePolicy", resp.StatusCode)
	}
	if r, err := http.Post(srv.URL+PathValidate, "application/json", strings.NewReader("{}")); err != nil || r.StatusCode != http.StatusBadRequest {
		t.Errorf("a review without a request: %v %v; want 400", r, err)
	} else {
		r.Body.Close()
	}
	if r, err := http.Post(srv.URL+PathValidate, "application/json", strings.NewReader(`{"request":{"uid":"`+strings.Repeat("x", maxReviewBytes)+`"}}`)); err != nil || r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a review of more than %d bytes: %v %v; want 413", maxReviewBytes, r, err)
	} else {
		r.Body.Close()
	}
	// Malformed requests are rejected, not errors: error is the guard failing the API server.
	want := `# HELP reprieve_guard_reviews_total Eviction admission reviews answered by the eviction guard, by result (allowed, denied, error, rejected).
# TYPE reprieve_guard_reviews_total counter
reprieve_guard_reviews_total{result="allowed"} 1
reprieve_guard_reviews_total{result="denied"} 1
reprieve_guard_reviews_total{result="error"} 1
reprieve_guard_reviews_total{result="rejected"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "reprieve_guard_reviews_total"); err != nil {
		t.Error(err)
	}
	for _, path := range []string{PathHealthz, PathReadyz, PathMetrics} {
		r, err := http.Get(srv.URL + path)
		if err != nil || r.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %v %v; want 200", path, r, err)
			continue
		}
		r.Body.Close()
	}
}

// TestForgedReviewsRevealNothing posts, as anyone who reaches the port can, reviews of a pod that
// does not exist, of one on another node, of one that is not scheduled and of one with another
// UID: the responses are the same bytes but for the review's own UID, and none names a pod, a
// node or a UID; the reasons go to the log only.
func TestForgedReviewsRevealNothing(t *testing.T) {
	uidA, other := types.UID("uid-a"), types.UID("uid-other")
	p := &pods{byName: map[string]*v1.Pod{
		"ns/on-a": pod("on-a", "node-a", uidA), "ns/on-b": pod("on-b", "node-b", "uid-b"), "ns/unbound": pod("unbound", "", "uid-u"),
	}}
	h := &Handler{Username: agentUser, GetPod: p.get}
	answer := func(name string, uid *types.UID, reviewUID types.UID) string {
		t.Helper()
		req := eviction(t, agentUser, "node-a", name, uid)
		req.UID = reviewUID
		b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, PathValidate, bytes.NewReader(b)))
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d; want 200", name, rec.Code)
		}
		return strings.ReplaceAll(rec.Body.String(), string(reviewUID), "REVIEW")
	}
	want := answer("gone", &uidA, "r-gone")
	if strings.Contains(want, `"allowed":true`) {
		t.Fatalf("a review of a missing pod was allowed: %s", want)
	}
	for _, c := range []struct {
		what, name string
		uid        *types.UID
	}{
		{"a pod on another node", "on-b", &uidA},
		{"a pod not scheduled", "unbound", &uidA},
		{"a pod on the claimed node with another UID", "on-a", &other},
	} {
		got := answer(c.name, c.uid, types.UID("r-"+c.name))
		if got != want {
			t.Errorf("%s: answered\n%s\nwant what a missing pod gets:\n%s", c.what, got, want)
		}
		for _, leak := range []string{"node-b", "uid-a", "uid-b", "uid-u", "not found", "node"} {
			if strings.Contains(got, leak) {
				t.Errorf("%s: the answer names %q: %s", c.what, leak, got)
			}
		}
	}
}

// TestServeHTTPCallerGone posts a review whose caller hangs up during the pod read, as a forger
// that does not wait can: a rejection, not the guard's error, which says the API server was failed.
func TestServeHTTPCallerGone(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, hangUp := context.WithCancel(context.Background())
	h := &Handler{Username: agentUser, Metrics: m, GetPod: func(ctx context.Context, _, _ string) (*v1.Pod, error) {
		hangUp()
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	uid := types.UID("uid-a")
	b, err := json.Marshal(admissionv1.AdmissionReview{Request: eviction(t, agentUser, "node-a", "on-a", &uid)})
	if err != nil {
		t.Fatal(err)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, PathValidate, bytes.NewReader(b)).WithContext(ctx))
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultError)); got != 0 {
		t.Errorf("error = %v; want 0 for a caller that hung up", got)
	}
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultRejected)); got != 1 {
		t.Errorf("rejected = %v; want 1", got)
	}
}

// TestReviewFromIndex: with the index, a pod it knows is judged without a read, by the node its
// UID is bound to; a pod it has not seen (created a moment ago, or while its watch is down) is
// read; a pod re-created under its name is judged by the pod the UID precondition names.
func TestReviewFromIndex(t *testing.T) {
	uidA, uidB, fresh, oldWeb, newWeb := types.UID("uid-a"), types.UID("uid-b"), types.UID("uid-fresh"), types.UID("uid-web-1"), types.UID("uid-web-2")
	x := NewPodIndex(nil)
	for _, p := range []*v1.Pod{pod("on-a", "node-a", uidA), pod("on-b", "node-b", uidB), pod("web", "node-a", oldWeb)} {
		if err := x.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	// What the API server holds now: on-a and on-b; web re-created on node-b (its old UID gone,
	// the delete not seen by the index yet); fresh, created after the index last heard.
	cluster := map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", uidA), "ns/on-b": pod("on-b", "node-b", uidB),
		"ns/web": pod("web", "node-b", newWeb), "ns/fresh": pod("fresh", "node-a", fresh)}
	for _, c := range []struct {
		name, node, pod string
		uid             types.UID
		allowed         bool
		wantMsg         string
		reads           int
		from            string
	}{
		{name: "a pod on the token's node", node: "node-a", pod: "on-a", uid: uidA, allowed: true, from: FromIndex},
		{name: "a pod on another node", node: "node-a", pod: "on-b", uid: uidB, wantMsg: "ns/on-b is on node-b", from: FromIndex},
		{name: "another pod's UID", node: "node-b", pod: "on-b", uid: uidA, wantMsg: "is another pod's than ns/on-b", from: FromIndex},
		{name: "a pod the index has not seen, on the token's node", node: "node-a", pod: "fresh", uid: fresh, allowed: true, reads: 1, from: FromAPI},
		{name: "a pod the index has not seen, on another node", node: "node-b", pod: "fresh", uid: fresh, wantMsg: "ns/fresh is on node-a", reads: 1, from: FromAPI},
		// Re-created: the new UID is not in the index, so it is read, and judged by its node.
		{name: "a re-created pod's new UID, from its old node", node: "node-a", pod: "web", uid: newWeb, wantMsg: "ns/web is on node-b", reads: 1, from: FromAPI},
		{name: "a re-created pod's new UID, from its node", node: "node-b", pod: "web", uid: newWeb, allowed: true, reads: 1, from: FromAPI},
		// The old UID is the old pod's, on node-a: allowed here, and the API server's
		// precondition refuses it (409), since web's UID is now another (test/e2e checks it).
		{name: "a re-created pod's old UID, from the old pod's node", node: "node-a", pod: "web", uid: oldWeb, allowed: true, from: FromIndex},
		{name: "a re-created pod's old UID, from its new node", node: "node-b", pod: "web", uid: oldWeb, wantMsg: "ns/web is on node-a", from: FromIndex},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			p := &pods{byName: cluster}
			h := &Handler{Username: agentUser, GetPod: p.get, Pods: x, Metrics: m}
			v, err := h.Review(context.Background(), eviction(t, agentUser, c.node, c.pod, &c.uid))
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != c.allowed || !strings.Contains(v.Message, c.wantMsg) {
				t.Errorf("allowed %v (%q); want %v naming %q", v.Allowed, v.Message, c.allowed, c.wantMsg)
			}
			if p.calls != c.reads {
				t.Errorf("%d pod reads; want %d", p.calls, c.reads)
			}
			for _, f := range []string{FromIndex, FromAPI} {
				want := 0.0
				if f == c.from {
					want = 1
				}
				if got := testutil.ToFloat64(m.PodLookups.WithLabelValues(f)); got != want {
					t.Errorf("pod_lookups_total{from=%q} = %v; want %v", f, got, want)
				}
			}
		})
	}
}

// TestIndexSparesTheReadBudget: reviews the index answers take nothing of their source's budget
// of pod reads (a reclaimed pool is not paced by it), while reviews of pods it does not know (as
// a forger's, of pods that do not exist) still meet it; the busiest source's reviews in flight
// are reported.
func TestIndexSparesTheReadBudget(t *testing.T) {
	uidA := types.UID("uid-a")
	x := NewPodIndex(nil)
	if err := x.Add(pod("on-a", "node-a", uidA)); err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.PodReadsPerSecond, l.PodReadBurst = 1, 1
	lim, err := NewLimiter(l, clocktesting.NewFakePassiveClock(time.Unix(1e9, 0)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p := &pods{byName: map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", uidA)}}
	h := &Handler{Username: agentUser, GetPod: p.get, Pods: x, Limits: lim, Metrics: m}
	status := func(name string, uid types.UID) int {
		t.Helper()
		b, err := json.Marshal(admissionv1.AdmissionReview{Request: eviction(t, agentUser, "node-a", name, &uid)})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, PathValidate, bytes.NewReader(b))
		r.RemoteAddr = "10.0.0.1:443"
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	for i := range 200 {
		if code := status("on-a", uidA); code != http.StatusOK {
			t.Fatalf("review %d of a pod the index knows: status %d; want 200 whatever the read budget", i, code)
		}
	}
	if code := status("forged-1", "uid-forged"); code != http.StatusOK {
		t.Errorf("the first review of a pod the index does not know: status %d; want 200 (read: not found)", code)
	}
	if code := status("forged-2", "uid-forged"); code != http.StatusTooManyRequests {
		t.Errorf("the second, past a budget of one read: status %d; want 429", code)
	}
	if p.calls != 1 {
		t.Errorf("%d pod reads; want 1", p.calls)
	}
	if got := testutil.ToFloat64(m.SourceInFlightPeak); got != 1 {
		t.Errorf("source_reviews_in_flight_peak = %v; want 1 (one review at a time)", got)
	}
}

// TestReadyzWaitsForTheIndex: /readyz answers 503 until the index has had its first list.
func TestReadyzWaitsForTheIndex(t *testing.T) {
	x := NewPodIndex(nil)
	srv := httptest.NewServer(Mux(&Handler{Username: agentUser}, prometheus.NewRegistry(), x.IndexReady))
	defer srv.Close()
	code := func() int {
		t.Helper()
		r, err := http.Get(srv.URL + PathReadyz)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if c := code(); c != http.StatusServiceUnavailable {
		t.Errorf("before the first list: %d; want 503", c)
	}
	if err := x.Replace(nil, "1"); err != nil {
		t.Fatal(err)
	}
	if c := code(); c != http.StatusOK {
		t.Errorf("after the first list (of no pod): %d; want 200", c)
	}
}
