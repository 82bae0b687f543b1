package evict

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/plan"
)

// throttled is the API server's own 429 as client-go returns it: APF answers "Too many
// requests" with a Retry-After header (apiserver's tooManyRequests in
// pkg/server/filters/priority-and-fairness.go), which client-go turns into a StatusError whose
// details carry RetryAfterSeconds (newUnstructuredResponseError in rest/request.go), and no
// DisruptionBudget cause.
func throttled(retryAfter int) error {
	return fmt.Errorf("evicting pod ns/p: %w", apierrors.NewTooManyRequests("Too many requests, please try again later.", retryAfter))
}

// until polls cond (no sleep: a goroutine must reach a state) for at most 10 s of real time.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// acquireAsync starts an acquire and returns the channel its ticket arrives on.
func acquireAsync(g *gate, key, mustGo, lastChance time.Time, background bool) <-chan *ticket {
	ch := make(chan *ticket, 1)
	go func() {
		t, err := g.acquire(context.Background(), key, mustGo, lastChance, background)
		if err == nil {
			ch <- t
		}
	}()
	return ch
}

func granted(ch <-chan *ticket) (*ticket, bool) {
	select {
	case t := <-ch:
		return t, true
	default:
		return nil, false
	}
}

// TestGateOrdersByLastSafeMoment: with one slot, the waiters go by their key (the pod's last
// safe moment), not by arrival.
func TestGateOrdersByLastSafeMoment(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 1, func() float64 { return 0 })
	first, err := g.acquire(context.Background(), t0.Add(time.Hour), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	keys := []time.Duration{30 * time.Second, 5 * time.Second, 20 * time.Second, 10 * time.Second}
	chans := map[time.Duration]<-chan *ticket{}
	for i, k := range keys {
		chans[k] = acquireAsync(g, t0.Add(k), time.Time{}, time.Time{}, false)
		until(t, "the waiter to queue", func() bool { _, _, w, _ := g.state(); return w == i+1 })
	}
	first.done(nil)
	for _, k := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second} {
		var tk *ticket
		until(t, fmt.Sprintf("the waiter with key +%s", k), func() bool { var ok bool; tk, ok = granted(chans[k]); return ok })
		for _, other := range keys {
			if other > k {
				if _, ok := granted(chans[other]); ok {
					t.Fatalf("the waiter with key +%s went before the one with +%s", other, k)
				}
			}
		}
		tk.done(nil)
	}
}

// TestGateHonoursRetryAfter: a throttling answer with Retry-After: 3 holds every request of
// the agent for 3 s; none is sent before.
func TestGateHonoursRetryAfter(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	tk, err := g.acquire(context.Background(), t0.Add(time.Minute), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	tk.done(throttled(3))
	if _, _, _, until := g.state(); !until.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("paused until %s, want %s (Retry-After 3 s)", until, t0.Add(3*time.Second))
	}
	ch := acquireAsync(g, t0.Add(time.Minute), time.Time{}, time.Time{}, false)
	until(t, "the waiter's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	clk.Step(3*time.Second - time.Millisecond)
	if _, ok := granted(ch); ok {
		t.Fatal("a request went 1 ms before Retry-After ended")
	}
	clk.Step(time.Millisecond)
	until(t, "the request after Retry-After", func() bool { _, ok := granted(ch); return ok })
}

// TestGateMustGoPassesTheLimit: a request whose force point has come goes past the in-flight
// limit, but waits out a pause (the server asked for it; its grace is recomputed when it
// leaves); at its last chance (a 1 s grace barely fits) it goes during the pause too: waiting
// longer makes its pod late for certain.
func TestGateMustGoPassesTheLimit(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 1, func() float64 { return 0 })
	held, _ := g.acquire(context.Background(), t0.Add(time.Minute), time.Time{}, time.Time{}, false)
	other, err := g.acquire(context.Background(), t0.Add(time.Minute), t0, time.Time{}, false) // must go already: past the limit
	if err != nil {
		t.Fatal(err)
	}
	other.done(throttled(10))
	ch := acquireAsync(g, t0.Add(5*time.Second), t0.Add(time.Second), t0.Add(2*time.Second), false)
	until(t, "the waiter's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	clk.Step(time.Second)
	if _, ok := granted(ch); ok {
		t.Fatal("went at its must-go moment during the pause")
	}
	clk.Step(time.Second - time.Millisecond)
	if _, ok := granted(ch); ok {
		t.Fatal("went before its last chance, during the pause")
	}
	clk.Step(time.Millisecond)
	until(t, "the request at its last chance", func() bool { _, ok := granted(ch); return ok })
	held.done(nil)
}

// TestGateQueueMargin: the margin left for the server's queue is measured from the answers'
// times, srtt + 4 rttvar (RFC 6298); requests that got no answer do not count.
func TestGateQueueMargin(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	if m := g.queueMargin(); m != 0 {
		t.Fatalf("margin %s before any answer, want 0", m)
	}
	answer := func(took time.Duration, err error) {
		tk, _ := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
		clk.Step(took)
		tk.done(err)
	}
	answer(200*time.Millisecond, nil)
	if m := g.queueMargin(); m != 600*time.Millisecond {
		t.Fatalf("margin %s after one 200 ms answer, want 600 ms (200 + 4 x 100)", m)
	}
	answer(time.Minute, errors.New("connection refused"))                       // no answer: not counted
	answer(time.Minute, apierrors.NewInternalError(errors.New("etcd timeout"))) // a failure, not the queue
	answer(400*time.Millisecond, nil)
	// rttvar = (3 x 100 + |200 - 400|) / 4 = 125 ms; srtt = (7 x 200 + 400) / 8 = 225 ms.
	if m := g.queueMargin(); m != 725*time.Millisecond {
		t.Fatalf("margin %s, want 725 ms", m)
	}
	answer(time.Minute, throttled(1)) // a 429 from APF's queue is an answer: it counts
	if m := g.queueMargin(); m != queueMarginMax {
		t.Fatalf("margin %s after a minute in the queue, want the cap %s", m, queueMarginMax)
	}
}

// TestGateSendMargin: the margin a request's send and grace leave is the estimate, but never
// more than the longest of the last eight answers: one answer of 200 ms is a 200 ms margin,
// not RFC 6298's 600 ms; a slow answer counts for eight answers, or until the estimate, which
// forgets it sooner, is below it; a notice's first answer starts both afresh.
func TestGateSendMargin(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	answer := func(took time.Duration) {
		t.Helper()
		tk, err := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
		if err != nil {
			t.Fatal(err)
		}
		clk.Step(took)
		tk.done(nil)
	}
	if m := g.sendMargin(); m != 0 {
		t.Fatalf("send margin %s before any answer, want 0", m)
	}
	answer(200 * time.Millisecond)
	if q, m := g.queueMargin(), g.sendMargin(); q != 600*time.Millisecond || m != 200*time.Millisecond {
		t.Fatalf("after one 200 ms answer: estimate %s, send margin %s; want 600 ms and 200 ms", q, m)
	}
	answer(400 * time.Millisecond)
	if m := g.sendMargin(); m != 400*time.Millisecond {
		t.Fatalf("send margin %s after a 400 ms answer, want 400 ms", m)
	}
	for range recentAnswers - 1 {
		answer(100 * time.Millisecond)
	}
	if m := g.sendMargin(); m != 400*time.Millisecond {
		t.Fatalf("send margin %s with the 400 ms answer the eighth last, want 400 ms", m)
	}
	answer(100 * time.Millisecond)
	if m := g.sendMargin(); m != 100*time.Millisecond {
		t.Fatalf("send margin %s after eight answers of 100 ms, want 100 ms", m)
	}
	// A lone slow answer: the estimate jumps past it, then falls below it before it leaves the
	// eight; from then on the send margin is the estimate.
	answer(time.Second)
	if m := g.sendMargin(); m != time.Second {
		t.Fatalf("send margin %s after a 1 s answer, want 1 s", m)
	}
	for range recentAnswers - 1 {
		answer(100 * time.Millisecond)
	}
	if q, m := g.queueMargin(), g.sendMargin(); q >= time.Second || m != q {
		t.Fatalf("seven answers after the slow one: estimate %s, send margin %s; want the estimate, below 1 s", q, m)
	}
	// A notice: its first answer is the first measurement of both.
	g.notice()
	answer(50 * time.Millisecond)
	if m := g.sendMargin(); m != 50*time.Millisecond {
		t.Fatalf("send margin %s after the notice's first answer of 50 ms, want 50 ms", m)
	}
}

// TestGateMarginBeforeItsFirstAnswer (issue 50, case 7): a new agent process (a restart during a
// notice) has measured the API server before its first eviction (its caches' first list, a
// dry-run eviction): that is its margin until its own first answer, not nothing. Sent with no
// margin, a restarted agent's first eviction of a pod whose grace was cut to the window was
// cut at its bound by the first slow answer (0.25 s to 1.25 s: what its rounded grace left),
// and the DELETE that followed paid the cut's time and the margin it measured: 2 s less than
// fitted. The prior lasts a minute: an agent started long before its first notice starts
// that notice as before.
func TestGateMarginBeforeItsFirstAnswer(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	g.seed(700 * time.Millisecond)
	g.seed(300 * time.Millisecond) // the slowest of what was measured
	g.notice()
	if m := g.sendMargin(); m != 700*time.Millisecond {
		t.Fatalf("send margin %s before the first answer, after a 700 ms start-up answer: want 700 ms", m)
	}
	tk, err := g.acquire(context.Background(), clk.Now(), clk.Now(), clk.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(40 * time.Millisecond)
	tk.done(nil)
	if m := g.sendMargin(); m != 40*time.Millisecond {
		t.Fatalf("send margin %s after the first answer of 40 ms: want it alone", m)
	}
	old := newGate(clk, 8, func() float64 { return 0 })
	old.seed(700 * time.Millisecond)
	clk.Step(time.Minute)
	old.notice()
	if m := old.sendMargin(); m != 0 {
		t.Fatalf("send margin %s at a notice a minute after the start-up answers: want none (nothing measured since)", m)
	}
}

// TestGateJitter: a fleet of agents throttled in the same second comes back spread over
// [Retry-After, 1.5 x Retry-After), each agent drawing its own.
func TestGateJitter(t *testing.T) {
	pauses := map[time.Duration]bool{}
	for range 20 {
		clk := clocktesting.NewFakeClock(t0)
		g := newGate(clk, 8, nil) // the process's own random source
		tk, _ := g.acquire(context.Background(), t0, time.Time{}, time.Time{}, false)
		tk.done(throttled(1))
		_, _, _, until := g.state()
		p := until.Sub(t0)
		if p < time.Second || p >= 1500*time.Millisecond {
			t.Fatalf("pause %s after Retry-After 1 s, want within [1s, 1.5s)", p)
		}
		pauses[p] = true
	}
	if len(pauses) < 10 {
		t.Fatalf("20 agents drew only %d different pauses: they would come back together", len(pauses))
	}
}

// TestGateLimitAdapts: a throttling answer halves the in-flight limit, an answered request
// grows it by one, up to the maximum; a request that got no answer changes nothing.
func TestGateLimitAdapts(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 10, func() float64 { return 0 })
	step := func(err error, want int) {
		t.Helper()
		clk.Step(time.Minute) // past any pause
		tk, _ := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
		tk.done(err)
		if l, _, _, _ := g.state(); l != want {
			t.Fatalf("after %v: limit %d, want %d", err, l, want)
		}
	}
	step(nil, 9)
	step(throttled(1), 4)
	step(throttled(1), 2)
	step(errors.New("connection refused"), 2)
	step(context.DeadlineExceeded, 2)
	step(apierrors.NewInternalError(errors.New("boom")), 3)
	for want := 4; want <= 10; want++ {
		step(nil, want)
	}
	step(nil, 10) // never past the maximum
}

// TestGateBackgroundYields: a background write (the pods' early warning) goes only when no
// eviction waits, and holds at most half the slots.
func TestGateBackgroundYields(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 4, func() float64 { return 0 })
	var held []*ticket
	for range 4 {
		tk, _ := g.acquire(context.Background(), t0.Add(time.Hour), time.Time{}, time.Time{}, false)
		held = append(held, tk)
	}
	bg := acquireAsync(g, time.Time{}, time.Time{}, time.Time{}, true)
	until(t, "the background waiter", func() bool { _, _, w, _ := g.state(); return w == 1 })
	ev := acquireAsync(g, t0.Add(time.Minute), time.Time{}, time.Time{}, false)
	until(t, "the eviction waiter", func() bool { _, _, w, _ := g.state(); return w == 2 })
	held[0].done(errNotSent)
	until(t, "the eviction", func() bool { _, ok := granted(ev); return ok })
	if _, ok := granted(bg); ok {
		t.Fatal("the background write went before the eviction that waited")
	}
	held[1].done(errNotSent)
	until(t, "the background write", func() bool { _, ok := granted(bg); return ok })
	// Two more background writes: one fits in half the slots (2), the other waits.
	bg2 := acquireAsync(g, time.Time{}, time.Time{}, time.Time{}, true)
	bg3 := acquireAsync(g, time.Time{}, time.Time{}, time.Time{}, true)
	until(t, "both background waiters", func() bool { _, _, w, _ := g.state(); return w == 2 })
	held[2].done(errNotSent)
	held[3].done(errNotSent)
	until(t, "one more background write", func() bool {
		_, a := granted(bg2)
		_, b := granted(bg3)
		return a || b
	})
	if _, inflight, w, _ := g.state(); inflight != 3 || w != 1 {
		t.Fatalf("in flight %d, waiting %d; want 3 (one eviction, two background) and 1", inflight, w)
	}
}

// TestQueueBound: how long a request may wait so that its pod still ends by the window's end,
// the kubelet's tail after its grace included (issue 50, case 4).
func TestQueueBound(t *testing.T) {
	w := view(t0.Add(40 * time.Second)).Window // ends at t0+35s
	for _, c := range []struct {
		name        string
		grace, tail time.Duration
		sent        time.Time
		want        time.Duration
	}{
		{"a deadline-bound pod sent at its force point keeps the lead", 30 * time.Second, 0, t0.Add(5*time.Second - 500*time.Millisecond), 500 * time.Millisecond},
		{"a pod with slack waits at most the request timeout", 5 * time.Second, 0, t0, RequestTimeout},
		{"a cut grace leaves what rounding down left", 34 * time.Second, 0, t0.Add(100 * time.Millisecond), 900 * time.Millisecond},
		{"never less than the allowance to land", 3 * time.Second, 0, t0.Add(31900 * time.Millisecond), 250 * time.Millisecond},
		{"the least grace waits the request timeout: a resend could ask no less", plan.MinGrace, 0, t0.Add(34800 * time.Millisecond), RequestTimeout},
		// A preStop hook's pod, its grace cut to end 2 s before the window's end: waiting 2.9 s
		// would end it 2 s past.
		{"a cut grace leaves the kubelet's tail too", 32 * time.Second, plan.HookTail, t0.Add(100 * time.Millisecond), 900 * time.Millisecond},
		{"a deadline-bound pod with a tail, sent at its force point, keeps the lead", 28 * time.Second, plan.HookTail, t0.Add(5*time.Second - 500*time.Millisecond), 500 * time.Millisecond},
	} {
		if got := QueueBound(w, c.grace, c.tail, c.sent); got != c.want {
			t.Errorf("%s: QueueBound = %s, want %s", c.name, got, c.want)
		}
	}
	if got := QueueBound(View{}.Window, time.Second, 0, t0); got != RequestTimeout {
		t.Errorf("no deadline: QueueBound = %s, want %s", got, RequestTimeout)
	}
}

// TestMarkBound: the DisruptionTarget patch before a DELETE may not hold it past the pod's last
// chance (the kubelet's 2 s least grace and the pod's tail, with the lead and the margin, before
// the window's end; issue 50, case 4).
func TestMarkBound(t *testing.T) {
	w := view(t0.Add(40 * time.Second)).Window // ends at t0+35s; last chance t0+32.5s less the margin and the tail
	for _, c := range []struct {
		name string
		tail time.Duration
		now  time.Time
		want time.Duration
	}{
		{"far from the last chance: the request timeout", 0, t0, RequestTimeout},
		{"the time to the last chance", 0, t0.Add(31 * time.Second), time.Second + 300*time.Millisecond},
		{"at the last chance: the allowance to land", 0, t0.Add(34 * time.Second), plan.RequestAllowance},
		// A preStop hook's pod: its last chance is 2 s earlier, t0+30.3s.
		{"a pod with a tail: the time to its own last chance", plan.HookTail, t0.Add(29 * time.Second), time.Second + 300*time.Millisecond},
		{"a pod with a tail, past its own last chance: the allowance to land", plan.HookTail, t0.Add(31 * time.Second), plan.RequestAllowance},
	} {
		if got := markBound(w, 200*time.Millisecond, c.tail, c.now); got != c.want {
			t.Errorf("%s: markBound = %s, want %s", c.name, got, c.want)
		}
	}
	if got := markBound(View{}.Window, 0, 0, t0); got != RequestTimeout {
		t.Errorf("no deadline: markBound = %s, want %s", got, RequestTimeout)
	}
}

// TestGateLostBudgetYields: a pod past its last safe moment (its budget lost) goes after a pod
// whose budget can still be kept, even one whose moment is later; its passed force point no
// longer takes it past the limit, only its last chance does. With too few seats the pods
// lost are then those whose budget the window could never have met.
func TestGateLostBudgetYields(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 1, func() float64 { return 0 })
	held, err := g.acquire(context.Background(), t0.Add(time.Hour), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	// Overdue: its last safe moment was 10 s ago, its force point too; last chance in 20 s.
	lost := acquireAsync(g, t0.Add(-10*time.Second), t0.Add(-11*time.Second), t0.Add(20*time.Second), false)
	until(t, "the overdue waiter to queue", func() bool { _, _, w, _ := g.state(); return w == 1 })
	if _, ok := granted(lost); ok {
		t.Fatal("a pod past its last safe moment went past the limit")
	}
	// Keepable: its last safe moment in 5 s, force point in 4 s.
	keep := acquireAsync(g, t0.Add(5*time.Second), t0.Add(4*time.Second), t0.Add(20*time.Second), false)
	until(t, "the keepable waiter to queue", func() bool { _, _, w, _ := g.state(); return w == 2 })
	held.done(nil)
	tk := <-keep
	if _, ok := granted(lost); ok {
		t.Fatal("the overdue pod went before the one whose budget can still be kept")
	}
	// Its last chance takes it past the limit (the slot is still taken by keep).
	clk.Step(20*time.Second - time.Millisecond)
	if _, ok := granted(lost); ok {
		t.Fatal("the overdue pod went before its last chance")
	}
	clk.Step(time.Millisecond)
	until(t, "the overdue pod at its last chance", func() bool { _, ok := granted(lost); return ok })
	tk.done(nil)
}

// congest makes g see a congested server: one answer that took 2 s (srtt 2 s, rttvar 1 s, so
// the margin is 6 s and the horizon 12 s), with one more request left in flight, returned.
func congest(t *testing.T, g *gate, clk *clocktesting.FakeClock) *ticket {
	t.Helper()
	tk, err := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	tk.done(nil)
	if m := g.queueMargin(); m != 6*time.Second {
		t.Fatalf("margin %s, want 6s", m)
	}
	// One request stays in flight: with none, the most urgent waiter goes whatever the
	// horizon (TestGateKeepsOneInFlight).
	busy, err := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	return busy
}

// TestGateHoldsPastTheHorizon: while the server is congested, a request whose last safe moment
// is further than the horizon (twice the margin: 12 s) waits with slots free, and goes at the
// horizon; a nearer one goes at once. On an idle server nothing is held.
func TestGateHoldsPastTheHorizon(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	// Idle: a far request goes at once.
	if _, ok := granted(acquireAsync(g, t0.Add(time.Minute), t0.Add(50*time.Second), t0.Add(70*time.Second), false)); !ok {
		until(t, "the far request on an idle server", func() bool { _, inflight, _, _ := g.state(); return inflight == 1 })
	}
	g = newGate(clk, 8, func() float64 { return 0 })
	congest(t, g, clk)
	now := clk.Now()
	far := acquireAsync(g, now.Add(20*time.Second), now.Add(19*time.Second), now.Add(30*time.Second), false)
	until(t, "the far waiter's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	near := acquireAsync(g, now.Add(5*time.Second), now.Add(4*time.Second), now.Add(30*time.Second), false)
	until(t, "the near request", func() bool { _, ok := granted(near); return ok })
	if _, ok := granted(far); ok {
		t.Fatal("a request 20 s from its last safe moment went with a 12 s horizon")
	}
	clk.Step(8*time.Second - time.Millisecond)
	if _, ok := granted(far); ok {
		t.Fatal("the held request went before its horizon")
	}
	clk.Step(time.Millisecond)
	until(t, "the held request at its horizon", func() bool { _, ok := granted(far); return ok })
}

// TestGateHorizonMovesWithAnswers: a held request's horizon grows with a slower answer; the
// release that measured it re-arms the waiter's timer for the earlier moment (no waiter of
// its own calls it).
func TestGateHorizonMovesWithAnswers(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	congest(t, g, clk)
	now := clk.Now()
	// 30 s out: held until 18 s from now with the 12 s horizon.
	far := acquireAsync(g, now.Add(30*time.Second), now.Add(29*time.Second), now.Add(40*time.Second), false)
	until(t, "the far waiter's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	slow, err := g.acquire(context.Background(), clk.Now(), time.Time{}, time.Time{}, false)
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(6 * time.Second)
	// An answer of 6 s: srtt 2.5 s, rttvar 1.75 s, margin 9.5 s, horizon 19 s: the far
	// request now goes 11 s after the first notice of it, 5 s from here.
	slow.done(nil)
	if m := g.queueMargin(); m != 9500*time.Millisecond {
		t.Fatalf("margin %s, want 9.5s", m)
	}
	clk.Step(5*time.Second - time.Millisecond)
	if _, ok := granted(far); ok {
		t.Fatal("the held request went before its new horizon")
	}
	clk.Step(time.Millisecond)
	until(t, "the held request at its new horizon", func() bool { _, ok := granted(far); return ok })
}

// TestGateKeepsOneInFlight: while the server is congested, an agent with nothing in flight
// sends its most urgent waiter whatever the horizon, and only that one: one request in the
// server's queue keeps its seats busy (an idle seat between grace classes is a seat lost at
// the end), and its answer measures the congestion again. A pod whose budget is kept goes
// before a lost budget; the lost one goes when nothing else is in flight, not before.
func TestGateKeepsOneInFlight(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	busy := congest(t, g, clk)
	now := clk.Now()
	far := acquireAsync(g, now.Add(20*time.Second), now.Add(19*time.Second), now.Add(30*time.Second), false)
	lost := acquireAsync(g, now.Add(-10*time.Second), now.Add(-11*time.Second), now.Add(30*time.Second), false)
	until(t, "both held behind the one in flight", func() bool { _, _, w, _ := g.state(); return w == 2 })
	if _, ok := granted(far); ok {
		t.Fatal("a request 20 s from its last safe moment went with one in flight and a 12 s horizon")
	}
	clk.Step(2 * time.Second)
	busy.done(nil) // srtt stays 2 s: still congested, horizon 10 s
	var farTk *ticket
	until(t, "the most urgent waiter once nothing is in flight", func() bool {
		var ok bool
		farTk, ok = granted(far)
		return ok
	})
	if _, inflight, w, _ := g.state(); inflight != 1 || w != 1 {
		t.Fatalf("%d in flight, %d waiting; want the one kept budget alone in flight", inflight, w)
	}
	if _, ok := granted(lost); ok {
		t.Fatal("the lost budget went beside the kept one")
	}
	clk.Step(2 * time.Second)
	farTk.done(nil)
	until(t, "the lost budget once nothing else is in flight", func() bool { _, ok := granted(lost); return ok })
}

// notice starts a notice at g and queues n deadline-bound evictions, as a notice does: the most urgent one
// first and alone (the executor queues a node's pods most urgent first), then the others,
// their last safe moments 1 s apart from first+1 s on; all due now. It returns the first's
// ticket and the others' channels, by last safe moment.
func notice(t *testing.T, g *gate, clk *clocktesting.FakeClock, first time.Duration, n int) (*ticket, []<-chan *ticket) {
	t.Helper()
	g.notice() // as SetView does for a new window with a deadline
	now := clk.Now()
	end := now.Add(35 * time.Second)
	tk, err := g.acquire(context.Background(), now.Add(first), now.Add(first-time.Second), end, false)
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan *ticket
	for i := 1; i < n; i++ {
		key := now.Add(first + time.Duration(i)*time.Second)
		chans = append(chans, acquireAsync(g, key, key.Add(-time.Second), end, false))
	}
	until(t, "the notice's other evictions to queue", func() bool {
		_, inflight, w, _ := g.state()
		return inflight+w == n && clk.HasWaiters()
	})
	return tk, chans
}

// grantedCount is how many of chans were granted, taking their tickets into tks.
func grantedCount(chans []<-chan *ticket, tks map[int]*ticket) int {
	for i, ch := range chans {
		if _, ok := tks[i]; ok {
			continue
		}
		if tk, ok := granted(ch); ok {
			tks[i] = tk
		}
	}
	return len(tks)
}

// TestGateNoticeProbesFirst: at a notice the agent assumes a congested server until its first
// answer: only the most urgent eviction goes (the probe), none of the node's others, though
// slots are free and all are due. A quick answer lifts it, and the limit grows from the
// restart limit, one more per accepted answer (slow start: 2, 3, 6, ...).
func TestGateNoticeProbesFirst(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 64, func() float64 { return 0 })
	probe, chans := notice(t, g, clk, 5*time.Second, 38)
	if l, inflight, _, _ := g.state(); inflight != 1 || l != gateRestartLimit {
		t.Fatalf("before any answer: %d in flight, limit %d; want the probe alone, limit %d", inflight, l, gateRestartLimit)
	}
	clk.Step(50 * time.Millisecond)
	probe.done(nil) // quick: the server is not congested
	tks := map[int]*ticket{}
	until(t, "three more after a quick answer", func() bool { return grantedCount(chans, tks) == 3 })
	for i := range 3 {
		if _, ok := tks[i]; !ok {
			t.Fatalf("granted %v, want the three most urgent (0, 1, 2)", tks)
		}
	}
	for i := range 3 {
		tks[i].done(nil)
	}
	// Limit 6 after three more accepted answers: six in flight, nine granted in all.
	until(t, "slow start: six in flight", func() bool { grantedCount(chans, tks); _, inflight, _, _ := g.state(); return inflight == 6 })
	if l, _, _, _ := g.state(); l != 6 {
		t.Fatalf("limit %d after four accepted answers from the restart limit 2, want 6", l)
	}
}

// TestGateNoticeSlowProbeKeepsTheHorizon: when the probe's answer is slow (2 s in the server's
// queue), the congestion stays, with the horizon of the margin it measured (6 s, so 12 s): the
// evictions due within it go, the further ones wait with slots free.
func TestGateNoticeSlowProbeKeepsTheHorizon(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 64, func() float64 { return 0 })
	probe, chans := notice(t, g, clk, 5*time.Second, 38) // last safe moments t0+5s ... t0+42s
	clk.Step(2 * time.Second)
	probe.done(nil)
	if m := g.queueMargin(); m != 6*time.Second {
		t.Fatalf("margin %s after the probe's 2 s answer, want 6 s (its first measurement)", m)
	}
	tks := map[int]*ticket{}
	until(t, "the limit's three, the most urgent", func() bool { return grantedCount(chans, tks) == 3 })
	for i := range 3 {
		tks[i].done(nil) // instant answers: srtt 1.3 s, still congested
	}
	// Now t0+2s, horizon 2 x margin: the waiters whose last safe moment is within it go, up
	// to the limit (6); beyond, none. The gate grants within done, so what it granted is its
	// in-flight count now, whatever the goroutines' hand-over of the tickets.
	_, inflight, _, _ := g.state()
	until(t, "the next ones within the horizon", func() bool { return grantedCount(chans, tks) == 3+inflight })
	h := g.horizon()
	for i := range chans {
		key := t0.Add(5*time.Second + time.Duration(i+1)*time.Second)
		if _, ok := tks[i]; ok && key.After(clk.Now().Add(h)) {
			t.Fatalf("the eviction with last safe moment %s went at %s with a %s horizon", key.Sub(t0), clk.Now().Sub(t0), h)
		}
	}
	// Those answer in 1.5 s each: still congested (srtt above a second), the limit grows past
	// what the horizon lets through, and the far waiters stay held with slots free.
	clk.Step(1500 * time.Millisecond)
	for i, tk := range tks {
		if i >= 3 {
			tk.done(nil)
		}
	}
	if l, inflight, waiting, _ := g.state(); inflight >= l || waiting == 0 {
		t.Fatalf("limit %d, %d in flight, %d waiting: want waiters held by the horizon with slots free", l, inflight, waiting)
	}
}

// TestGateRestartsAtNotice: a notice (a new window with a deadline) restarts an idle gate at
// the restart limit; pods that become due later in the window, after seconds of quiet, keep
// the limit the answers gave; a notice while requests are in flight changes nothing (their
// answers measure the server already).
func TestGateRestartsAtNotice(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 64, func() float64 { return 0 })
	answer := func() {
		t.Helper()
		tk, err := g.acquire(context.Background(), clk.Now().Add(time.Minute), time.Time{}, clk.Now().Add(time.Minute), false)
		if err != nil {
			t.Fatal(err)
		}
		tk.done(nil)
	}
	limit := func() int { l, _, _, _ := g.state(); return l }
	if l := limit(); l != gateInitialLimit {
		t.Fatalf("limit %d on a new gate, want %d", l, gateInitialLimit)
	}
	g.notice()
	if l := limit(); l != gateRestartLimit {
		t.Fatalf("limit %d at a notice, want %d", l, gateRestartLimit)
	}
	answer()
	for range 3 {
		clk.Step(5 * time.Second) // quiet, then one more pod due within the window
		answer()
	}
	if l := limit(); l != gateRestartLimit+4 {
		t.Fatalf("limit %d after four answers within the window, want %d (no restart)", l, gateRestartLimit+4)
	}
	inflight, err := g.acquire(context.Background(), clk.Now().Add(time.Minute), time.Time{}, clk.Now().Add(time.Minute), false)
	if err != nil {
		t.Fatal(err)
	}
	g.notice()
	if l := limit(); l != gateRestartLimit+4 {
		t.Fatalf("limit %d after a notice with a request in flight, want %d", l, gateRestartLimit+4)
	}
	inflight.done(nil)
}

// TestGateLostBudgetWaitsWhileCongested: while the server is congested, a pod past its last
// safe moment waits with slots free until its last chance is within the horizon (12 s here):
// sent earlier it would sit in the server's queue ahead of other agents' pods whose budget can
// still be kept; its last chance is its deadline now (a 1 s grace), and the horizon is how far
// ahead of a deadline a request goes. Its last chance is less the margin of the moment (2 s
// here, issue 50 case 2): it goes 6 s from now, not 8 s.
func TestGateLostBudgetWaitsWhileCongested(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	congest(t, g, clk)
	if m := g.sendMargin(); m != 2*time.Second {
		t.Fatalf("send margin %s, want 2s (the one 2 s answer)", m)
	}
	now := clk.Now()
	lost := acquireAsync(g, now.Add(-10*time.Second), now.Add(-11*time.Second), now.Add(20*time.Second), false)
	until(t, "the lost budget's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	clk.Step(6*time.Second - time.Millisecond)
	// The gate's timer fires on a goroutine of its own: give a wrong grant its chance.
	for range 100 {
		goruntime.Gosched()
	}
	if _, ok := granted(lost); ok {
		t.Fatal("a pod past its last safe moment went 20 s before its last chance while the server was congested")
	}
	clk.Step(time.Millisecond)
	until(t, "the lost budget 12 s before its last chance less the margin", func() bool { _, ok := granted(lost); return ok })
}

// TestGateBackgroundWaitsBehindHeld: a background write (the early warning) does not take a
// slot that an eviction held by the horizon leaves free: it goes once no eviction waits.
func TestGateBackgroundWaitsBehindHeld(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	congest(t, g, clk) // horizon 12 s
	now := clk.Now()
	far := acquireAsync(g, now.Add(20*time.Second), now.Add(19*time.Second), now.Add(30*time.Second), false)
	until(t, "the far waiter's timer", func() bool { _, _, w, _ := g.state(); return w == 1 && clk.HasWaiters() })
	bg := acquireAsync(g, time.Time{}, time.Time{}, time.Time{}, true)
	until(t, "the background waiter", func() bool { _, _, w, _ := g.state(); return w == 2 })
	if _, ok := granted(bg); ok {
		t.Fatal("a background write went while an eviction was held")
	}
	clk.Step(8 * time.Second) // the far one's horizon
	until(t, "the held eviction", func() bool { _, ok := granted(far); return ok })
	until(t, "the background write once no eviction waits", func() bool { _, ok := granted(bg); return ok })
}

// TestGateProbesAfterThrottling: after a throttling answer's pause, with nothing in flight,
// the most urgent request goes even beyond the horizon: only an answer lifts that congestion.
func TestGateProbesAfterThrottling(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := newGate(clk, 8, func() float64 { return 0 })
	tk, _ := g.acquire(context.Background(), t0.Add(time.Minute), time.Time{}, time.Time{}, false)
	tk.done(throttled(1))
	far := acquireAsync(g, t0.Add(30*time.Second), t0.Add(29*time.Second), t0.Add(40*time.Second), false)
	farther := acquireAsync(g, t0.Add(31*time.Second), t0.Add(30*time.Second), t0.Add(40*time.Second), false)
	until(t, "both waiters", func() bool { _, _, w, _ := g.state(); return w == 2 && clk.HasWaiters() })
	clk.Step(time.Second) // the pause ends
	until(t, "the probe after the pause", func() bool { _, ok := granted(far); return ok })
	if _, ok := granted(farther); ok {
		t.Fatal("a second request beyond the horizon went before the probe's answer")
	}
}

// TestAdmit: the gate's policy on sets of waiters, without channels or timers (docs/design.md,
// "The gate's rules"). Waiters are named by their key's offset from now.
func TestAdmit(t *testing.T) {
	now := t0
	at := func(d time.Duration) time.Time { return now.Add(d) }
	// w is a deadline-bound eviction with its last safe moment at +key, its must-go moment 1 s
	// before and its last chance at +30 s.
	w := func(key time.Duration, seq uint64) *waiter {
		return &waiter{key: at(key), mustGo: at(key - time.Second), lastChance: at(30 * time.Second), seq: seq}
	}
	idle := gateState{now: now, limit: 2, horizon: horizonMin}
	cases := []struct {
		name      string
		state     gateState
		waiting   []*waiter
		wantGrant []time.Time // keys, in the order granted
		wantNext  time.Time
	}{
		{name: "idle: the most urgent go, up to the limit, whatever their arrival",
			state: idle, waiting: []*waiter{w(20*time.Second, 1), w(5*time.Second, 2), w(10*time.Second, 3)},
			wantGrant: []time.Time{at(5 * time.Second), at(10 * time.Second)}, wantNext: at(19 * time.Second)},
		{name: "a late arrival that is more urgent goes before earlier ones",
			state: gateState{now: now, limit: 2, inflight: 1, horizon: horizonMin}, waiting: []*waiter{w(20*time.Second, 1), w(15*time.Second, 2), w(3*time.Second, 9)},
			wantGrant: []time.Time{at(3 * time.Second)}, wantNext: at(14 * time.Second)},
		{name: "limit reached: the must-go goes past it",
			state: gateState{now: now, limit: 1, inflight: 1, horizon: horizonMin}, waiting: []*waiter{w(time.Second, 1), w(20*time.Second, 2)},
			wantGrant: []time.Time{at(time.Second)}, wantNext: at(19 * time.Second)},
		{name: "paused: nothing goes but a last chance; next is the pause's end",
			state:     gateState{now: now, limit: 4, pauseUntil: at(3 * time.Second), congested: true, horizon: horizonMin},
			waiting:   []*waiter{w(time.Second, 1), {key: at(40 * time.Second), lastChance: now, seq: 2}},
			wantGrant: []time.Time{at(40 * time.Second)}, wantNext: at(3 * time.Second)},
		{name: "congested: past the horizon waits, slots free; next is its horizon",
			state: gateState{now: now, limit: 8, inflight: 1, congested: true, horizon: 12 * time.Second}, waiting: []*waiter{w(20*time.Second, 1), w(5*time.Second, 2)},
			wantGrant: []time.Time{at(5 * time.Second)}, wantNext: at(8 * time.Second)},
		{name: "congested with nothing in flight: the most urgent goes, only it",
			state: gateState{now: now, limit: 8, congested: true, horizon: 12 * time.Second}, waiting: []*waiter{w(25*time.Second, 1), w(20*time.Second, 2)},
			wantGrant: []time.Time{at(20 * time.Second)}, wantNext: at(13 * time.Second)},
		{name: "a lost budget goes after a kept one",
			state: idle, waiting: []*waiter{w(-5*time.Second, 1), w(20*time.Second, 2)},
			wantGrant: []time.Time{at(20 * time.Second), at(-5 * time.Second)}},
		// Issue 50, case 2: a waiter's must-go moment and last chance come without a margin;
		// the policy takes off the margin of the moment, which grows while a request waits (a
		// 30 s pause, answers slowing from 0 to 3 s): the request goes when it must now, not
		// when it had to at its submission.
		{name: "paused: a last chance the margin of the moment has brought to now goes",
			state:     gateState{now: now, limit: 4, pauseUntil: at(30 * time.Second), congested: true, horizon: horizonMin, margin: 3 * time.Second},
			waiting:   []*waiter{{key: at(-10 * time.Second), lastChance: at(3 * time.Second), seq: 1}},
			wantGrant: []time.Time{at(-10 * time.Second)}},
		{name: "paused: the next moment is the last chance less the margin of the moment",
			state:   gateState{now: now, limit: 4, pauseUntil: at(30 * time.Second), congested: true, horizon: horizonMin, margin: 3 * time.Second},
			waiting: []*waiter{{key: at(-10 * time.Second), lastChance: at(13 * time.Second), seq: 1}}, wantNext: at(10 * time.Second)},
		{name: "limit reached: a must-go moment the margin of the moment has brought to now goes past it",
			state:     gateState{now: now, limit: 1, inflight: 1, horizon: horizonMin, margin: 2 * time.Second},
			waiting:   []*waiter{w(3*time.Second, 1)},
			wantGrant: []time.Time{at(3 * time.Second)}},
		{name: "congested: a lost budget's horizon counts from its last chance less the margin",
			state:     gateState{now: now, limit: 8, inflight: 1, congested: true, horizon: 4 * time.Second, margin: 2 * time.Second},
			waiting:   []*waiter{{key: at(-10 * time.Second), lastChance: at(5 * time.Second), seq: 1}},
			wantGrant: []time.Time{at(-10 * time.Second)}},
		{name: "background behind a held eviction waits",
			state:   gateState{now: now, limit: 8, inflight: 1, congested: true, horizon: 12 * time.Second},
			waiting: []*waiter{w(20*time.Second, 1), {background: true, seq: 2}}, wantNext: at(8 * time.Second)},
		{name: "background takes at most half the slots",
			state:   gateState{now: now, limit: 4, inflight: 2, bg: 2, horizon: horizonMin},
			waiting: []*waiter{{background: true, seq: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			grant, rest, next := admit(c.state, c.waiting)
			var got []time.Time
			for _, g := range grant {
				got = append(got, g.key)
			}
			if len(got) != len(c.wantGrant) {
				t.Fatalf("granted %v, want %v", got, c.wantGrant)
			}
			for i := range got {
				if !got[i].Equal(c.wantGrant[i]) {
					t.Fatalf("granted %v, want %v", got, c.wantGrant)
				}
			}
			if len(grant)+len(rest) != len(c.waiting) {
				t.Fatalf("%d granted and %d left of %d", len(grant), len(rest), len(c.waiting))
			}
			if !next.Equal(c.wantNext) {
				t.Fatalf("next %v, want %v", next, c.wantNext)
			}
		})
	}
}
