package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
)

// t0 is on a whole second, so that Retry-After HTTP dates (second resolution) are exact.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testTimeout bounds every wait on the code under test (real time, never a sleep).
const testTimeout = 10 * time.Second

type answer struct {
	status     int
	retryAfter string
	body       string
}

type request struct {
	header http.Header
	body   string
}

// receiver is a webhook endpoint that answers the i-th request with answers[i], repeating the
// last answer, and records what it received.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	answers []answer
	got     []request
}

func newReceiver(t *testing.T, answers ...answer) *receiver {
	t.Helper()
	r := &receiver{answers: answers}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, request{header: req.Header.Clone(), body: string(body)})
		a := answer{status: http.StatusOK}
		if len(r.answers) > 0 {
			a = r.answers[min(len(r.got), len(r.answers))-1]
		}
		r.mu.Unlock()
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.got...)
}

// countingTransport counts attempts, including those that never reach a receiver.
type countingTransport struct {
	n atomic.Int32
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(req)
}

func testConfig(url string) Config {
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.AllowHTTP = true // httptest servers speak plain HTTP
	return cfg
}

// newTestNotifier returns a notifier on a fake clock with jitter fixed at its minimum, so that
// every backoff wait is exact.
func newTestNotifier(t *testing.T, cfg Config) (*Notifier, *clocktesting.FakeClock, *countingTransport) {
	t.Helper()
	fc := clocktesting.NewFakeClock(t0)
	ct := &countingTransport{}
	n, err := New(cfg, WithClock(fc), WithHTTPClient(&http.Client{Transport: ct}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	n.rand = func() float64 { return 0 }
	return n, fc, ct
}

// deliverAsync runs one delivery in the background; the channel is closed when it returns.
func deliverAsync(ctx context.Context, n *Notifier, m Message) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.deliver(ctx, m)
	}()
	return done
}

// waitDone waits, in real time, for a delivery that needs no backoff to finish.
func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("delivery did not finish")
	}
}

// poll waits, in real time, for cond; it fails the test after testTimeout.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, testTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// driveUntilDone steps the fake clock past every backoff wait until done is closed, and
// returns how many waits there were.
func driveUntilDone(t *testing.T, fc *clocktesting.FakeClock, done <-chan struct{}) int {
	t.Helper()
	waits := 0
	poll(t, "the delivery to finish", func() bool {
		select {
		case <-done:
			return true
		default:
		}
		if fc.HasWaiters() {
			fc.Step(backoffMax)
			waits++
		}
		return false
	})
	return waits
}

func histogramCount(t *testing.T, n *Notifier) uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := n.Register(reg); err != nil {
		t.Fatalf("Register: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "reprieve_webhook_delivery_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no reprieve_webhook_delivery_duration_seconds")
	return 0
}

func TestDefaultBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
	}{
		{"plain", "Spot interruption on node-a: 3 pods to move by 12:02:00"},
		{"quotes", `pod "web-0" said "bye"`},
		{"newlines and tabs", "line one\nline two\r\n\tindented"},
		{"backslashes", `C:\path\to\thing \" not an escape`},
		{"markup and unicode", "<!here> a & b > c — ünïcödé 🚀"},
		{"control characters", "bell\a nul\x00 esc\x1b"},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			rcv := newReceiver(t)
			n, _, _ := newTestNotifier(t, testConfig(rcv.URL))
			waitDone(t, deliverAsync(ctx, n, Message{Kind: KindNotice, Text: tc.text}))

			got := rcv.requests()
			if len(got) != 1 {
				t.Fatalf("receiver got %d requests, want 1", len(got))
			}
			if ct := got[0].header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			var body map[string]any
			if err := json.Unmarshal([]byte(got[0].body), &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", got[0].body, err)
			}
			if len(body) != 1 || body["text"] != tc.text {
				t.Errorf("body = %#v, want exactly {\"text\": %q}", body, tc.text)
			}
			if v := testutil.ToFloat64(n.metrics.delivered); v != 1 {
				t.Errorf("delivered = %v, want 1", v)
			}
		})
	}
}

func TestTemplateAndHeaders(t *testing.T) {
	msg := Message{Kind: KindHandled, Node: "node-a", Provider: "aws", NoticeKind: "spot-interruption", NoticeID: "i-123",
		Action: "terminate", Deadline: t0.Add(2 * time.Minute), Pods: 5, PodsInTime: 4, PodsMissed: 1, Text: `say "hi"`}
	for _, tc := range []struct {
		name        string
		template    string
		headers     map[string]string
		wantBody    string
		wantHeaders map[string]string
	}{
		{
			name:     "custom template and authorization",
			template: `{{.Kind}} {{.Node}} {{.Provider}}/{{.NoticeKind}} {{.NoticeID}} {{.Action}} {{.Pods}}/{{.PodsInTime}}/{{.PodsMissed}} {{.Deadline.Format "15:04:05"}}`,
			headers:  map[string]string{"Authorization": "Bearer s3cret", "X-Reprieve-Cluster": "prod"},
			wantBody: "handled node-a aws/spot-interruption i-123 terminate 5/4/1 12:02:00",
			wantHeaders: map[string]string{"Authorization": "Bearer s3cret", "X-Reprieve-Cluster": "prod",
				"Content-Type": "application/json", "User-Agent": "reprieve"},
		},
		{
			name:        "json func on other fields",
			template:    `{"node": {{json .Node}}, "pods": {{json .Pods}}, "text": {{json .Text}}}`,
			wantBody:    `{"node": "node-a", "pods": 5, "text": "say \"hi\""}`,
			wantHeaders: map[string]string{"Content-Type": "application/json"},
		},
		{
			name:        "content type replaced",
			template:    `{{.Text}}`,
			headers:     map[string]string{"content-type": "text/plain"},
			wantBody:    `say "hi"`,
			wantHeaders: map[string]string{"Content-Type": "text/plain"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			rcv := newReceiver(t)
			cfg := testConfig(rcv.URL)
			cfg.Template, cfg.Headers = tc.template, tc.headers
			n, _, _ := newTestNotifier(t, cfg)
			waitDone(t, deliverAsync(ctx, n, msg))

			got := rcv.requests()
			if len(got) != 1 {
				t.Fatalf("receiver got %d requests, want 1", len(got))
			}
			if got[0].body != tc.wantBody {
				t.Errorf("body = %q, want %q", got[0].body, tc.wantBody)
			}
			for k, want := range tc.wantHeaders {
				if v := got[0].header.Values(k); len(v) != 1 || v[0] != want {
					t.Errorf("header %s = %q, want [%q]", k, v, want)
				}
			}
		})
	}
}

func TestRetries(t *testing.T) {
	for _, tc := range []struct {
		name         string
		answers      []answer
		down         bool // the receiver's listener is closed
		hang         bool // the receiver never answers
		maxAttempts  int
		wantAttempts int
		wantOutcome  string
	}{
		{name: "500 twice then 200", answers: []answer{{status: 500}, {status: 500}, {status: 200}},
			maxAttempts: 4, wantAttempts: 3, wantOutcome: OutcomeDelivered},
		{name: "always 503", answers: []answer{{status: 503, body: "busy"}},
			maxAttempts: 4, wantAttempts: 4, wantOutcome: OutcomeFailed},
		{name: "receiver down", down: true,
			maxAttempts: 3, wantAttempts: 3, wantOutcome: OutcomeFailed},
		{name: "attempt timeout", hang: true,
			maxAttempts: 2, wantAttempts: 2, wantOutcome: OutcomeFailed},
		{name: "400 not retried", answers: []answer{{status: 400, body: "invalid_payload"}, {status: 200}},
			maxAttempts: 4, wantAttempts: 1, wantOutcome: OutcomeFailed},
		{name: "404 not retried", answers: []answer{{status: 404, body: "no_service"}, {status: 200}},
			maxAttempts: 4, wantAttempts: 1, wantOutcome: OutcomeFailed},
		{name: "429 retried", answers: []answer{{status: 429}, {status: 200}},
			maxAttempts: 4, wantAttempts: 2, wantOutcome: OutcomeDelivered},
		{name: "one attempt allowed", answers: []answer{{status: 500}, {status: 200}},
			maxAttempts: 1, wantAttempts: 1, wantOutcome: OutcomeFailed},
		{name: "first try", maxAttempts: 4, wantAttempts: 1, wantOutcome: OutcomeDelivered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			var url string
			switch {
			case tc.down:
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				url = "http://" + l.Addr().String() + "/hook"
				_ = l.Close()
			case tc.hang:
				release := make(chan struct{})
				srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
					// The server notices the client hanging up only once the body is read.
					_, _ = io.ReadAll(r.Body)
					select {
					case <-r.Context().Done(): // the attempt's timeout closed the connection
					case <-release:
					}
				}))
				t.Cleanup(srv.Close)
				t.Cleanup(func() { close(release) }) // runs first
				url = srv.URL
			default:
				url = newReceiver(t, tc.answers...).URL
			}
			cfg := testConfig(url)
			cfg.MaxAttempts = tc.maxAttempts
			if tc.hang {
				cfg.Timeout = 20 * time.Millisecond
			}
			n, fc, ct := newTestNotifier(t, cfg)

			waits := driveUntilDone(t, fc, deliverAsync(ctx, n, Message{Kind: KindNotice, Text: "x"}))

			if got := int(ct.n.Load()); got != tc.wantAttempts {
				t.Errorf("attempts = %d, want %d", got, tc.wantAttempts)
			}
			if waits != tc.wantAttempts-1 {
				t.Errorf("backoff waits = %d, want %d", waits, tc.wantAttempts-1)
			}
			want := map[string]float64{OutcomeDelivered: 0, OutcomeFailed: 0, OutcomeDropped: 0}
			want[tc.wantOutcome] = 1
			for outcome, w := range want {
				if v := testutil.ToFloat64(n.metrics.deliveries.WithLabelValues(outcome)); v != w {
					t.Errorf("deliveries{outcome=%q} = %v, want %v", outcome, v, w)
				}
			}
			if c := histogramCount(t, n); c != 1 {
				t.Errorf("duration observations = %d, want 1 per message", c)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		wantWait   time.Duration
	}{
		{"429 seconds", 429, "7", 7 * time.Second},
		{"429 http date", 429, t0.Add(9 * time.Second).Format(http.TimeFormat), 9 * time.Second},
		{"503 seconds", 503, "3", 3 * time.Second},
		{"capped", 429, "3600", backoffMax},
		{"absent: backoff", 429, "", backoffBase / 2},
		{"garbage: backoff", 429, "soon", backoffBase / 2},
		{"shorter than backoff: backoff", 429, "0", backoffBase / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			rcv := newReceiver(t, answer{status: tc.status, retryAfter: tc.retryAfter}, answer{status: 200})
			n, fc, _ := newTestNotifier(t, testConfig(rcv.URL))
			done := deliverAsync(ctx, n, Message{Kind: KindNotice, Text: "x"})

			poll(t, "the backoff wait", fc.HasWaiters)
			fc.Step(tc.wantWait - time.Millisecond)
			// Step fires due timers synchronously, so a timer shorter than wantWait is gone now.
			if !fc.HasWaiters() {
				t.Fatalf("retried before %s", tc.wantWait)
			}
			fc.Step(time.Millisecond)
			if fc.HasWaiters() {
				t.Fatalf("still waiting after %s", tc.wantWait)
			}
			waitDone(t, done)
			if got := len(rcv.requests()); got != 2 {
				t.Errorf("requests = %d, want 2", got)
			}
			if v := testutil.ToFloat64(n.metrics.delivered); v != 1 {
				t.Errorf("delivered = %v, want 1", v)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		name       string
		attempt    int
		retryAfter time.Duration
		r          float64
		want       time.Duration
	}{
		{"first, least jitter", 1, 0, 0, 250 * time.Millisecond},
		{"first, most jitter", 1, 0, 0.999, 499750 * time.Microsecond},
		{"doubles", 3, 0, 0, time.Second},
		{"capped", 7, 0, 0, backoffMax / 2},
		{"capped with jitter", 7, 0, 0.999, backoffMax/2 + time.Duration(0.999*float64(backoffMax/2))},
		{"no overflow", 100, 0, 0, backoffMax / 2},
		{"retry-after longer", 1, 7 * time.Second, 0.5, 7 * time.Second},
		{"retry-after shorter", 4, time.Second, 0, 2 * time.Second},
		{"retry-after capped", 1, time.Hour, 0, backoffMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := backoff(tc.attempt, tc.retryAfter, tc.r); got != tc.want {
				t.Errorf("backoff(%d, %s, %v) = %s, want %s", tc.attempt, tc.retryAfter, tc.r, got, tc.want)
			}
		})
	}
}

func TestReadSnippet(t *testing.T) {
	long := strings.Repeat("a", bodyLogLimit+10)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"short", "invalid_token", "invalid_token"},
		{"at limit", long[:bodyLogLimit], long[:bodyLogLimit]},
		{"truncated", long, long[:bodyLogLimit] + "...(truncated)"},
		{"invalid utf-8", "a\xffb", "a?b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := readSnippet(strings.NewReader(tc.in)); got != tc.want {
				t.Errorf("readSnippet = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNotifyNeverBlocks(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:9/hook") // never contacted: Run is not started
	cfg.QueueSize = 2
	n, _, _ := newTestNotifier(t, cfg)
	for i := range cfg.QueueSize {
		if !n.Notify(Message{Kind: KindNotice}) {
			t.Fatalf("Notify #%d into a queue with room returned false", i+1)
		}
	}
	res := make(chan bool, 1)
	go func() { res <- n.Notify(Message{Kind: KindNotice}) }()
	select {
	case ok := <-res:
		if ok {
			t.Error("Notify into a full queue returned true")
		}
	case <-time.After(testTimeout):
		t.Fatal("Notify blocked on a full queue")
	}
	if v := testutil.ToFloat64(n.metrics.dropped); v != 1 {
		t.Errorf("dropped = %v, want 1", v)
	}
	if n.unlogged.Load() != 1 {
		t.Errorf("unlogged drops = %d, want 1", n.unlogged.Load())
	}

	var nilNotifier *Notifier
	if nilNotifier.Notify(Message{}) {
		t.Error("nil Notifier's Notify returned true")
	}
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name        string
		answers     []answer
		queued      int
		waitFor     string // "delivered": all queued delivered; "backoff": the first is in backoff
		wantCounts  map[string]float64
		wantQueued  int // requests the receiver got
		afterCancel bool
	}{
		{name: "idle", wantCounts: map[string]float64{}},
		{name: "delivers the queue", queued: 3, waitFor: "delivered",
			wantCounts: map[string]float64{OutcomeDelivered: 3}, wantQueued: 3},
		{name: "drops the rest on cancel", answers: []answer{{status: 500}}, queued: 3, waitFor: "backoff",
			wantCounts: map[string]float64{OutcomeDropped: 3}, wantQueued: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			rcv := newReceiver(t, tc.answers...)
			n, fc, _ := newTestNotifier(t, testConfig(rcv.URL))
			for i := range tc.queued {
				if !n.Notify(Message{Kind: KindNotice, Text: string(rune('a' + i))}) {
					t.Fatalf("Notify #%d returned false", i+1)
				}
			}
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				n.Run(ctx)
			}()
			switch tc.waitFor {
			case "delivered":
				poll(t, "deliveries", func() bool { return testutil.ToFloat64(n.metrics.delivered) == float64(tc.queued) })
			case "backoff":
				poll(t, "the backoff wait", fc.HasWaiters)
			}
			cancel()
			select {
			case <-stopped:
			case <-time.After(testTimeout):
				t.Fatal("Run did not return after its context was cancelled")
			}

			for _, outcome := range []string{OutcomeDelivered, OutcomeFailed, OutcomeDropped} {
				if v := testutil.ToFloat64(n.metrics.deliveries.WithLabelValues(outcome)); v != tc.wantCounts[outcome] {
					t.Errorf("deliveries{outcome=%q} = %v, want %v", outcome, v, tc.wantCounts[outcome])
				}
			}
			got := rcv.requests()
			if len(got) != tc.wantQueued {
				t.Errorf("receiver got %d requests, want %d", len(got), tc.wantQueued)
			}
			if tc.waitFor == "delivered" {
				for i, r := range got {
					if want := `{"text": "` + string(rune('a'+i)) + `"}`; r.body != want {
						t.Errorf("request %d body = %q, want %q (in queue order)", i, r.body, want)
					}
				}
			}
			// Once Run has stopped nothing would deliver a message: it is dropped at once.
			before := testutil.ToFloat64(n.metrics.dropped)
			if n.Notify(Message{Kind: KindHandled}) {
				t.Error("Notify after Run stopped returned true")
			}
			if v := testutil.ToFloat64(n.metrics.dropped); v != before+1 {
				t.Errorf("dropped = %v after a Notify on a stopped notifier, want %v", v, before+1)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	n, _, _ := newTestNotifier(t, testConfig("https://hooks.example.com/x"))
	reg := prometheus.NewPedanticRegistry()
	if err := n.Register(reg); err != nil {
		t.Fatalf("Register: %v", err)
	}
	want := `
# HELP reprieve_webhook_deliveries_total Webhook messages by outcome: delivered, failed (after retries, or refused), dropped (queue full or shutting down).
# TYPE reprieve_webhook_deliveries_total counter
reprieve_webhook_deliveries_total{outcome="delivered"} 0
reprieve_webhook_deliveries_total{outcome="dropped"} 0
reprieve_webhook_deliveries_total{outcome="failed"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "reprieve_webhook_deliveries_total"); err != nil {
		t.Error(err)
	}
	if c, err := testutil.GatherAndCount(reg, "reprieve_webhook_delivery_duration_seconds"); err != nil || c != 1 {
		t.Errorf("duration histogram: %d series, err %v; want 1", c, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if err := n.Register(reg); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
}

func TestValidate(t *testing.T) {
	valid := testConfig("https://hooks.slack.com/services/T000/B000/s3cretT0ken")
	for _, tc := range []struct {
		name   string
		modify func(*Config)
		want   []string // substrings of the error; none: valid
	}{
		{name: "defaults", modify: func(*Config) {}},
		{name: "http allowed", modify: func(c *Config) { c.URL = "http://10.0.0.1:8080/hook" }},
		{name: "http not allowed", modify: func(c *Config) { c.URL = "http://10.0.0.1:8080/hook"; c.AllowHTTP = false },
			want: []string{`scheme "http"`, "--webhook-allow-http"}},
		{name: "custom template and headers", modify: func(c *Config) {
			c.Template = `{{.Node}}: {{json .Text}}`
			c.Headers = map[string]string{"Authorization": "Bearer x"}
		}},
		{name: "no url", modify: func(c *Config) { c.URL = "" }, want: []string{"webhook url is empty"}},
		{name: "bad scheme", modify: func(c *Config) { c.URL = "ftp://example.com/hook" }, want: []string{`scheme "ftp"`}},
		{name: "no scheme", modify: func(c *Config) { c.URL = "hooks.slack.com/services/x" }, want: []string{`scheme ""`}},
		{name: "no host", modify: func(c *Config) { c.URL = "https:///path" }, want: []string{"no host"}},
		{name: "unparsable url", modify: func(c *Config) { c.URL = "https://exa mple.com/s3cretT0ken" }, want: []string{"does not parse", "invalid character"}},
		{name: "template does not parse", modify: func(c *Config) { c.Template = `{"text": {{json .Text}` },
			want: []string{"webhook template does not parse", `template: webhook:1: bad character U+007D`}},
		{name: "unknown func", modify: func(c *Config) { c.Template = `{{yaml .Text}}` },
			want: []string{"does not parse", `function "yaml" not defined`}},
		{name: "unknown field", modify: func(c *Config) { c.Template = `{{.Nodename}}` },
			want: []string{"fails on a sample message", "can't evaluate field Nodename"}},
		{name: "bad header name", modify: func(c *Config) { c.Headers = map[string]string{"X Bad": "v"} },
			want: []string{`webhook header "X Bad"`, "invalid character ' '"}},
		{name: "header value with newline", modify: func(c *Config) { c.Headers = map[string]string{"X-A": "a\r\nX-Injected: b"} },
			want: []string{`webhook header "X-A"`, "line break"}},
		{name: "same header twice", modify: func(c *Config) { c.Headers = map[string]string{"x-a": "1", "X-A": "2"} },
			want: []string{"the same header twice"}},
		{name: "zero timeout", modify: func(c *Config) { c.Timeout = 0 }, want: []string{"webhook timeout 0s: must be positive"}},
		{name: "negative attempts", modify: func(c *Config) { c.MaxAttempts = -1 }, want: []string{"webhook max attempts -1: must be positive"}},
		{name: "zero queue", modify: func(c *Config) { c.QueueSize = 0 }, want: []string{"webhook queue size 0: must be positive"}},
		{name: "every problem at once", modify: func(c *Config) { *c = Config{URL: "ftp://x", Template: "{{"} },
			want: []string{`scheme "ftp"`, "template does not parse", "timeout", "max attempts", "queue size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid
			tc.modify(&cfg)
			err := cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if _, err := New(cfg); err != nil {
					t.Fatalf("New with a valid config: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "s3cretT0ken") {
				t.Errorf("Validate() = %q leaks the URL's token", err)
			}
			if _, err := New(cfg); err == nil {
				t.Error("New accepted a config that Validate refuses")
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   []string
		want    map[string]string
		wantErr []string
	}{
		{name: "none", flags: nil, want: map[string]string{}},
		{name: "several", flags: []string{"Authorization: Bearer s3cret", "x-team:  sre ", "X-Url: https://a:b@c"},
			want: map[string]string{"Authorization": "Bearer s3cret", "X-Team": "sre", "X-Url": "https://a:b@c"}},
		{name: "empty value", flags: []string{"X-Empty:"}, want: map[string]string{"X-Empty": ""}},
		{name: "no colon", flags: []string{"X-Ok: 1", "Authorization Bearer s3cret"},
			wantErr: []string{"--webhook-header #2: no colon"}},
		{name: "empty name", flags: []string{" : s3cret"}, wantErr: []string{`#1 (""): empty header name`}},
		{name: "bad name", flags: []string{"X Team: s3cret"}, wantErr: []string{`#1 ("X Team"): header name has invalid character ' '`}},
		{name: "duplicate", flags: []string{"X-A: 1", "x-a: s3cret"}, wantErr: []string{`#2 ("x-a"): header given more than once`}},
		{name: "every bad entry", flags: []string{"nocolon", "X-Ok: 1", "B@d: s3cret"},
			wantErr: []string{"#1: no colon", `#3 ("B@d")`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHeaders(tc.flags)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParseHeaders(%q) = %v, nil; want an error", tc.flags, got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("error %q leaks a header value", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseHeaders(%q): %v", tc.flags, err)
			}
			if len(got) != len(tc.want) {
				t.Errorf("ParseHeaders(%q) = %q, want %q", tc.flags, got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("header %s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestFlushDeliversTheQueue (issue 12 item 7): an agent stopping after an interruption flushes
// the queued messages rather than dropping them, and Run then returns.
func TestFlushDeliversTheQueue(t *testing.T) {
	r := newReceiver(t)
	n, _, _ := newTestNotifier(t, testConfig(r.URL))
	for i := range 3 {
		if !n.Notify(Message{Kind: KindNotice, Node: "n1", Text: fmt.Sprint("m", i)}) {
			t.Fatal("message dropped before the flush")
		}
	}
	n.Flush()
	done := make(chan struct{})
	go func() { defer close(done); n.Run(context.Background()) }()
	waitDone(t, done)
	if got := len(r.requests()); got != 3 {
		t.Errorf("delivered %d messages, want the 3 queued", got)
	}
	if n.Notify(Message{Kind: KindNotice}) {
		t.Error("a message after the flush was accepted")
	}
}
