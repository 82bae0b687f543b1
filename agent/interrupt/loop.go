// Package interrupt owns what the agent believes about an interruption: the provider's answers,
// one source at a time (unknown is not none), merged with the interruption record the node
// carries, so that a new agent process resumes every deadline and countdown exactly. Its loops
// poll (or watch) the provider and turn the notices in force into a wish for the node writer and
// a view for the eviction executor; neither waits on the other, and neither waits on a node
// write.
package interrupt

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	k8srecord "k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/none"
)

// Options configures a Loop.
type Options struct {
	NodeName string
	Provider providers.Provider
	Clock    clock.WithTicker
	Metrics  *metrics.Metrics
	Recorder k8srecord.EventRecorder
	// Notifier sends the notices' webhooks; nil when webhooks are off.
	Notifier *notify.Notifier
	Taints   plan.TaintSet
	// PressureTaints are the taints the pressure loop may want, for reprieve_taints_active.
	PressureTaints  []v1.Taint
	MaintenanceLead time.Duration
	SafetyMargin    time.Duration
	PollInterval    time.Duration
	DryRun          bool
	// ApproveEvents tells a cloud that supports it that the node is drained.
	ApproveEvents bool
	// ShutdownCut is how long the kubelet's graceful node shutdown gives the ordinary pods
	// still running at the soft-off (zero: off or unknown); see plan.Window.
	ShutdownCut time.Duration
	// VolumeRelease is how long before the deadline a pod with a volume that needs attaching
	// must be gone (plan.Window.VolumeRelease; zero: off).
	VolumeRelease time.Duration
	// Node returns the informer's copy of the node, nil when not known.
	Node     func() *v1.Node
	Writer   *record.Writer
	Executor *evict.Executor
}

// approveTimeout bounds one approval call (Azure's StartRequests POST).
const approveTimeout = 30 * time.Second

// Loop is the interruption's owner. Its fields under mu are shared between the poll (or watch)
// goroutine, which records answers, and the reconcile goroutine, which reads them; the rest
// belong to the reconcile goroutine.
type Loop struct {
	o        Options
	poke     chan struct{}
	watching bool

	mu      sync.Mutex
	answers *answers
	// noticeID holds the notices already announced (events, webhooks) by ID.
	noticeID map[string]providers.Notice
	// approving is set while an approval call is in flight (off the reconcile loop).
	approving bool

	// farLogged remembers the far-ahead notices already logged; seenAt when this process first
	// saw each NoExecute taint (by key, effect and value).
	farLogged map[string]bool
	seenAt    map[string]time.Time
	// signalSeen is when this process first saw each platform signal (by source), badLogged
	// the unreadable signal values already logged (by key).
	signalSeen map[string]time.Time
	badLogged  map[string]string
}

// New returns a loop that knows nothing yet: until its sources answer, what the node's record
// holds is in force.
func New(o Options) *Loop {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Loop{o: o, poke: make(chan struct{}, 1), answers: newAnswers(o.Provider),
		noticeID: map[string]providers.Notice{}, farLogged: map[string]bool{}, seenAt: map[string]time.Time{},
		signalSeen: map[string]time.Time{}, badLogged: map[string]string{}}
}

// Poke asks for a reconcile: the node changed, or an answer came.
func (l *Loop) Poke() {
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// Asked reports whether the provider has been asked once (readiness).
func (l *Loop) Asked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers.attempted
}

// LastAnswers says when each of the provider's sources last gave a good answer (zero: not
// since this process started).
func (l *Loop) LastAnswers() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers.lastAnswers()
}

// Run polls (or watches) the provider and reconciles until ctx ends. The caller has asked once
// (PollOnce) and reconciled once before.
func (l *Loop) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if w, ok := l.o.Provider.(providers.Watcher); ok {
		l.watching = true
		wg.Go(func() { l.watch(ctx, w) })
	} else {
		wg.Go(func() { l.pollLoop(ctx) })
	}
	l.reconcileLoop(ctx)
	wg.Wait()
}

// reconcileLoop reconciles at every poke (a new answer, a node change), at every change of the
// pressure loop's wish (the writer's PressureChanged: a pressure taint may be NoExecute, and the
// pods are planned on the node as it is about to be) and every poll interval (time-based
// decisions: the maintenance lead, the window's end), and summarizes and approves.
func (l *Loop) reconcileLoop(ctx context.Context) {
	ticker := l.o.Clock.NewTicker(l.o.PollInterval)
	defer ticker.Stop()
	pressure := l.o.Writer.PressureChanged()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.poke:
		case <-pressure:
		case <-ticker.C():
		}
		l.Reconcile(ctx)
		l.maybeApprove(ctx)
	}
}

// pollLoop asks the provider every poll interval, on its own goroutine: a slow metadata call
// delays nothing but the next poll.
func (l *Loop) pollLoop(ctx context.Context) {
	fails := 0
	// Jitter the first tick so that a fleet started together does not poll in unison.
	timer := l.o.Clock.NewTimer(time.Duration(rand.Int64N(int64(l.o.PollInterval))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		if l.PollOnce(ctx) {
			fails = 0
		} else {
			fails++
		}
		l.Poke()
		timer.Reset(l.pollDelay(fails))
	}
}

// watch runs a pushing provider's Watch until ctx ends, applying each update and reconciling at
// once, so that a notice reaches the node without waiting for a tick.
func (l *Loop) watch(ctx context.Context, w providers.Watcher) {
	err := w.Watch(ctx, func(notices []providers.Notice, err error) {
		l.Apply(ctx, notices, err)
		l.Poke()
	})
	if err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "Watching the provider stopped", "provider", l.o.Provider.Name())
	}
}

// pollDelay is the wait before the next poll: the poll interval, or after failures an
// exponential backoff with jitter, capped at twice the interval so that a notice posted once
// the endpoint recovers is still caught within two intervals.
func (l *Loop) pollDelay(fails int) time.Duration {
	d := l.o.PollInterval
	if fails == 0 {
		return d
	}
	backoff := min(d<<min(fails, 4), 2*d)
	// Full-range jitter between 80% and 100% keeps the worst case within the cap.
	return time.Duration(float64(backoff) * (0.8 + 0.2*rand.Float64()))
}

// PollOnce asks the provider for its notices and records them. It reports success.
func (l *Loop) PollOnce(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, max(2*l.o.PollInterval, 3*time.Second))
	defer cancel()
	notices, err := l.o.Provider.Poll(pctx)
	return l.Apply(ctx, notices, err)
}

// Apply records what the provider reported (by a poll or a watch) and reports whether it was a
// success. It never withdraws a notice itself: Reconcile decides, source by source.
func (l *Loop) Apply(ctx context.Context, notices []providers.Notice, err error) bool {
	logger := klog.FromContext(ctx)
	name := l.o.Provider.Name()
	if err != nil {
		l.o.Metrics.PollsTotal.WithLabelValues(name, "error").Inc()
		if ctx.Err() == nil {
			logger.Error(err, "Polling the provider failed; keeping the last known notices, and what the node's record holds for the sources that have not answered", "provider", name)
		}
	} else {
		l.o.Metrics.PollsTotal.WithLabelValues(name, "ok").Inc()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers.record(notices, err, l.o.Clock.Now())
	return err == nil
}

// inForce is the notices in force now: the metadata sources' answers and the node's own
// platform signals, merged with the node's record.
func (l *Loop) inForce(ctx context.Context, node *v1.Node) []providers.Notice {
	l.mu.Lock()
	reported, answered := l.answers.notices, l.answers.answered()
	l.mu.Unlock()
	signals := l.nodeSignals(ctx, node)
	for _, s := range signalSources {
		answered[s] = true // read from the node itself: always an answer
	}
	reported = append(append([]providers.Notice(nil), reported...), signals...)
	if l.o.Provider.Name() == none.Name {
		// The annotation is the none provider's input: nothing to resume.
		return reported
	}
	return InForce(reported, answered, l.recorded(node))
}

// signalSources are the platform signals' sources (NodeSignals).
var signalSources = []string{SourceGKEScheduledMaintenance, SourceGKEActiveMaintenance, SourceGKEImpendingTermination,
	SourceAKSScheduledEvent, SourceKarpenterDisrupted}

// nodeSignals reads the node's platform signals, stamping when this process first saw each
// and saying once per value which could not be read.
func (l *Loop) nodeSignals(ctx context.Context, node *v1.Node) []providers.Notice {
	now := l.o.Clock.Now()
	used := map[string]bool{}
	ns, bad := NodeSignals(node, func(source string) time.Time {
		used[source] = true
		t, ok := l.signalSeen[source]
		if !ok {
			t = now
			l.signalSeen[source] = t
		}
		return t
	})
	for s := range l.signalSeen {
		if !used[s] {
			delete(l.signalSeen, s)
		}
	}
	for key, v := range bad {
		if l.badLogged[key] != v {
			l.badLogged[key] = v
			klog.FromContext(ctx).Error(nil, "A platform signal on the node does not parse; it raises nothing", "key", key, "value", v)
		}
	}
	return ns
}

// announce says each new notice once (log, node event, webhook) and each withdrawn one.
func (l *Loop) announce(ctx context.Context, notices []providers.Notice) {
	logger := klog.FromContext(ctx)
	now := l.o.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]providers.Notice{}
	for _, n := range notices {
		seen[n.ID] = n
		if _, known := l.noticeID[n.ID]; known {
			continue
		}
		l.o.Metrics.NoticesTotal.WithLabelValues(n.Provider, string(n.Kind)).Inc()
		logger.Info("Notice received", "provider", n.Provider, "source", n.Source, "kind", n.Kind, "id", n.ID, "action", n.Action,
			"deadline", n.Deadline, "noticeTime", n.NoticeTime, "description", n.Description)
		typ := v1.EventTypeNormal
		if n.Interrupts() {
			typ = v1.EventTypeWarning
		}
		if n.Interrupts() && !n.Deadline.After(now) {
			logger.Info("The notice's deadline has already passed: evicting every pod due at once, with the shortest grace",
				"provider", n.Provider, "id", n.ID, "deadline", n.Deadline)
		}
		text := describeNotice(n, now)
		l.o.Recorder.Eventf(events.NodeRef(l.o.NodeName), typ, events.NoticeReason(n.Kind), "%s", text)
		l.o.Notifier.Notify(notify.Message{Kind: notify.KindNotice, Node: l.o.NodeName, Provider: n.Provider,
			NoticeKind: string(n.Kind), NoticeID: n.ID, Action: n.Action, Deadline: n.Deadline, NoticeTime: n.NoticeTime,
			Text: fmt.Sprintf("Node %s: %s", l.o.NodeName, text)})
	}
	for id, n := range l.noticeID {
		if _, ok := seen[id]; !ok {
			logger.Info("Notice withdrawn", "provider", n.Provider, "kind", n.Kind, "id", id)
			l.o.Recorder.Eventf(events.NodeRef(l.o.NodeName), v1.EventTypeNormal, events.ReasonNoticeWithdrawn, "Withdrawn: %s", describeNotice(n, now))
		}
	}
	l.noticeID = seen
}

// describeNotice is the one-line text of a notice for events, logs and webhooks.
func describeNotice(n providers.Notice, now time.Time) string {
	s := fmt.Sprintf("%s %s", n.Provider, n.Kind)
	if n.Action != "" {
		s += " (" + n.Action + ")"
	}
	if !n.Deadline.IsZero() {
		s += fmt.Sprintf(", deadline %s (in %s)", n.Deadline.UTC().Format(time.RFC3339), n.Deadline.Sub(now).Round(time.Second))
	}
	return s
}
