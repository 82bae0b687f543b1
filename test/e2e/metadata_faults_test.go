package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/fakes/faultproxy"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// faultPhase is how long each fault lasts: long enough for two or three polls at the 1 s
// interval, and for a hanging poll to reach its 3 s timeout.
const faultPhase = 3500 * time.Millisecond

// metadataCloud is one cloud's metadata endpoint behind the fault proxy.
type metadataCloud struct {
	provider string
	// faults are the faults this cloud's endpoint can show, in the order the test plays them.
	faults []faultproxy.Mode
	// outcomes are the reprieve_metadata_requests_total outcomes the faults must have produced.
	outcomes []string
	// start serves the backend and returns its URL, the flags that point reprieve at proxyURL,
	// a function that posts the notice (returning when it became visible), one that withdraws
	// it (nil where the cloud never withdraws one), and a stop function.
	start func(ctx context.Context, t *testing.T, node, proxyURL string) (backend string, args []string, post func() time.Time, withdraw func(), stop func())
}

var everyFault = []faultproxy.Mode{faultproxy.ServerError, faultproxy.Hang, faultproxy.Malformed, faultproxy.Truncated, faultproxy.Throttled, faultproxy.Reset}

// TestMetadataFaults: for each cloud, the metadata endpoint is down when the agent starts, then
// answers with 5xx, hangs, malformed and truncated bodies, 429, reset connections and (AWS) 401s.
// The agent stays up, invents no notice, counts each failure in its metrics and logs it, and
// once the endpoint is healthy catches the real notice within two poll intervals. Where the cloud
// can withdraw a notice (GCP, Azure), withdrawing it mid-flight undoes the taint and evicts
// nothing.
func TestMetadataFaults(t *testing.T) {
	t.Parallel()
	for _, c := range []metadataCloud{awsFaults(), gcpFaults(), azureFaults()} {
		t.Run(c.provider, func(t *testing.T) {
			t.Parallel()
			runMetadataFaults(t, c)
		})
	}
}

func runMetadataFaults(t *testing.T, c metadataCloud) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns, node := "mdfaults-"+c.provider, "mdfaults-"+c.provider+"-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// A pod that tolerates the taint for 20 s: a withdrawn notice must leave it running.
	if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{{Name: "stay", Kind: scenario.Plain, Tolerate: ptr64(20), Grace: ptr64(1)}}); err != nil {
		t.Fatal(err)
	}

	// The endpoint is down when the agent starts: the proxy's address is chosen, not served.
	addr, err := faultproxy.ReserveAddr()
	if err != nil {
		t.Fatal(err)
	}
	backend, args, post, withdraw, stop := c.start(ctx, t, node, "http://"+addr)
	defer stop()
	proxy, err := faultproxy.New(backend)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const downFor = 3 * time.Second
	up := time.AfterFunc(downFor, func() {
		if _, err := proxy.Start(addr); err != nil {
			t.Errorf("starting the proxy: %v", err)
		}
	})
	defer up.Stop()
	// Ready only once the provider answered: StartReprieve's wait spans the outage.
	rp, metricsAddr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append([]string{"--kubeconfig=" + agentKubeconfig}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	// Ready as soon as it has tried the provider once; the faults start after its first answer.
	var text string
	waitFor(ctx, t, "a first answer from the endpoint", func() bool {
		text, err = scenario.Scrape(metricsAddr)
		return err == nil && sumMetric(text, fmt.Sprintf(`reprieve_metadata_polls_total{outcome="ok",provider=%q}`, c.provider)) > 0
	})
	if got := sumMetric(text, fmt.Sprintf(`reprieve_metadata_requests_total{outcome="error",provider=%q}`, c.provider)); got == 0 {
		t.Errorf("the endpoint down at start: no failed request counted: %s", grep(text, "reprieve_metadata_requests_total"))
	}

	for _, f := range c.faults {
		proxy.Set(f)
		select {
		case <-time.After(faultPhase):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		if rp.Exited() {
			t.Fatalf("reprieve exited during %s: %s\n%s", f, rp.ExitDescription(), rp.LogTail(30))
		}
		if n := proxy.Count(f); n == 0 {
			t.Errorf("%s: no request reached the fault", f)
		}
	}
	// No false notice: nothing on the node, nothing received, no NoticeReceived event.
	n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hasTaint(n, taint.Key, taint.Effect) || n.Annotations[record.AnnotationReclaimDeadline] != "" {
		t.Errorf("the faults made a notice: taints %v, annotations %v", n.Spec.Taints, n.Annotations)
	}
	text, err = scenario.Scrape(metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if got := sumMetric(text, "reprieve_notices_received_total"); got != 0 {
		t.Errorf("reprieve_notices_received_total sums to %v during the faults, want 0", got)
	}
	if evs := noticeEvents(ctx, t, node); len(evs) != 0 {
		t.Errorf("notice events during the faults: %v", evs)
	}
	// Each failure is counted and logged.
	for _, o := range c.outcomes {
		if got := sumMetric(text, fmt.Sprintf(`reprieve_metadata_requests_total{outcome=%q,provider=%q}`, o, c.provider)); got == 0 {
			t.Errorf("no %s request counted: %s", o, grep(text, "reprieve_metadata_requests_total"))
		}
	}
	if got := sumMetric(text, fmt.Sprintf(`reprieve_metadata_polls_total{outcome="error",provider=%q}`, c.provider)); got == 0 {
		t.Errorf("no failed poll counted: %s", grep(text, "reprieve_metadata_polls_total"))
	}
	if log := rp.LogTail(2000); !strings.Contains(log, "Polling the provider failed") {
		t.Error("no 'Polling the provider failed' log line")
	}

	// Healthy again, then the real notice: caught within two poll intervals.
	proxy.Set(faultproxy.Pass)
	healthy := time.Now()
	visible := post()
	from := visible
	if healthy.After(from) {
		from = healthy
	}
	n = waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	seen := time.Now()
	// Two poll intervals, plus the write and this test's 50 ms polling of the node.
	if lag := seen.Sub(from); lag > 2*time.Second+700*time.Millisecond {
		t.Errorf("taint seen %v after the endpoint was healthy with the notice, want within two 1 s poll intervals", lag.Round(time.Millisecond))
	} else {
		t.Logf("notice caught %v after the endpoint recovered with it", lag.Round(time.Millisecond))
	}
	if withdraw == nil {
		return
	}

	// Withdrawn mid-flight: the taint goes, the deadline gauge returns to 0, nothing is evicted.
	withdraw()
	waitNode(ctx, t, node, "the taint removed", func(n *v1.Node) bool {
		return !hasTaint(n, taint.Key, taint.Effect) && n.Annotations[record.AnnotationReclaimDeadline] == ""
	})
	// The agent sets the gauge right after its node write, so the scrape may come first by a
	// hair: wait for it briefly rather than race it.
	gaugeCtx, cancelGauge := context.WithTimeout(ctx, 3*time.Second)
	defer cancelGauge()
	waitFor(gaugeCtx, t, "the deadline gauge back to 0 after the withdrawal", func() bool {
		text, err = scenario.Scrape(metricsAddr)
		return err == nil && strings.Contains(text, "reprieve_notices_reclaim_deadline_timestamp_seconds 0")
	})
	if got := sumMetric(text, "reprieve_evictions_requests_total"); got != 0 {
		t.Errorf("evictions after a withdrawn notice: %s", grep(text, "reprieve_evictions_requests_total"))
	}
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, "stay", metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("the tolerating pod after the withdrawal: %v, %v; want it running", pod, err)
	}
	if evs := nodeEvents(ctx, t, node, events.ReasonNoticeWithdrawn); len(evs) == 0 {
		t.Error("no NoticeWithdrawn event")
	}
}

func awsFaults() metadataCloud {
	return metadataCloud{
		provider: "aws",
		faults:   append(append([]faultproxy.Mode{}, everyFault...), faultproxy.Unauthorized),
		outcomes: []string{"server_error", "error", "throttled", "client_error"},
		start: func(ctx context.Context, t *testing.T, _, proxyURL string) (string, []string, func() time.Time, func(), func()) {
			// The mock shows the spot notice a fixed delay after it starts: after the agent's
			// start, the outage and every fault.
			delay := 36 * time.Second
			start := time.Now()
			deadline := start.Add(delay + 2*time.Minute).Truncate(time.Second)
			// The rebalance recommendation, which the mock serves from its start by default,
			// comes with the spot notice: during the faults there is nothing to find.
			secs := strconv.Itoa(int(delay / time.Second))
			mock, endpoint, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2", "--mock-delay-sec="+secs, "--rebalance-delay-sec="+secs,
				"spot", "--action=terminate", "--time="+deadline.UTC().Format(time.RFC3339))
			if err != nil {
				t.Fatal(err)
			}
			post := func() time.Time {
				// The mock, not the test, decides when the notice shows: wait for that moment.
				at := start.Add(delay)
				wait := time.Until(at)
				if wait <= 0 {
					t.Fatalf("the faults outlasted the mock's %v delay; the notice was visible %v before the endpoint recovered", delay, -wait)
				}
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					t.Fatal(ctx.Err())
				}
				return at
			}
			return endpoint, []string{"--provider=aws", "--aws-imds-endpoint=" + proxyURL}, post, nil, func() { _ = mock.Stop() }
		},
	}
}

func gcpFaults() metadataCloud {
	return metadataCloud{
		provider: "gcp",
		faults:   everyFault,
		outcomes: []string{"server_error", "error", "throttled"},
		start: func(_ context.Context, t *testing.T, _, proxyURL string) (string, []string, func() time.Time, func(), func()) {
			srv := gcpmeta.New()
			url, err := srv.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			post := func() time.Time { srv.Set(gcpmeta.PathPreempted, "TRUE"); return time.Now() }
			withdraw := func() { srv.Set(gcpmeta.PathPreempted, "FALSE") }
			return url, []string{"--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(proxyURL, "http://")}, post, withdraw, func() { _ = srv.Close() }
		},
	}
}

func azureFaults() metadataCloud {
	return metadataCloud{
		provider: "azure",
		faults:   everyFault,
		outcomes: []string{"server_error", "error", "throttled"},
		start: func(_ context.Context, t *testing.T, node, proxyURL string) (string, []string, func() time.Time, func(), func()) {
			srv := azureevents.New(node)
			url, err := srv.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var id string
			post := func() time.Time {
				id = srv.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{node},
					NotBefore: time.Now().Add(45 * time.Second).Truncate(time.Second), DurationInSeconds: -1})
				return time.Now()
			}
			withdraw := func() { srv.RemoveEvent(id) }
			return url, []string{"--provider=azure", "--azure-imds-endpoint=" + proxyURL, "--azure-resource-name=" + node}, post, withdraw, srv.Close
		},
	}
}

// sumMetric sums the samples of text whose name (with labels, when prefix has them) starts with
// prefix.
func sumMetric(text, prefix string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, prefix) || (!strings.Contains(prefix, "{") && !strings.HasPrefix(l[len(prefix):], "{") && !strings.HasPrefix(l[len(prefix):], " ")) {
			continue
		}
		if v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func nodeEvents(ctx context.Context, t *testing.T, node, reason string) []string {
	t.Helper()
	evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + node + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}

// noticeEvents returns the reason and message of every event about node that reports a notice,
// whatever its kind (events.NoticeReason).
func noticeEvents(ctx context.Context, t *testing.T, node string) []string {
	t.Helper()
	reasons := map[string]bool{events.ReasonNoticeReceived: true}
	for _, k := range providers.Kinds {
		reasons[events.NoticeReason(k)] = true
	}
	evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if reasons[e.Reason] {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}
