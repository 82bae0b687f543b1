package e2e

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// slowBodyCounts are a slow-body flood's connections.
type slowBodyCounts struct {
	// open is how many connections hold the guard now; peak the most at once.
	open, peak, opened, closedAtOnce atomic.Int64
}

// startSlowBodies opens conns connections to the guard from the loopback address src, each of
// which sends a review's headers with Content-Length: 4096 and then no body, and opens a new one
// whenever the guard closes one, until stop is called: issue 39 item 1's holder of review slots,
// which costs its sender nothing but the connections.
func startSlowBodies(t *testing.T, host, src string, conns int) (counts *slowBodyCounts, stop func()) {
	t.Helper()
	counts = &slowBodyCounts{}
	done := make(chan struct{})
	head := "POST " + guard.PathValidate + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
				c, err := tls.DialWithDialer(d, "tcp", host, &tls.Config{InsecureSkipVerify: true})
				if err != nil {
					// Closed before or during the handshake: past the guard's connection caps.
					counts.closedAtOnce.Add(1)
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				counts.opened.Add(1)
				if n := counts.open.Add(1); n > counts.peak.Load() {
					counts.peak.Store(n) // racy maximum; a lower bound is all the test needs
				}
				if _, err := c.Write([]byte(head)); err == nil {
					// Wait for the guard to give up on the body (or the test to end).
					closed := make(chan struct{})
					go func() { _, _ = c.Read(make([]byte, 1)); close(closed) }()
					select {
					case <-closed:
					case <-done:
					}
				}
				_ = c.Close()
				counts.open.Add(-1)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return counts, stop
}

// startPacedFlood posts complete forged reviews from src at rate a second (as far as the guard
// answers them), each of another pod name so that each would cost the guard a pod read, until
// stop is called: issue 39 item 1's second route.
func startPacedFlood(t *testing.T, host, src, sa, ns, node string, rate int) (counts *floodCounts, stop func()) {
	t.Helper()
	bodies := make([][]byte, 500)
	for i := range bodies {
		bodies[i] = forgedReview(t, fmt.Sprintf("paced-%s-%d", src, i), sa, ns, node, fmt.Sprintf("forged-%s-%d", strings.ReplaceAll(src, ".", "-"), i), "uid-forged")
	}
	counts = &floodCounts{}
	const workers = 16
	c := attacker(src, workers)
	c.Timeout = 5 * time.Second
	done := make(chan struct{})
	work := make(chan []byte)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for b := range work {
				code, _, err := post(c, host, b)
				switch {
				case err != nil:
					counts.failed.Add(1)
				case code == http.StatusOK:
					counts.answered.Add(1)
				default:
					counts.refused.Add(1)
				}
			}
		})
	}
	wg.Go(func() {
		defer close(work)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			select {
			case work <- bodies[i%len(bodies)]:
				counts.sent.Add(1)
			default: // every worker busy: the guard is slower than the pace
				counts.busy.Add(1)
			}
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait(); c.CloseIdleConnections() }) }
	t.Cleanup(stop)
	return counts, stop
}

// TestSecurityGuardUnderSlowBodiesAndForgedReviews is issue 39 item 1 tried on the real API
// server with the guard as the chart runs it (its default limits, no client certificate): from
// four loopback addresses, 64 connections each send a review's headers and no body, renewed
// whenever the guard closes them; from three more, complete forged reviews of pods that do not
// exist arrive at 50 a second each. Meanwhile node A's agent token evicts a pod on A as the agent
// does (dry runs, every 100 ms), and then the real agent drains node A through an interruption.
// Every real review must be answered (allowed) within 1 s, the agent must evict every pod through
// the Eviction API (no failed webhook call, no DELETE fallback), and no forged review may count as
// the guard's error.
func TestSecurityGuardUnderSlowBodiesAndForgedReviews(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "secguard", "reprieve-secguard", "secguard-a", "secguard-b"
	c := env.Client
	kubeA := boundAgentsInstant(ctx, t, ns, sa, nodeA, nodeB)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	var work []scenario.Pod
	for i := range 12 {
		work = append(work, scenario.Pod{Name: fmt.Sprintf("work-%d", i), Kind: scenario.Plain, Grace: ptr64(1)})
	}
	if err := scenario.Create(ctx, c, ns, nodeA, taint, scenario.InstantAll(work)); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeA)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Timeout = -1, 10*time.Second
	clientA, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startEvictionGuard(ctx, t, sa, ns)
	host := guardHost(ctx, t, sa, ns)
	onA, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The floods.
	var slow []*slowBodyCounts
	for _, src := range []string{"127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"} {
		counts, _ := startSlowBodies(t, host, src, 64)
		slow = append(slow, counts)
	}
	var forged []*floodCounts
	for _, src := range []string{"127.0.0.8", "127.0.0.9", "127.0.0.10"} {
		counts, _ := startPacedFlood(t, host, src, sa, ns, nodeA, 50)
		forged = append(forged, counts)
	}
	holding := func() (n int64) {
		for _, s := range slow {
			n += s.open.Load()
		}
		return n
	}
	waitFor(ctx, t, "the slow bodies holding 200 connections", func() bool { return holding() >= 200 })
	floodStart := time.Now()
	errorsBefore := guardCounter(t, host, guard.ResultError)
	callsBefore := webhookCalls(ctx, t, guardWebhook)

	// The agent's reviews meanwhile: dry runs every 100 ms, from the API server (127.0.0.1).
	var (
		mu     sync.Mutex
		took   []time.Duration
		failed []string
		// held is the slow bodies' connections at each probe.
		held []int64
	)
	probeDone := make(chan struct{})
	var probes sync.WaitGroup
	probes.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-probeDone:
				return
			case <-tick.C:
			}
			h := holding()
			start := time.Now()
			err := evict(ctx, clientA, ns, onA.Name, ptr64(1), &onA.UID, true)
			d := time.Since(start)
			mu.Lock()
			took, held = append(took, d), append(held, h)
			if err != nil {
				failed = append(failed, fmt.Sprintf("after %v: %v", d.Round(time.Millisecond), err))
			}
			mu.Unlock()
		}
	})
	var stopOnce sync.Once
	stopProbes := func() { stopOnce.Do(func() { close(probeDone); probes.Wait() }) }
	defer stopProbes()

	// The real agent drains node A meanwhile.
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+kubeA, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	deadline := time.Now().Add(30 * time.Second).Truncate(time.Second)
	setDeadline(ctx, t, nodeA, deadline.UTC().Format(time.RFC3339))
	gone := func(name string) bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 40*time.Second, true, func(context.Context) (bool, error) {
		for _, p := range work {
			if !gone(p.Name) {
				return false, nil
			}
		}
		return true, nil
	})
	drained := time.Now()
	if err != nil {
		t.Errorf("waiting for node A's pods to end during the floods: %v\n%s", err, rp.LogTail(60))
	} else if !drained.Before(deadline) {
		t.Errorf("node A's pods ended at deadline%+v; want before the deadline", drained.Sub(deadline))
	}
	// Probes until the floods have run 10 s at least, so that each has run a while: what is
	// asserted is every review and call, the slow bodies' median hold and the forged reviews'
	// rate, none of which the length scales.
	for time.Since(floodStart) < 10*time.Second && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	floodFor := time.Since(floodStart)
	rss := guardMetric(t, host, "process_resident_memory_bytes")
	errorsAfter := guardCounter(t, host, guard.ResultError)
	stopProbes()
	calls := webhookCalls(ctx, t, guardWebhook).since(callsBefore)

	log := rp.LogTail(400)
	for _, bad := range []string{"failed calling webhook", "Deleting pod: the reclaim deadline leaves no time"} {
		if strings.Contains(log, bad) {
			t.Errorf("the agent's log says %q: an eviction failed at the guard during the floods\n%s", bad, log)
		}
	}
	for _, p := range work {
		var evicted bool
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			evicted = evicted || strings.HasPrefix(ev.Message, "Evicted with grace")
		}
		if !evicted {
			t.Errorf("pod %s has no Evicted event: the agent did not end it through the Eviction API", p.Name)
		}
	}

	mu.Lock()
	sorted, heldSorted := sortedClone(took), sortedClone(held)
	mu.Unlock()
	if len(sorted) == 0 {
		t.Fatal("no review of the agent's was probed")
	}
	// The slow bodies' hold through the floods, not at one instant: each connection is closed
	// after the guard's 2 s body timeout and dialled again, and on a loaded machine the
	// handshakes of a wave of them left 193 of 256 open at the end of one run (issue 52).
	medianHeld, leastHeld := heldSorted[len(heldSorted)/2], heldSorted[0]
	p50, p99, worst := quantile(sorted, 0.5), quantile(sorted, 0.99), sorted[len(sorted)-1]
	var sent, answered, refused, failedForged, busy int64
	for _, f := range forged {
		sent, answered, refused, failedForged = sent+f.sent.Load(), answered+f.answered.Load(), refused+f.refused.Load(), failedForged+f.failed.Load()
		busy += f.busy.Load()
	}
	var opened, closedAtOnce int64
	for _, s := range slow {
		opened, closedAtOnce = opened+s.opened.Load(), closedAtOnce+s.closedAtOnce.Load()
	}
	t.Logf("guard under both floods for %.1f s: slow bodies held a median of %d connections (least %d; %d opened, %d closed at accept); "+
		"forged reviews %d sent (%.0f/s; %d answered, %d refused, %d failed); the agent's %d reviews: p50 %v, p99 %v, max %v, %d failed; "+
		"node A drained at deadline%+v; the guard's RSS %.0f MiB",
		floodFor.Seconds(), medianHeld, leastHeld, opened, closedAtOnce, sent, float64(sent)/floodFor.Seconds(), answered, refused, failedForged,
		len(sorted), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), worst.Round(100*time.Microsecond), len(failed),
		drained.Sub(deadline).Round(100*time.Millisecond), rss/(1<<20))
	if len(failed) > 0 {
		t.Errorf("%d of the agent's %d reviews failed during the floods; want none. First: %s", len(failed), len(sorted), failed[0])
	}
	// Within 1 s as the API server timed its calls to the guard: the probes' own times above
	// (from this process, through the API server) also hold the machine's share, which on two
	// loaded cores reached 1.14 s where the guard's was not the cause (issue 52).
	t.Logf("the API server's calls to the guard meanwhile: %d, %d of them within 1 s", calls.count, calls.within1s)
	if calls.count < int64(len(sorted)) || calls.within1s != calls.count {
		t.Errorf("the API server called the guard %d times during the floods (the probes alone made %d reviews), %d of them took more than 1 s; want every one within 1 s",
			calls.count, len(sorted), calls.count-calls.within1s)
	}
	if errorsAfter != errorsBefore {
		t.Errorf("reviews_total{result=error} went from %v to %v during the floods; want forgeries and slow bodies kept out of it", errorsBefore, errorsAfter)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "agent-"+nodeA, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the agent's own pod: %v; want it left alone", err)
	}
	// The floods come from this process, on the machine the guard shares: with a build beside
	// make test they came at 119 forged reviews a second (issue 52). Everything above was still
	// checked, but a weaker flood proves less than the test claims, and the run says so rather
	// than passing on it.
	var weak []string
	if medianHeld < 200 {
		weak = append(weak, fmt.Sprintf("the slow bodies held a median of %d connections through the floods, want at least 200", medianHeld))
	}
	if rate := float64(sent) / floodFor.Seconds(); rate < 120 {
		// Ticks that found every worker waiting on the guard are the guard's slowness, which
		// the test is there to catch; ticks that came late are the machine's.
		if float64(busy)/floodFor.Seconds() >= 10 {
			t.Errorf("the forged reviews came at %.0f a second, want about 150: %d of the pace's ticks found all the flood's workers waiting on the guard", rate, busy)
		} else {
			weak = append(weak, fmt.Sprintf("the forged reviews came at %.0f a second, want about 150 (%d ticks found the workers all waiting on the guard)", rate, busy))
		}
	}
	if len(weak) > 0 && !t.Failed() {
		t.Skipf("this machine could not raise the floods the test is about (%s): the agent's reviews were answered in time through what it raised", strings.Join(weak, "; "))
	}
}

// guardWebhook is the eviction guard's webhook, as the chart names it.
const guardWebhook = "eviction-guard.reprieve.io"

// webhookCallCounts is the API server's count of its calls to one admission webhook, and of
// those that took at most 1 s.
type webhookCallCounts struct{ count, within1s int64 }

func (c webhookCallCounts) since(before webhookCallCounts) webhookCallCounts {
	return webhookCallCounts{c.count - before.count, c.within1s - before.within1s}
}

// webhookCalls reads the API server's apiserver_admission_webhook_admission_duration_seconds
// for the webhook name (its count, and its bucket le="1"): the time of each call from the API
// server to the webhook and back, without this process's share of the machine.
func webhookCalls(ctx context.Context, t *testing.T, name string) webhookCallCounts {
	t.Helper()
	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	const metric = "apiserver_admission_webhook_admission_duration_seconds"
	var c webhookCallCounts
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.Contains(l, `name="`+name+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, metric+"_count{"):
			c.count += int64(v)
		case strings.HasPrefix(l, metric+"_bucket{") && strings.Contains(l, `le="1"`):
			c.within1s += int64(v)
		}
	}
	return c
}

// sortedClone is a sorted copy of s.
func sortedClone[T cmp.Ordered](s []T) []T {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
