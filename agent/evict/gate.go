package evict

import (
	"container/heap"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
)

// The agent's share of the API server under pressure. A reclaimed pool sends every agent's
// evictions in the same second, and API Priority and Fairness (APF) queues or refuses (429)
// what exceeds the seats of the agents' priority level. Retrying each refused pod on its own
// timer spent the seats on retries (more than five requests per pod, most of them 429). The
// gate instead decides which of the agent's requests goes next, one decision for the agent:
//
//   - the request whose pod's last safe moment is nearest goes first (its key), whatever
//     became due first;
//   - at most limit requests are in flight; the limit halves on every throttling answer and
//     grows by one on every accepted request (additive increase, multiplicative decrease, as
//     TCP's congestion control), between 1 and the configured maximum;
//   - a throttling answer pauses the agent's requests for at least its Retry-After, with
//     jitter, so that a fleet of agents throttled in the same second does not come back in
//     the same second;
//   - a request whose must-go moment has come (the pod's force point: a later send cuts its
//     grace) goes past the limit, but still waits out a pause: the server asked for it, and
//     the grace is recomputed when it leaves, so the pod still ends in time, with less grace;
//   - a request whose last chance has come (a 1 s grace barely fits) goes at once, past the
//     pause too: waiting longer makes the pod late for certain, a refusal only possibly;
//   - the server's queueing is measured, not guessed: the time its answers take (a smoothed
//     mean plus four deviations, as TCP's retransmission timeout, RFC 6298) is the margin a
//     grace leaves for the request to wait in APF's queue (queueMargin);
//   - background writes (the pods' early warning) go only when no eviction waits, and hold at
//     most half the slots.
const (
	// gateInitialLimit is the in-flight limit before any answer came back: a burst of a
	// whole node's pods starts with this many, and grows with every accepted request.
	gateInitialLimit = 8
	// throttleBackoffBase and throttleBackoffMax bound the agent's pause after throttling
	// answers in a row when the server gives no longer Retry-After: 100 ms doubling to 5 s.
	throttleBackoffBase = 100 * time.Millisecond
	throttleBackoffMax  = 5 * time.Second
	// retryAfterMax caps a Retry-After: a server (or a proxy) asking for minutes must not
	// hold evictions past their deadlines; the must-go rule would send them anyway.
	retryAfterMax = 30 * time.Second
	// jitterFraction is how much longer than its base a pause may be: a pause of d lasts
	// between d and d*(1+jitterFraction), drawn per agent.
	jitterFraction = 0.5
)

// gate orders and paces one agent's requests to the API server (see above). All its fields
// are guarded by mu.
type gate struct {
	clock clock.Clock
	rand  func() float64 // [0, 1), for the jitter

	mu       sync.Mutex
	max      int
	limit    int
	inflight int
	bgFlight int // background requests in flight
	waiting  waiters
	seq      uint64
	// pauseUntil is when the agent may send again after a throttling answer; throttles counts
	// the throttling answers since the last accepted request.
	pauseUntil time.Time
	throttles  int
	// srtt and rttvar are the smoothed answer time and its deviation (RFC 6298, section 2).
	srtt, rttvar time.Duration
}

// queueMarginMax caps the measured queueing margin: past it the grace is better spent on the
// pod than on the queue, and the request's bound resends it.
const queueMarginMax = 10 * time.Second

// queueMargin is how long a request is expected to take at most now: srtt + 4 rttvar.
func (g *gate) queueMargin() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return min(g.srtt+4*g.rttvar, queueMarginMax)
}

// observe feeds one answer's time into the margin (RFC 6298, 2.2 and 2.3: alpha 1/8, beta 1/4).
// Called with mu held.
func (g *gate) observe(d time.Duration) {
	if g.srtt == 0 {
		g.srtt, g.rttvar = d, d/2
		return
	}
	diff := g.srtt - d
	if diff < 0 {
		diff = -diff
	}
	g.rttvar = (3*g.rttvar + diff) / 4
	g.srtt = (7*g.srtt + d) / 8
}

// newGate returns a gate allowing up to maxInFlight requests at once (at least 1).
func newGate(clk clock.Clock, maxInFlight int, rnd func() float64) *gate {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	if rnd == nil {
		rnd = rand.Float64 // randomly seeded per process: every agent draws its own
	}
	return &gate{clock: clk, rand: rnd, max: maxInFlight, limit: min(gateInitialLimit, maxInFlight)}
}

// waiter is one request waiting for a slot.
type waiter struct {
	key        time.Time // the pod's last safe moment: smaller goes first
	mustGo     time.Time // from then on it goes past the limit; zero: never
	lastChance time.Time // from then on it goes past the pause too; zero: never
	background bool
	seq        uint64 // arrival order among equal keys
	granted    chan struct{}
	index      int
}

type waiters []*waiter

func (w waiters) Len() int { return len(w) }
func (w waiters) Less(i, j int) bool {
	a, b := w[i], w[j]
	if a.background != b.background {
		return !a.background
	}
	if !a.key.Equal(b.key) {
		return a.key.Before(b.key)
	}
	return a.seq < b.seq
}
func (w waiters) Swap(i, j int) {
	w[i], w[j] = w[j], w[i]
	w[i].index, w[j].index = i, j
}
func (w *waiters) Push(x any) {
	it := x.(*waiter)
	it.index = len(*w)
	*w = append(*w, it)
}
func (w *waiters) Pop() any {
	old := *w
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*w = old[:len(old)-1]
	it.index = -1
	return it
}

// ticket is a granted slot; done returns it with the request's result.
type ticket struct {
	g          *gate
	background bool
	at         time.Time // when it was granted
	once       sync.Once
}

// done returns the slot and feeds the request's result back: a throttling answer pauses the
// agent and halves the limit, an answer from the server (any other, a refusal too) grows it.
// A request that never reached an answer (a timeout, a broken connection) changes neither.
func (t *ticket) done(err error) {
	t.once.Do(func() { t.g.release(t.background, err, t.g.clock.Since(t.at)) })
}

// acquire waits for a slot for a request with the given key (the pod's last safe moment) and
// must-go moment (zero: none), or a background slot. It returns ctx's error when ctx ends
// first.
func (g *gate) acquire(ctx context.Context, key, mustGo, lastChance time.Time, background bool) (*ticket, error) {
	g.mu.Lock()
	g.seq++
	w := &waiter{key: key, mustGo: mustGo, lastChance: lastChance, background: background, seq: g.seq, granted: make(chan struct{})}
	heap.Push(&g.waiting, w)
	wake := g.dispatch()
	g.mu.Unlock()
	for {
		var timer <-chan time.Time
		var t clock.Timer
		if wake > 0 {
			t = g.clock.NewTimer(wake)
			timer = t.C()
		}
		select {
		case <-w.granted:
			stop(t)
			return &ticket{g: g, background: background, at: g.clock.Now()}, nil
		case <-ctx.Done():
			stop(t)
			g.mu.Lock()
			select {
			case <-w.granted:
				// Granted while ctx ended: hand the slot back.
				g.mu.Unlock()
				g.release(background, errNotSent, 0)
			default:
				heap.Remove(&g.waiting, w.index)
				g.mu.Unlock()
			}
			return nil, ctx.Err()
		case <-timer:
			g.mu.Lock()
			wake = g.dispatch()
			g.mu.Unlock()
		}
	}
}

func stop(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// dispatch grants slots to the waiters that may go now, most urgent first, and returns how
// long until the next moment one more may go without a release (the pause's end, or a
// waiter's must-go moment; 0: only on a release). Called with mu held.
func (g *gate) dispatch() time.Duration {
	now := g.clock.Now()
	paused := now.Before(g.pauseUntil)
	// Those whose last chance has come go first and past everything; during no pause, those
	// whose must-go moment has come go past the limit.
	var forced []*waiter
	for _, w := range g.waiting {
		if due(w.lastChance, now) || (!paused && due(w.mustGo, now)) {
			forced = append(forced, w)
		}
	}
	for _, w := range forced {
		heap.Remove(&g.waiting, w.index)
		g.grant(w)
	}
	for !paused && g.waiting.Len() > 0 && g.inflight < g.limit {
		w := g.waiting[0]
		if w.background && g.bgFlight >= max(1, g.limit/2) {
			break
		}
		heap.Pop(&g.waiting)
		g.grant(w)
	}
	var next time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if paused && g.waiting.Len() > 0 {
		earlier(g.pauseUntil)
	}
	for _, w := range g.waiting {
		earlier(w.lastChance)
		if !paused {
			earlier(w.mustGo)
		}
	}
	if next.IsZero() {
		return 0
	}
	return max(next.Sub(now), time.Nanosecond)
}

// due reports whether t is set and has come.
func due(t, now time.Time) bool { return !t.IsZero() && !now.Before(t) }

func (g *gate) grant(w *waiter) {
	g.inflight++
	if w.background {
		g.bgFlight++
	}
	close(w.granted)
}

func (g *gate) release(background bool, err error, took time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if background {
		g.bgFlight--
	}
	if measures(err) {
		g.observe(took)
	}
	switch {
	case isThrottled(err) || errors.Is(err, errQueueBound):
		g.throttles++
		g.limit = max(1, g.limit/2)
		pause := min(throttleBackoffBase<<min(g.throttles-1, 10), throttleBackoffMax)
		if s, ok := apierrors.SuggestsClientDelay(err); ok {
			pause = max(pause, min(time.Duration(s)*time.Second, retryAfterMax))
		}
		// Jitter on top of Retry-After, never below it: the server asked for at least that.
		pause += time.Duration(g.rand() * jitterFraction * float64(pause))
		if until := g.clock.Now().Add(pause); until.After(g.pauseUntil) {
			g.pauseUntil = until
		}
	case answered(err):
		g.throttles = 0
		g.limit = min(g.max, g.limit+1)
	}
	g.dispatch()
}

// isThrottled reports whether err is the API server's own throttling: a 429 that is not a
// PodDisruptionBudget's refusal (APF, or --max-requests-inflight without APF).
func isThrottled(err error) bool {
	return err != nil && apierrors.IsTooManyRequests(err) && !isPDBRefusal(err)
}

// errQueueBound marks a request cut at its QueueBound: it waited in the server's queue for all
// the slack its grace left. For the gate it is throttling without a Retry-After: the server is
// slower than the margin said. Its time counts in the margin, as a lower bound.
var errQueueBound = errors.New("waited in the API server's queue past its bound")

// measures reports whether a request that ended with err measured the server's queue: an
// accepted request, a refusal about the pod (a budget, 404, 409), APF's 429, or a request cut
// at its bound (a lower bound). A server error (an etcd timeout) measures a failure, not the
// queue: its retries go through the force point anyway.
func measures(err error) bool {
	return err == nil || isThrottled(err) || errors.Is(err, errQueueBound) || isPDBRefusal(err) ||
		apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}

// answered reports whether err (nil included) is an answer of the API server about the
// request, rather than a request that never got one (a timeout, a broken connection).
func answered(err error) bool {
	var st apierrors.APIStatus
	return err == nil || errors.As(err, &st) || errors.Is(err, errQueueBound)
}

// pauseLeft is how long the agent's pause after throttling still lasts (0: none).
func (g *gate) pauseLeft() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(g.pauseUntil.Sub(g.clock.Now()), 0)
}

// state returns the limit, the requests in flight, the waiters and the pause's end, for tests
// and logs.
func (g *gate) state() (limit, inflight, waiting int, pauseUntil time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit, g.inflight, g.waiting.Len(), g.pauseUntil
}
