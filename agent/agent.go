package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/none"
)

// Version is the build's version, set by main from its ldflags.
var Version = "dev"

// Deps are the agent's collaborators, injected so that tests can replace each one.
type Deps struct {
	Client kubernetes.Interface
	// Provider reports the cloud's notices. Nil with --provider none: the agent then reads the
	// deadline annotation of its own node.
	Provider providers.Provider
	Clock    clock.WithTicker
	// Registerer and Gatherer are the agent's private metrics registry.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Recorder records Kubernetes Events; nil starts client-go's broadcaster in Run.
	Recorder record.EventRecorder
	// PressureSource reads the pressure signals; nil builds the one --pressure-source names.
	PressureSource kubelet.Source
}

// Agent watches one node and its pods.
type Agent struct {
	cfg      Config
	client   kubernetes.Interface
	provider providers.Provider
	clock    clock.WithTicker
	metrics  *Metrics
	gatherer prometheus.Gatherer
	taints   TaintSet
	filter   PodFilter

	nodeFactory, podFactory informers.SharedInformerFactory
	nodeLister              corelisters.NodeLister
	podLister               corelisters.PodLister
	queue                   workqueue.TypedDelayingInterface[string]
	writer                  *nodeWriter
	evictFn                 func(context.Context, *policyv1.Eviction) error
	recorder                record.EventRecorder
	notifier                *notify.Notifier // nil when webhooks are off
	podNotice               *podNotifier     // the pods' early warning; nil when it and the notice endpoint are off
	nodeChanged             chan struct{}
	ready                   atomic.Bool
	watching                bool // the provider pushes changes; the loop does not poll it

	mu       sync.Mutex
	notices  []providers.Notice
	polled   bool
	view     planView
	addedAt  map[string]time.Time
	seenAt   map[string]time.Time
	noticeID map[string]providers.Notice
	// farLogged remembers the far-ahead notices already logged.
	farLogged map[string]bool
	// drain is the eviction state of the current window (see drain); never nil.
	drain *drain
	// pressureTaints are the pressure taints wanted on the node.
	pressureTaints map[pressure.Resource]bool

	// pressure is the local-pressure loop's state; nil with --pressure-source off.
	pressure *pressureState

	// refusals counts node writes the API server refused; enough in a row make the agent
	// not ready.
	refusals *writeRefusals
}

// planView is what every pod's plan is computed from.
type planView struct {
	taints []v1.Taint // the node's NoExecute taints, each with TimeAdded set
	window Window
}

func (v planView) equal(o planView) bool {
	return v.window.Equal(o.window) && slices.EqualFunc(v.taints, o.taints, func(a, b v1.Taint) bool {
		return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect && a.TimeAdded.Equal(b.TimeAdded)
	})
}

// New builds an agent from a validated configuration.
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Client == nil {
		return nil, errors.New("agent: no Kubernetes client")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if (deps.Registerer == nil) != (deps.Gatherer == nil) {
		return nil, errors.New("agent: give both a metrics Registerer and its Gatherer, or neither")
	}
	if deps.Registerer == nil {
		reg := prometheus.NewRegistry()
		deps.Registerer, deps.Gatherer = reg, reg
	}
	var err error
	ts := taintSetOf(cfg)

	a := &Agent{
		cfg:         cfg,
		client:      deps.Client,
		provider:    deps.Provider,
		clock:       deps.Clock,
		gatherer:    deps.Gatherer,
		taints:      ts,
		filter:      filterOf(cfg),
		nodeChanged: make(chan struct{}, 1),
		addedAt:     map[string]time.Time{},
		seenAt:      map[string]time.Time{},
		drain:       newDrain(Window{SafetyMargin: cfg.SafetyMargin}, nil),
		noticeID:    map[string]providers.Notice{},
		farLogged:   map[string]bool{},
		recorder:    deps.Recorder,
	}
	if a.provider == nil {
		a.provider = none.New(a.deadlineAnnotation)
	}
	if a.metrics, err = NewMetrics(deps.Registerer, a.provider.Name()); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	a.metrics.BuildInfo.WithLabelValues(Version, buildRevision(), runtime.Version(), runtime.GOOS, runtime.GOARCH).Set(1)
	if ncfg, ok, err := cfg.NotifyConfig(); ok {
		if err != nil {
			return nil, fmt.Errorf("configuring the webhook: %w", err)
		}
		if a.notifier, err = notify.New(ncfg, notify.WithClock(deps.Clock)); err != nil {
			return nil, fmt.Errorf("creating the webhook notifier: %w", err)
		}
		if err := a.notifier.Register(deps.Registerer); err != nil {
			return nil, fmt.Errorf("registering webhook metrics: %w", err)
		}
	}

	// Watch only this node and only its pods: the agent must stay cheap for the API server at
	// thousands of nodes.
	a.nodeFactory = informers.NewSharedInformerFactoryWithOptions(deps.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, cfg.NodeName).String()
		}))
	a.podFactory = informers.NewSharedInformerFactoryWithOptions(deps.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		}))
	a.nodeLister = a.nodeFactory.Core().V1().Nodes().Lister()
	a.podLister = a.podFactory.Core().V1().Pods().Lister()
	a.queue = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{
		Clock: deps.Clock, Name: "",
	})
	a.evictFn = postEviction(deps.Client)
	if a.pressure, err = newPressure(cfg, deps.PressureSource); err != nil {
		return nil, err
	}
	a.refusals = &writeRefusals{limit: cfg.NodeWriteRefusals, metrics: a.metrics}
	a.writer = &nodeWriter{client: deps.Client, nodeName: cfg.NodeName, dryRun: cfg.DryRun, cached: a.cachedNode, observe: a.refusals.observe}
	a.podNotice = newPodNotifier(cfg, deps.Client, a.podLister, deps.Clock)
	if a.podNotice != nil {
		a.podNotice.wrote = func(result string) { a.metrics.PodWarningWrites.WithLabelValues(result).Inc() }
	}
	return a, nil
}

// Run runs every loop of the agent until ctx ends. It returns nil on a clean stop. When ctx
// ends during an interruption (SIGTERM while the node drains), the agent keeps carrying out the
// plan until the window's end (or until the kubelet's SIGKILL at the end of its pod's grace),
// then delivers the queued webhooks and returns.
func (a *Agent) Run(ctx context.Context) error {
	parent := ctx
	ctx, stopWork := context.WithCancel(context.WithoutCancel(parent))
	defer stopWork()
	workDone := make(chan struct{})
	defer close(workDone)
	go a.lingerOnStop(parent, a.clock, stopWork, workDone)
	logger := klog.FromContext(ctx)
	logger.Info("Starting reprieve", "version", Version, "node", a.cfg.NodeName, "provider", a.provider.Name(),
		"interruptionTaint", a.cfg.InterruptionTaint, "safetyMargin", a.cfg.SafetyMargin, "dryRun", a.cfg.DryRun)
	// The metadata services are link-local by default; an override sends the agent elsewhere
	// for its notices, so it is said at start.
	def := DefaultConfig()
	for _, ep := range []struct{ flag, value, def string }{
		{"--aws-imds-endpoint", a.cfg.AWSIMDSEndpoint, def.AWSIMDSEndpoint},
		{"--gcp-metadata-endpoint", a.cfg.GCPMetadataEndpoint, def.GCPMetadataEndpoint},
		{"--azure-imds-endpoint", a.cfg.AzureIMDSEndpoint, def.AzureIMDSEndpoint},
	} {
		if ep.value != ep.def {
			logger.Info("Metadata endpoint overridden by flag", "flag", ep.flag, "endpoint", ep.value, "default", ep.def)
		}
	}

	if _, err := a.nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.signalNode() },
		UpdateFunc: func(any, any) { a.signalNode() },
		DeleteFunc: func(any) { a.signalNode() },
	}); err != nil {
		return fmt.Errorf("watching node: %w", err)
	}
	if _, err := a.podFactory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.enqueuePod,
		UpdateFunc: func(_, obj any) { a.enqueuePod(obj) },
		DeleteFunc: a.enqueuePod,
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}

	g, ctx := errgroup.WithContext(ctx)
	if srv := a.metricsServer(); srv != nil {
		ln, err := net.Listen("tcp", a.cfg.MetricsBindAddress)
		if err != nil {
			return fmt.Errorf("listening on --metrics-bind-address %s: %w", a.cfg.MetricsBindAddress, err)
		}
		ln = metricsListener(ln)
		logger.Info("Serving metrics", "address", ln.Addr().String())
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving metrics: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}

	if a.recorder == nil {
		rec, stop := newRecorder(ctx, a.client, a.cfg.NodeName)
		defer stop()
		a.recorder = rec
	}
	a.nodeFactory.Start(ctx.Done())
	a.podFactory.Start(ctx.Done())
	defer a.nodeFactory.Shutdown()
	defer a.podFactory.Shutdown()
	for _, synced := range []map[reflect.Type]bool{a.nodeFactory.WaitForCacheSync(ctx.Done()), a.podFactory.WaitForCacheSync(ctx.Done())} {
		for typ, ok := range synced {
			if !ok {
				_ = g.Wait()
				return fmt.Errorf("waiting for the %v cache to sync: %w", typ, ctx.Err())
			}
		}
	}

	// Learn the cloud's state before planning anything, so that a restarted agent re-plans with
	// the deadline it had rather than evicting on the taints alone.
	a.pollOnce(ctx)
	if a.pressure != nil {
		if err := a.startPressure(ctx); err != nil {
			// The interruption handling must not depend on the pressure source.
			logger.Error(err, "Local pressure handling is off")
			a.pressure = nil
		}
	}
	if a.cfg.NodeWriteRefusals > 0 {
		// Without this a token whose writes are refused (no node claim) would be found out
		// only at the next interruption, when the taint write fails.
		g.Go(func() error { a.watchNodeWrite(ctx); return nil })
	}
	a.reconcile(ctx)
	a.ready.Store(true)

	if a.notifier != nil {
		// The notifier outlives the work: what the work queued is flushed once it stops.
		nctx, stopNotify := context.WithCancel(context.WithoutCancel(ctx))
		notified := make(chan struct{})
		go func() { defer close(notified); a.notifier.Run(nctx) }()
		defer func() {
			a.notifier.Flush()
			t := a.clock.NewTimer(notifyFlushTimeout)
			defer t.Stop()
			select {
			case <-notified:
			case <-t.C():
				logger.Info("Delivering the queued webhooks took too long; dropping the rest", "timeout", notifyFlushTimeout)
			}
			stopNotify()
			<-notified
		}()
	}
	if w, ok := a.provider.(providers.Watcher); ok {
		a.watching = true
		g.Go(func() error { a.watch(ctx, w); return nil })
	}
	a.startPodNotice(ctx, g)
	g.Go(func() error { a.nodeLoop(ctx); return nil })
	if a.pressure != nil {
		g.Go(func() error { a.pressureLoop(ctx); return nil })
	}
	for range a.cfg.EvictionWorkers {
		g.Go(func() error { a.worker(ctx); return nil })
	}
	g.Go(func() error { <-ctx.Done(); a.queue.ShutDown(); return nil })
	err := g.Wait()
	logger.Info("Stopped reprieve")
	return err
}

// notifyFlushTimeout bounds the delivery of the queued webhooks when the agent stops.
const notifyFlushTimeout = 10 * time.Second

// lingerOnStop ends the agent's work (stopWork) once parent ends, unless an interruption is
// pending: a DaemonSet rollout or a node shutdown that sends SIGTERM in the middle of a window
// must not drop the evictions still due in it. The pod's own grace is the time to finish; the
// chart sets it to cover a whole window. The agent then keeps working until the window's end,
// or until the interruption is withdrawn. It returns when workDone is closed.
func (a *Agent) lingerOnStop(parent context.Context, clk clock.WithTicker, stopWork func(), workDone <-chan struct{}) {
	select {
	case <-parent.Done():
	case <-workDone:
		return
	}
	logger := klog.FromContext(parent)
	// The agent's own grace bounds how long it may linger (--stop-grace, under the pod's
	// terminationGracePeriodSeconds). A window that ends after it (a scheduled maintenance hours
	// away) is not this process's to finish: it stops at once, and the next agent resumes from
	// the node's taint, its timeAdded and the deadline annotation.
	limit := clk.Now().Add(a.cfg.StopGrace)
	said := false
	for {
		a.mu.Lock()
		w := a.drain.window
		a.mu.Unlock()
		now := clk.Now()
		if !w.HasDeadline() || !now.Before(w.End()) {
			stopWork()
			return
		}
		if !said && w.End().After(limit) {
			logger.Info("Stop requested during an interruption whose window ends after --stop-grace: stopping now; the next agent resumes from the node",
				"windowEnd", w.End(), "stopGrace", a.cfg.StopGrace)
			stopWork()
			return
		}
		if !said {
			said = true
			logger.Info("Stop requested during an interruption: carrying out the plan until the window's end",
				"windowEnd", w.End(), "deadline", w.Deadline)
		}
		// Look again every second: a withdrawn notice ends the wait early.
		t := clk.NewTimer(min(w.End().Sub(now), time.Second))
		select {
		case <-t.C():
		case <-workDone:
			t.Stop()
			return
		}
	}
}

// nodeLoop polls the provider and reconciles the node on every poll and every node change.
func (a *Agent) nodeLoop(ctx context.Context) {
	fails := 0
	// Jitter the first tick so that a fleet started together does not poll in unison.
	timer := a.clock.NewTimer(time.Duration(rand.Int64N(int64(a.cfg.PollInterval))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.nodeChanged:
			a.reconcile(ctx)
		case <-timer.C():
			// A watching provider pushes its changes (see watch); the tick then only
			// re-evaluates time-based decisions (the maintenance lead, the window's end).
			if !a.watching {
				if a.pollOnce(ctx) {
					fails = 0
				} else {
					fails++
				}
			}
			a.reconcile(ctx)
			a.maybeApprove(ctx)
			timer.Reset(a.pollDelay(fails))
		}
	}
}

// watch runs a pushing provider's Watch until ctx ends, applying each update and waking the
// node loop at once, so that a notice reaches the node without waiting for a tick.
func (a *Agent) watch(ctx context.Context, w providers.Watcher) {
	err := w.Watch(ctx, func(notices []providers.Notice, err error) {
		a.applyNotices(ctx, notices, err)
		a.signalNode()
	})
	if err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "Watching the provider stopped", "provider", a.provider.Name())
	}
}

// pollDelay is the wait before the next poll: the poll interval, or after failures an
// exponential backoff with jitter, capped at twice the interval so that a notice posted once
// the endpoint recovers is still caught within two intervals.
func (a *Agent) pollDelay(fails int) time.Duration {
	d := a.cfg.PollInterval
	if fails == 0 {
		return d
	}
	backoff := d << min(fails, 4)
	if cap := 2 * d; backoff > cap {
		backoff = cap
	}
	// Full-range jitter between 80% and 100% keeps the worst case within the cap.
	return time.Duration(float64(backoff) * (0.8 + 0.2*rand.Float64()))
}

// pollOnce asks the provider for its notices and records them. It reports success.
func (a *Agent) pollOnce(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, max(2*a.cfg.PollInterval, 3*time.Second))
	defer cancel()
	notices, err := a.provider.Poll(pctx)
	return a.applyNotices(ctx, notices, err)
}

// applyNotices records what the provider reported (by a poll or a watch) and reports whether
// it was a success.
func (a *Agent) applyNotices(ctx context.Context, notices []providers.Notice, err error) bool {
	logger := klog.FromContext(ctx)
	name := a.provider.Name()
	if err != nil {
		a.metrics.PollsTotal.WithLabelValues(name, "error").Inc()
		if ctx.Err() == nil {
			logger.Error(err, "Polling the provider failed; keeping the last known notices", "provider", name)
		}
	} else {
		a.metrics.PollsTotal.WithLabelValues(name, "ok").Inc()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil && notices == nil {
		// A failed poll is not an answer: keep the previous state rather than withdraw it.
		// Before the first answer that state is what the node carries (see restoredNotices).
		return false
	}
	seen := map[string]providers.Notice{}
	for _, n := range notices {
		seen[n.ID] = n
		if _, known := a.noticeID[n.ID]; !known {
			a.metrics.NoticesTotal.WithLabelValues(n.Provider, string(n.Kind)).Inc()
			logger.Info("Notice received", "provider", n.Provider, "kind", n.Kind, "id", n.ID, "action", n.Action,
				"deadline", n.Deadline, "noticeTime", n.NoticeTime, "description", n.Description)
			typ := v1.EventTypeNormal
			if n.Interrupts() {
				typ = v1.EventTypeWarning
			}
			if n.Interrupts() && !n.Deadline.After(a.clock.Now()) {
				logger.Info("The notice's deadline has already passed: evicting every pod due at once, with the shortest grace",
					"provider", n.Provider, "id", n.ID, "deadline", n.Deadline)
			}
			text := describeNotice(n, a.clock.Now())
			a.recorder.Eventf(nodeRef(a.cfg.NodeName), typ, NoticeReason(n.Kind), "%s", text)
			a.notifier.Notify(notify.Message{Kind: notify.KindNotice, Node: a.cfg.NodeName, Provider: n.Provider,
				NoticeKind: string(n.Kind), NoticeID: n.ID, Action: n.Action, Deadline: n.Deadline, NoticeTime: n.NoticeTime,
				Text: fmt.Sprintf("Node %s: %s", a.cfg.NodeName, text)})
		}
	}
	for id, n := range a.noticeID {
		if _, ok := seen[id]; !ok {
			logger.Info("Notice withdrawn", "provider", n.Provider, "kind", n.Kind, "id", id)
			a.recorder.Eventf(nodeRef(a.cfg.NodeName), v1.EventTypeNormal, ReasonNoticeWithdrawn, "Withdrawn: %s", describeNotice(n, a.clock.Now()))
		}
	}
	a.noticeID = seen
	a.notices = notices
	a.polled = true
	return err == nil
}

// reconcile brings the node to what the notices ask for and re-plans the pods when the plan's
// inputs changed.
func (a *Agent) reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := a.clock.Now()
	node := a.cachedNode()
	a.mu.Lock()
	notices := a.notices
	if !a.polled {
		notices = a.restoredNotices(node)
	}
	intent := Intend(notices, now, a.cfg.MaintenanceLead, a.taints)
	intent.SoftTaints = append(intent.SoftTaints, a.wantedPressureTaints()...)
	for _, n := range intent.FarAhead {
		if !a.farLogged[n.ID] {
			a.farLogged[n.ID] = true
			logger.Info("Deadline further away than --maintenance-lead: keeping new pods off the node, evicting nothing yet",
				"provider", n.Provider, "kind", n.Kind, "id", n.ID, "deadline", n.Deadline, "interruptsAt", n.Deadline.Add(-a.cfg.MaintenanceLead))
		}
	}
	a.mu.Unlock()

	desire := NodeDesire{
		Intent:        intent,
		Taints:        a.taints,
		WriteDeadline: a.provider.Name() != none.Name,
		AddedAt:       a.addedAtFunc(now),
	}
	if node == nil {
		logger.Error(nil, "Node not found; waiting for it", "node", a.cfg.NodeName)
		return
	}
	// Plan on the node as it is about to be: an API outage delays the taint write but must not
	// delay the countdowns that the deadline sets.
	planned := ComputeNodeChange(node, desire).Taints
	done, err := a.writer.ensure(ctx, desire)
	if err != nil {
		logger.Error(err, "Updating the node failed; will retry", "node", a.cfg.NodeName)
	}
	a.recordTaintChanges(done, intent, now)
	a.pruneAddedAt(intent)
	for _, t := range []v1.Taint{a.taints.Interruption, a.taints.Rebalance, a.taints.Maintenance} {
		a.metrics.TaintActive.WithLabelValues(t.Key).Set(b2f(hasTaint(planned, t)))
	}
	if a.pressure != nil {
		for _, r := range pressure.Resources {
			a.metrics.TaintActive.WithLabelValues(pressure.TaintKey(r)).Set(b2f(hasTaint(planned, a.pressureTaint(r))))
		}
	}
	if intent.Interrupting() {
		a.metrics.ReclaimDeadline.Set(float64(intent.Deadline.Unix()))
	} else {
		a.metrics.ReclaimDeadline.Set(0)
	}

	view := planView{taints: a.noExecuteTaints(planned, now), window: Window{SafetyMargin: a.cfg.SafetyMargin}}
	if intent.Interrupting() {
		view.window.Deadline = intent.Deadline
	}
	a.mu.Lock()
	changed := !a.view.equal(view)
	a.view = view
	if !a.drain.window.Equal(view.window) {
		// A new notice, a changed deadline or a withdrawal: the pods' eviction state belongs
		// to the window it served.
		old := a.drain
		a.closeDrain(old)
		a.drain = newDrain(view.window, intent.Interruption)
		if old.window.HasDeadline() && view.window.HasDeadline() {
			// The same interruption with a new deadline: what was already sent stands (one
			// request per pod), the rest starts afresh.
			a.drain.carryDone(old)
		}
		changed = true
	} else {
		// The same window, perhaps under the notice's real ID once the provider answers
		// after a restart: approvals name the provider's own notice.
		a.drain.notice = intent.Interruption
	}
	a.mu.Unlock()
	if changed {
		logger.V(2).Info("Re-planning every pod", "deadline", view.window.Deadline, "noExecuteTaints", len(view.taints))
		a.enqueueAll()
	}
	a.summarizeWindow(ctx, now)
}

// restoredNotices is what the node says about the notices before the provider has answered
// once (an agent restarted while the metadata service fails): reprieve's own interruption taint
// with the deadline annotation it wrote, and its own soft taints. Reading a failed first poll as
// "no notice" would remove them and, when the service answers again, taint anew with a new
// timeAdded, restarting every tolerationSeconds countdown. Nothing is restored with
// --provider none, whose input the annotation already is.
func (a *Agent) restoredNotices(node *v1.Node) []providers.Notice {
	if node == nil || a.provider.Name() == none.Name {
		return nil
	}
	own := setOf(parseOwned(node).Taints)
	name := a.provider.Name()
	var out []providers.Notice
	if own[taintID(a.taints.Interruption)] && hasTaint(node.Spec.Taints, a.taints.Interruption) {
		if v, ok := node.Annotations[AnnotationReclaimDeadline]; ok {
			if d, err := time.Parse(time.RFC3339, v); err == nil {
				out = append(out, providers.Notice{Provider: name, Kind: providers.KindSpotInterruption, ID: restoredID, Deadline: d,
					Description: "restored from the node's " + AnnotationReclaimDeadline + " annotation"})
			}
		}
	}
	if own[taintID(a.taints.Rebalance)] && hasTaint(node.Spec.Taints, a.taints.Rebalance) {
		out = append(out, providers.Notice{Provider: name, Kind: providers.KindRebalanceRecommendation, ID: restoredID + "-rebalance"})
	}
	if own[taintID(a.taints.Maintenance)] && hasTaint(node.Spec.Taints, a.taints.Maintenance) {
		out = append(out, providers.Notice{Provider: name, Kind: providers.KindScheduledMaintenance, ID: restoredID + "-maintenance"})
	}
	return out
}

// restoredID is the ID of a notice read back from the node (restoredNotices).
const restoredID = "restored-from-node"

// recordTaintChanges emits an event for every taint reprieve added or removed, and measures how
// long the interruption taint took from the notice.
func (a *Agent) recordTaintChanges(ch NodeChange, intent Intent, now time.Time) {
	verb := ""
	if a.cfg.DryRun {
		verb = "Dry run: would have "
	}
	for _, t := range ch.Added {
		a.recorder.Eventf(nodeRef(a.cfg.NodeName), v1.EventTypeNormal, ReasonTaintApplied, "%sadded taint %s", verb, taintString(t))
		if t.Key == a.taints.Interruption.Key && t.Effect == a.taints.Interruption.Effect && intent.Interruption != nil && !intent.Interruption.NoticeTime.IsZero() {
			a.metrics.NoticeToTaint.Observe(max(0, now.Sub(intent.Interruption.NoticeTime).Seconds()))
		}
	}
	for _, t := range ch.Removed {
		a.recorder.Eventf(nodeRef(a.cfg.NodeName), v1.EventTypeNormal, ReasonTaintRemoved, "%sremoved taint %s", verb, taintString(t))
	}
}

// addedAtFunc returns the timeAdded for each taint reprieve adds: the moment it first wanted it,
// truncated to whole seconds because that is what the API stores, so that the plan made before
// the write equals the plan made from the written taint (and after a restart).
func (a *Agent) addedAtFunc(now time.Time) func(string) time.Time {
	return func(id string) time.Time {
		a.mu.Lock()
		defer a.mu.Unlock()
		t, ok := a.addedAt[id]
		if !ok {
			t = now.Truncate(time.Second)
			a.addedAt[id] = t
		}
		return t
	}
}

func (a *Agent) pruneAddedAt(intent Intent) {
	want := map[string]bool{}
	if intent.Interrupting() {
		want[taintID(a.taints.Interruption)] = true
	}
	for _, t := range intent.SoftTaints {
		want[taintID(t)] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.addedAt {
		if !want[id] {
			delete(a.addedAt, id)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// noExecuteTaints returns the NoExecute taints with TimeAdded set to the countdown's anchor:
// the earlier of the taint's timeAdded and when this agent first saw it. A taint written without
// one (kubectl never sets it) is anchored on when it was first seen, as upstream anchors every
// taint; a timeAdded in the future (a writer with a fast clock) must not delay a pod that
// upstream would evict at once.
func (a *Agent) noExecuteTaints(taints []v1.Taint, now time.Time) []v1.Taint {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []v1.Taint
	seen := map[string]bool{}
	for _, t := range taints {
		if t.Effect != v1.TaintEffectNoExecute {
			continue
		}
		id := taintID(t) + "=" + t.Value
		seen[id] = true
		at, ok := a.seenAt[id]
		if !ok {
			at = now.Truncate(time.Second)
			a.seenAt[id] = at
		}
		if t.TimeAdded == nil || at.Before(t.TimeAdded.Time) {
			t.TimeAdded = &metav1.Time{Time: at}
		}
		out = append(out, t)
	}
	for id := range a.seenAt {
		if !seen[id] {
			delete(a.seenAt, id)
		}
	}
	return out
}

func (a *Agent) cachedNode() *v1.Node {
	n, err := a.nodeLister.Get(a.cfg.NodeName)
	if err != nil {
		return nil
	}
	return n
}

// deadlineAnnotation is the none provider's input.
func (a *Agent) deadlineAnnotation() (string, bool) {
	n := a.cachedNode()
	if n == nil {
		return "", false
	}
	v, ok := n.Annotations[AnnotationReclaimDeadline]
	return v, ok
}

func (a *Agent) signalNode() {
	select {
	case a.nodeChanged <- struct{}{}:
	default:
	}
}

func (a *Agent) enqueuePod(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		a.queue.Add(key)
	}
}

func (a *Agent) enqueueAll() {
	pods, err := a.podLister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		a.enqueuePod(p)
	}
}

// Ready reports whether the caches have synced and the provider has been asked once.
func (a *Agent) Ready() bool { return a.notReady() == "" }

// notReady says why the agent is not ready ("" when it is): its caches and first poll, or the
// provider itself, such as Azure's first Scheduled Events call, which may take two minutes while
// the platform enables the service (providers.Readiness).
func (a *Agent) notReady() string {
	if !a.ready.Load() {
		return "caches syncing or provider not yet polled"
	}
	if r, ok := a.provider.(providers.Readiness); ok {
		if err := r.Ready(); err != nil {
			return err.Error()
		}
	}
	return a.refusals.notReady()
}

func (a *Agent) metricsServer() *http.Server {
	addr := a.cfg.MetricsBindAddress
	if addr == "" || addr == "0" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := a.notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return newMetricsServer(addr, mux)
}
