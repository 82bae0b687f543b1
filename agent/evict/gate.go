package evict

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
)

// The agent's share of the API server under pressure. A reclaimed pool sends every agent's
// evictions in the same second, and API Priority and Fairness (APF) queues or refuses (429)
// what exceeds the seats of the agents' priority level. The gate decides which of the agent's
// requests goes next, one decision for the agent. Its rules are written once, in
// docs/design.md ("The order of requests under pressure"), and named where the code applies
// them: urgency, limit, pause, must-go, last chance, background, lost budget, horizon, cold
// start, one in flight. The policy is admit, a pure function of the gate's state and its
// waiters; the gate around it keeps the state, grants through each waiter's callback and arms
// one timer for the policy's next moment.
const (
	// gateInitialLimit is the in-flight limit of a new gate, for requests that are not
	// deadline-bound (a notice restarts at gateRestartLimit).
	gateInitialLimit = 8
	// gateRestartLimit is the in-flight limit at a notice (see above): RFC 5681's restart
	// window, two segments of TCP's initial window.
	gateRestartLimit = 2
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
	// congestedRTT is the smoothed answer time from which the server counts as congested: an
	// eviction's own work is tens of milliseconds, so a second is time in APF's queue.
	congestedRTT = time.Second
	// horizonMin is the least horizon: a request due within it is never held.
	horizonMin = 2 * time.Second
)

// gate orders and paces one agent's requests to the API server (see above). All its fields
// are guarded by mu.
type gate struct {
	clock clock.WithDelayedExecution
	rand  func() float64 // [0, 1), for the jitter

	mu       sync.Mutex
	max      int
	limit    int
	inflight int
	bgFlight int // background requests in flight
	waiting  []*waiter
	seq      uint64
	// pauseUntil is when the agent may send again after a throttling answer; throttles counts
	// the throttling answers since the last accepted request.
	pauseUntil time.Time
	throttles  int
	// srtt and rttvar are the smoothed answer time and its deviation (RFC 6298, section 2).
	srtt, rttvar time.Duration
	// recent holds the last answers' times (the newest at recent[(nRecent-1)%len]), for
	// sendMargin; nRecent counts them since the margin was last seeded.
	recent  [recentAnswers]time.Duration
	nRecent int
	// timer fires at timerAt, the policy's next moment (zero: none armed); timerGen tells the
	// current timer from one stopped too late. Every dispatch re-arms it: a held request's
	// horizon moves with every answer.
	timer    clock.Timer
	timerAt  time.Time
	timerGen uint64
	// probing is set from a notice to the first answer: the server counts as congested
	// meanwhile (see above). reseed makes the next measured answer the margin's first
	// measurement.
	probing, reseed bool
	// prior is the slowest answer measured outside the gate at priorAt (seed): the margin
	// until the gate's first answer.
	prior   time.Duration
	priorAt time.Time
}

// queueMarginMax caps the measured queueing margin: past it the grace is better spent on the
// pod than on the queue, and the request's bound resends it.
const queueMarginMax = 10 * time.Second

// queueMargin is how long a request is expected to take at most now: srtt + 4 rttvar. It sets
// the horizon (and so what the gate holds under congestion); a request's own send and grace
// take the tighter sendMargin.
func (g *gate) queueMargin() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return min(g.srtt+4*g.rttvar, queueMarginMax)
}

// recentAnswers is how many of the last answers bound sendMargin.
const recentAnswers = 8

// sendMargin is the margin a request leaves for the server's queue: queueMargin, but never
// more than the longest of the last recentAnswers answers. RFC 6298's estimate is built for a
// stream of measurements: its first one counts half the answer as deviation (rttvar = R/2,
// so the margin is 3R), and a node has a handful of pods, so it often never gets past that.
// A deadline-bound pod leaves the margin before its send: after one 237 ms answer on a loaded
// machine, 3R sent one 1.2 s before its plan, where that answer itself said 237 ms (and the
// eviction took 20 ms). The longest recent answer is measured, not modelled; a request that
// takes longer still has RequestAllowance, and past its QueueBound it is sent again with
// the grace recomputed. With many answers the longest eight is mostly below the estimate's
// four deviations too; after a lone slow one, the estimate forgets it sooner.
func (g *gate) sendMargin() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.margin()
}

// margin is sendMargin. Called with mu held.
func (g *gate) margin() time.Duration {
	if g.nRecent == 0 {
		// No answer of its own yet: what was measured at start, while it is recent (seed).
		if !g.priorAt.IsZero() && g.clock.Now().Sub(g.priorAt) < priorFor {
			return min(g.prior, queueMarginMax)
		}
		return 0
	}
	longest := time.Duration(0)
	for _, d := range g.recent[:min(g.nRecent, recentAnswers)] {
		longest = max(longest, d)
	}
	return min(g.srtt+4*g.rttvar, longest, queueMarginMax)
}

// priorFor is how long an answer measured outside the gate (seed) stands for the margin before
// the gate's own first answer: a restart during a notice evicts within seconds of its start;
// an agent started long before its first notice starts that notice with nothing measured, as
// before.
const priorFor = time.Minute

// seed records d, an answer of the API server that the agent measured outside the gate (its
// caches' first list at start), as the margin until the gate's own first answer, for priorFor;
// of several, the slowest. A new process knows nothing of the server's queue otherwise: its
// first eviction of a pod whose grace was cut to the window went with no margin, a slow first
// answer cut it at its bound (0.25 s to 1.25 s, what its rounded grace left), and the DELETE
// that followed paid the cut's time and the margin it measured, 2 s less than fitted (issue 50,
// case 7).
func (g *gate) seed(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	if g.priorAt.IsZero() || now.Sub(g.priorAt) >= priorFor || d > g.prior {
		g.prior = d
	}
	g.priorAt = now
}

// observe feeds one answer's time into the margin (RFC 6298, 2.2 and 2.3: alpha 1/8, beta 1/4).
// Called with mu held.
func (g *gate) observe(d time.Duration) {
	if g.srtt == 0 || g.reseed {
		g.reseed = false
		g.srtt, g.rttvar = d, d/2
		g.nRecent = 0
		g.remember(d)
		return
	}
	g.remember(d)
	diff := g.srtt - d
	if diff < 0 {
		diff = -diff
	}
	g.rttvar = (3*g.rttvar + diff) / 4
	g.srtt = (7*g.srtt + d) / 8
}

// remember keeps d among the recent answers. Called with mu held.
func (g *gate) remember(d time.Duration) {
	g.recent[g.nRecent%recentAnswers] = d
	g.nRecent++
}

// newGate returns a gate allowing up to maxInFlight requests at once (at least 1).
func newGate(clk clock.WithDelayedExecution, maxInFlight int, rnd func() float64) *gate {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	if rnd == nil {
		rnd = rand.Float64 // randomly seeded per process: every agent draws its own
	}
	return &gate{clock: clk, rand: rnd, max: maxInFlight, limit: min(gateInitialLimit, maxInFlight)}
}

// waiter is one request waiting for a slot. It holds no goroutine: the gate calls grant once
// it may go.
type waiter struct {
	key time.Time // the pod's last safe moment: smaller goes first
	// mustGo and lastChance are the moments from which it goes past the limit, and past the
	// pause too (zero: never), before the margin: the policy takes off the send margin of the
	// moment (admit), so that a request decided with a smaller margin goes when it must now
	// (issue 50, case 2).
	mustGo, lastChance time.Time
	background         bool
	seq                uint64 // arrival order among equal keys
	// grant is called, with the gate's lock held, once the request may go; it must return at
	// once (hand the ticket to a channel or a new goroutine) and must not call the gate.
	grant func(*ticket)
	out   bool // granted
}

// overdue reports whether w's pod is past its last safe moment at now: a deadline-bound
// request (one with a last chance) whose key has passed.
func (w *waiter) overdue(now time.Time) bool {
	return !w.lastChance.IsZero() && w.key.Before(now)
}

// before reports whether a goes before b at now: evictions before background writes, a
// budget that can still be kept before a lost one, then the nearest last safe moment, then
// arrival.
func before(a, b *waiter, now time.Time) bool {
	if a.background != b.background {
		return !a.background
	}
	if ao, bo := a.overdue(now), b.overdue(now); ao != bo {
		return !ao
	}
	if !a.key.Equal(b.key) {
		return a.key.Before(b.key)
	}
	return a.seq < b.seq
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

// submit queues w and grants it at once when it may go (w.grant is then called before submit
// returns); otherwise the gate grants it later, on an answer or at the next moment the policy
// names (its timer). Nothing waits on w's behalf: a held request holds no worker.
func (g *gate) submit(w *waiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	w.seq = g.seq
	g.waiting = append(g.waiting, w)
	g.dispatch()
}

// withdraw takes w out of the gate if it was not granted yet, and reports whether it did; a
// granted w has its ticket (w.grant was called) and must return it with done.
func (g *gate) withdraw(w *waiter) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.out {
		return false
	}
	if i := slices.Index(g.waiting, w); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
	}
	g.dispatch()
	return true
}

// acquire waits for a slot for a request with the given key (the pod's last safe moment) and
// must-go moment (zero: none), or a background slot. It returns ctx's error when ctx ends
// first. It is submit for a caller that may block (the pressure loop, the pods' early
// warning, a test); the executor's workers submit and move on.
func (g *gate) acquire(ctx context.Context, key, mustGo, lastChance time.Time, background bool) (*ticket, error) {
	ch := make(chan *ticket, 1)
	w := &waiter{key: key, mustGo: mustGo, lastChance: lastChance, background: background,
		grant: func(t *ticket) { ch <- t }}
	g.submit(w)
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		if !g.withdraw(w) {
			// Granted while ctx ended: hand the slot back.
			(<-ch).done(errNotSent)
		}
		return nil, ctx.Err()
	}
}

// notice starts a notice cold (rule cold start): with nothing in flight, the limit falls back to at
// most gateRestartLimit and the gate probes; with requests in flight, their answers measure
// the server already. SetView calls it for every new window with a deadline.
func (g *gate) notice() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inflight > 0 {
		return
	}
	g.limit = min(g.limit, gateRestartLimit)
	g.probing, g.reseed = true, true
}

// congested reports whether the server looks saturated to the agent at now (see above).
// Called with mu held.
func (g *gate) congested(now time.Time) bool {
	return g.probing || g.throttles > 0 || now.Before(g.pauseUntil) || g.srtt >= congestedRTT
}

// horizon is how far ahead of its last safe moment a request is sent while the server is
// congested: twice what a request is expected to take at most now, so that one sent at the
// horizon still meets its moment when the server is twice as slow; at least horizonMin.
// Called with mu held.
func (g *gate) horizon() time.Duration {
	return max(horizonMin, 2*min(g.srtt+4*g.rttvar, queueMarginMax))
}

// gateState is what the gate's policy decides from besides the waiters: a value, so that the
// policy is a pure function of it (admit).
type gateState struct {
	now                 time.Time
	pauseUntil          time.Time
	congested           bool
	horizon             time.Duration
	limit, inflight, bg int // the in-flight limit, requests in flight, background ones of them
	// margin is the send margin of the moment (sendMargin).
	margin time.Duration
}

// snapshot is the gate's state for admit at now. Called with mu held.
func (g *gate) snapshot(now time.Time) gateState {
	return gateState{now: now, pauseUntil: g.pauseUntil, congested: g.congested(now), horizon: g.horizon(),
		limit: g.limit, inflight: g.inflight, bg: g.bgFlight, margin: g.margin()}
}

// held reports whether w waits, slot or not, in s (rules horizon and one in flight,
// docs/design.md): the server is congested and w's last safe moment is
// further than the horizon, or already past (a lost budget) and its last chance further than
// the horizon. Only deadline-bound evictions are held, and none while nothing is in flight.
func held(w *waiter, s gateState) bool {
	if s.inflight == 0 {
		// Only an answer shows the congestion, and only one in flight keeps the server's
		// seats busy: the most urgent request goes.
		return false
	}
	if !s.congested || w.background || w.lastChance.IsZero() {
		return false
	}
	// A lost budget's deadline is its last chance (to be gone in time at all).
	if w.overdue(s.now) {
		return s.lastChance(w).After(s.now.Add(s.horizon))
	}
	return w.key.After(s.now.Add(s.horizon))
}

// mustGo and lastChance are w's moments in s: less the margin of the moment (zero stays zero).
func (s gateState) mustGo(w *waiter) time.Time     { return lessMargin(w.mustGo, s.margin) }
func (s gateState) lastChance(w *waiter) time.Time { return lessMargin(w.lastChance, s.margin) }

func lessMargin(t time.Time, margin time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(-margin)
}

// admit is the gate's policy (docs/design.md, "The gate's rules"), a pure function: given the
// gate's state and its waiters, it returns the waiters that go now (in the order they go), the
// rest (most urgent first), and the next moment at which one more may go without an answer
// (the pause's end, a must-go moment or last chance, a held waiter's horizon; zero: only on an
// answer). It does not change waiting. Every waiter's must-go moment and last chance are taken
// less the margin of the moment (s.margin): the gate decides its waiters again at every
// answer, which is when the margin changes.
func admit(s gateState, waiting []*waiter) (grant, rest []*waiter, next time.Time) {
	now := s.now
	paused := now.Before(s.pauseUntil)
	// Rules last chance (past everything) and must-go (past the limit, during no pause),
	// unless the budget is lost already (rule lost budget: past the limit it would take a
	// seat from a budget that can still be kept).
	for _, w := range waiting {
		if due(s.lastChance(w), now) || (!paused && due(s.mustGo(w), now) && !w.overdue(now)) {
			grant = append(grant, w)
			s.inflight++
			if w.background {
				s.bg++
			}
		} else {
			rest = append(rest, w)
		}
	}
	// Rule urgency: it orders every waiter, whenever it arrived (lost budgets last, rule lost
	// budget; background writes after evictions, rule background).
	slices.SortFunc(rest, func(a, b *waiter) int {
		switch {
		case before(a, b, now):
			return -1
		case before(b, a, now):
			return 1
		}
		return 0
	})
	// Rules pause and limit.
	for !paused && len(rest) > 0 && s.inflight < s.limit {
		i := slices.IndexFunc(rest, func(w *waiter) bool { return !held(w, s) })
		if i < 0 {
			break
		}
		w := rest[i]
		// Evictions sort first: a background write behind one (held) waits too, and
		// background writes hold at most half the slots.
		if w.background && (i > 0 || s.bg >= max(1, s.limit/2)) {
			break
		}
		rest = slices.Delete(slices.Clone(rest), i, i+1)
		grant = append(grant, w)
		s.inflight++
		if w.background {
			s.bg++
		}
	}
	earlier := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if paused && len(rest) > 0 {
		earlier(s.pauseUntil)
	}
	for _, w := range rest {
		earlier(s.lastChance(w))
		if !paused {
			earlier(s.mustGo(w))
		}
		if held(w, s) {
			if w.overdue(now) {
				earlier(s.lastChance(w).Add(-s.horizon))
			} else {
				earlier(w.key.Add(-s.horizon))
			}
		}
	}
	return grant, rest, next
}

// dispatch carries out admit: it grants what goes now and arms the gate's one timer for the
// next moment. Called with mu held.
func (g *gate) dispatch() {
	now := g.clock.Now()
	grant, rest, next := admit(g.snapshot(now), g.waiting)
	g.waiting = rest
	for _, w := range grant {
		w.out = true
		g.inflight++
		if w.background {
			g.bgFlight++
		}
		w.grant(&ticket{g: g, background: w.background, at: now})
	}
	g.arm(now, next)
}

// arm sets the gate's timer for next (zero: none). Called with mu held.
func (g *gate) arm(now, next time.Time) {
	if g.timer != nil && next.Equal(g.timerAt) {
		return
	}
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.timerAt = next
	if next.IsZero() {
		return
	}
	g.timerGen++
	gen := g.timerGen
	// In a goroutine: a fake clock runs AfterFunc's function with its own lock held, and
	// dispatch reads the clock.
	g.timer = g.clock.AfterFunc(max(next.Sub(now), time.Nanosecond), func() { go g.fire(gen) })
}

// fire is the gate's timer: the next moment has come.
func (g *gate) fire(gen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gen == g.timerGen {
		g.timer, g.timerAt = nil, time.Time{}
	}
	g.dispatch()
}

// due reports whether t is set and has come.
func due(t, now time.Time) bool { return !t.IsZero() && !now.Before(t) }

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
	if answered(err) {
		// The probe's answer (see notice): from now on the answers say whether the
		// server is congested.
		g.probing = false
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
	return g.limit, g.inflight, len(g.waiting), g.pauseUntil
}
