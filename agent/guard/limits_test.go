package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestSourceKey(t *testing.T) {
	for _, c := range []struct{ remote, want string }{
		{"127.0.0.2:4431", "127.0.0.2"},
		{"[::ffff:10.0.0.7]:80", "10.0.0.7"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:443", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:443", "fe80::/64"},
		{"pipe", "pipe"},
		{"host:1", "host"},
	} {
		if got := SourceKey(c.remote); got != c.want {
			t.Errorf("SourceKey(%q) = %q; want %q", c.remote, got, c.want)
		}
	}
}

func newTestLimiter(t *testing.T, l Limits) (*Limiter, *clocktesting.FakePassiveClock) {
	t.Helper()
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	lim, err := NewLimiter(l, clk)
	if err != nil {
		t.Fatal(err)
	}
	return lim, clk
}

func TestLimiterInFlight(t *testing.T) {
	lim, _ := newTestLimiter(t, Limits{InFlightPerSource: 2, InFlight: 3, PodReadsPerSecond: 1, PodReadBurst: 1, ConnsPerSource: 1, Conns: 1, Sources: 10})
	var releases []func()
	for i := range 2 {
		r, ok := lim.Acquire("a")
		if !ok {
			t.Fatalf("a's review %d refused; want two in flight", i+1)
		}
		releases = append(releases, r)
	}
	if _, ok := lim.Acquire("a"); ok {
		t.Error("a's third review in flight admitted; want it refused at once")
	}
	rb, ok := lim.Acquire("b")
	if !ok {
		t.Fatal("b refused while a holds its own slots; want b's first review admitted")
	}
	if _, ok := lim.Acquire("c"); ok {
		t.Error("c admitted with three reviews in flight in all; want the overall cap")
	}
	releases[0]()
	releases[0]() // twice: gives back one slot only
	if _, ok := lim.Acquire("a"); !ok {
		t.Error("a refused after it got a slot back")
	}
	if _, ok := lim.Acquire("a"); ok {
		t.Error("a admitted a third time: a release counted twice")
	}
	rb()
}

func TestLimiterReads(t *testing.T) {
	lim, clk := newTestLimiter(t, Limits{InFlightPerSource: 1, InFlight: 1, PodReadsPerSecond: 10, PodReadBurst: 5, ConnsPerSource: 1, Conns: 1, Sources: 10})
	for i := range 5 {
		if !lim.AllowRead("a") {
			t.Fatalf("a's read %d refused within its burst of 5", i+1)
		}
	}
	if lim.AllowRead("a") {
		t.Error("a's sixth read at once allowed; want its budget spent")
	}
	if !lim.AllowRead("b") {
		t.Error("b's first read refused: a spent its own budget, not b's")
	}
	clk.SetTime(clk.Now().Add(100 * time.Millisecond))
	if !lim.AllowRead("a") {
		t.Error("a's read 100 ms later refused; want one token back at 10/s")
	}
	if lim.AllowRead("a") {
		t.Error("a's second read 100 ms later allowed; want only one token back")
	}
}

// TestLimiterForgets checks that a source's state lives only as long as it matters: a quiet
// source is forgotten once its bucket would be full again, a busy one is not, and past Sources
// new sources share one state.
func TestLimiterForgets(t *testing.T) {
	lim, clk := newTestLimiter(t, Limits{InFlightPerSource: 1, InFlight: 10, PodReadsPerSecond: 1, PodReadBurst: 2, ConnsPerSource: 1, Conns: 1, Sources: 2})
	lim.AllowRead("a")
	lim.AllowRead("a")
	release, _ := lim.Acquire("b")
	// c and d, past Sources, share the overflow's state and its bucket of two.
	if !lim.AllowRead("c") || !lim.AllowRead("d") {
		t.Error("c or d refused its first read")
	}
	if n := lim.tracked(); n != 3 {
		t.Errorf("%d sources tracked; want a, b and the overflow", n)
	}
	if lim.AllowRead("e") {
		t.Error("e allowed a read from the overflow bucket c and d emptied; want new sources past Sources to share one budget")
	}
	if lim.AllowRead("a") {
		t.Error("a allowed a read with its bucket empty")
	}
	// Two seconds on, a's and the overflow's buckets are full: both forgotten; b is in flight.
	clk.SetTime(clk.Now().Add(2 * time.Second))
	if !lim.AllowRead("f") {
		t.Error("f refused after the sweep")
	}
	if n := lim.tracked(); n != 2 {
		t.Errorf("%d sources tracked after the sweep; want b (in flight) and f", n)
	}
	release()
}

func TestLimiterShouldLog(t *testing.T) {
	lim, clk := newTestLimiter(t, DefaultLimits())
	if !lim.ShouldLog("a") || lim.ShouldLog("a") || !lim.ShouldLog("b") {
		t.Error("want the first refusal of each source logged, the next one of a not")
	}
	clk.SetTime(clk.Now().Add(rejectLogEvery))
	if !lim.ShouldLog("a") {
		t.Error("a's refusal a minute later not logged")
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Errorf("the default limits: %v", err)
	}
	l := DefaultLimits()
	l.PodReadsPerSecond = 0
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "pod reads per second") {
		t.Errorf("a budget of 0 reads: %v; want an error naming it", err)
	}
	if _, err := NewLimiter(l, clocktesting.NewFakePassiveClock(time.Now())); err == nil {
		t.Error("NewLimiter took a budget of 0 reads")
	}
	// The totals hold at least one source's share (evictionGuard.limits, the chart refuses them too).
	l = DefaultLimits()
	l.InFlight = l.InFlightPerSource - 1
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "reviews in flight") {
		t.Errorf("fewer reviews in flight in all than from one source: %v; want an error naming them", err)
	}
	l = DefaultLimits()
	l.Conns = l.ConnsPerSource - 1
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "connections") {
		t.Errorf("fewer connections in all than from one source: %v; want an error naming them", err)
	}
}

// blockingPods is a PodGetter whose reads wait for release, saying on started when each begins.
type blockingPods struct {
	started chan string
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func (p *blockingPods) get(ctx context.Context, ns, name string) (*v1.Pod, error) {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	p.started <- name
	select {
	case <-p.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return pod(name, "node-a", "uid-a"), nil
}

func reviewBody(t *testing.T, name string) []byte {
	t.Helper()
	uid := types.UID("uid-a")
	b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: eviction(t, agentUser, "node-a", name, &uid)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func postFrom(h http.Handler, remote string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, PathValidate, bytes.NewReader(body))
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHandlerKeepsSourcesApart fills one source's reviews in flight with reads that hang, as a
// flood whose reads are slow would: that source's next review is refused at once (429, rejected,
// no read), and another source's review is still answered.
func TestHandlerKeepsSourcesApart(t *testing.T) {
	p := &blockingPods{started: make(chan string, 10), release: make(chan struct{})}
	lim, _ := newTestLimiter(t, Limits{InFlightPerSource: 2, InFlight: 10, PodReadsPerSecond: 100, PodReadBurst: 100, ConnsPerSource: 1, Conns: 1, Sources: 10})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{Username: agentUser, GetPod: p.get, Limits: lim, Metrics: m}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if w := postFrom(h, "127.0.0.2:1000", reviewBody(t, "on-a")); w.Code != http.StatusOK {
				t.Errorf("a hanging review from the flooding source: %d; want 200 once its read returns", w.Code)
			}
		})
	}
	<-p.started
	<-p.started
	if w := postFrom(h, "127.0.0.2:1001", reviewBody(t, "on-a")); w.Code != http.StatusTooManyRequests {
		t.Errorf("a third review from the flooding source: %d; want 429 at once", w.Code)
	}
	// The other source: its read starts at once although the flood's two hang.
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- postFrom(h, "127.0.0.1:2000", reviewBody(t, "on-a")) }()
	if name := <-p.started; name != "on-a" {
		t.Fatalf("read %q", name)
	}
	close(p.release)
	if w := <-done; w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"allowed":true`) {
		t.Errorf("the other source's review: %d %s; want it allowed", w.Code, w.Body)
	}
	wg.Wait()
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultRejected)); got != 1 {
		t.Errorf("rejected = %v; want 1", got)
	}
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultError)); got != 0 {
		t.Errorf("error = %v; want 0: a refused forgery is not the guard failing", got)
	}
}

// TestHandlerReadBudget spends one source's pod reads: its next review is refused at once without
// a read, and another source's review still reads and is answered.
func TestHandlerReadBudget(t *testing.T) {
	p := &pods{byName: map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", "uid-a")}}
	lim, _ := newTestLimiter(t, Limits{InFlightPerSource: 10, InFlight: 10, PodReadsPerSecond: 1, PodReadBurst: 3, ConnsPerSource: 1, Conns: 1, Sources: 10})
	h := &Handler{Username: agentUser, GetPod: p.get, Limits: lim}
	for i := range 3 {
		if w := postFrom(h, "127.0.0.2:1000", reviewBody(t, "gone")); w.Code != http.StatusOK {
			t.Fatalf("forged review %d: %d; want an answer within the budget", i+1, w.Code)
		}
	}
	if w := postFrom(h, "127.0.0.2:1000", reviewBody(t, "gone")); w.Code != http.StatusTooManyRequests || p.calls != 3 {
		t.Errorf("past the budget: %d after %d reads; want 429 without a fourth read", w.Code, p.calls)
	}
	if w := postFrom(h, "127.0.0.1:1000", reviewBody(t, "on-a")); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"allowed":true`) {
		t.Errorf("another source's review: %d %s; want it allowed", w.Code, w.Body)
	}
}

// TestConnLimitListener opens connections from two loopback sources: past the per-source cap
// the next one from the same source is closed at once, one from the other source is served, and
// a closed connection gives its slot back.
func TestConnLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	var mu sync.Mutex
	ln := connLimitListener(inner, 3, 2, func() { mu.Lock(); refused++; mu.Unlock() })
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Skipf("dialing from %s: %v (a loopback address other than 127.0.0.1 is needed)", src, err)
		}
		return c
	}
	closedAtOnce := func(c net.Conn) bool {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		ne, timeout := err.(net.Error)
		return err != nil && !(timeout && ne.Timeout())
	}
	a1, a2 := dial("127.0.0.2"), dial("127.0.0.2")
	s1, s2 := <-accepted, <-accepted
	a3 := dial("127.0.0.2")
	if !closedAtOnce(a3) {
		t.Error("the third connection from 127.0.0.2 was kept; want it closed at once")
	}
	b1 := dial("127.0.0.1")
	sb := <-accepted
	if _, err := b1.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := sb.Read(make([]byte, 1)); n != 1 || err != nil {
		t.Errorf("the connection from 127.0.0.1: read %d, %v; want it served", n, err)
	}
	// Three open in all: the cap overall refuses another source too.
	if c := dial("127.0.0.3"); !closedAtOnce(c) {
		t.Error("a fourth connection in all was kept; want the overall cap")
	}
	_ = s1.Close()
	_ = a1.Close()
	a4 := dial("127.0.0.2")
	select {
	case c := <-accepted:
		_ = c.Close()
	case <-time.After(5 * time.Second):
		t.Error("a connection from 127.0.0.2 after one of its own closed was not accepted")
	}
	mu.Lock()
	if refused != 2 {
		t.Errorf("%d connections counted refused; want 2", refused)
	}
	mu.Unlock()
	for _, c := range []net.Conn{a2, a4, b1, s2, sb} {
		_ = c.Close()
	}
}

func TestSparseLog(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	var buf bytes.Buffer
	s := &sparseLog{logger: newBufferLogger(&buf), every: time.Minute, clock: clk}
	for range 5 {
		if _, err := s.Write([]byte("http: TLS handshake error\n")); err != nil {
			t.Fatal(err)
		}
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	_, _ = s.Write([]byte("http: TLS handshake error\n"))
	if n := strings.Count(buf.String(), "HTTPS server error"); n != 2 {
		t.Errorf("%d lines for six errors a minute apart at most; want 2:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "droppedSinceLast=4") {
		t.Errorf("the second line does not count the 4 dropped:\n%s", buf.String())
	}
}

func newBufferLogger(buf *bytes.Buffer) klog.Logger {
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(buf)))
}
