// Package agent is reprieve's node agent: it turns a cloud's notices into taints on its own node
// and evicts the node's pods at the time upstream Kubernetes semantics give them, clamped so that
// every evicted pod has finished terminating before the machine is reclaimed.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	k8srecord "k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/informer"
	"github.com/reprieve-dev/reprieve/agent/interrupt"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/podnotice"
	"github.com/reprieve-dev/reprieve/agent/preflight"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/agent/serve"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/agent/whatif"
	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/none"
)

// Version is the build's version, set by main from its ldflags.
var Version = "dev"

// Deps are the agent's collaborators, injected so that tests can replace each one.
type Deps struct {
	Client kube.Interface
	// Provider reports the cloud's notices. Nil with --provider none: the agent then reads the
	// deadline annotation of its own node.
	Provider providers.Provider
	Clock    clock.WithTickerAndDelayedExecution
	// Registerer and Gatherer are the agent's private metrics registry.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Recorder records Kubernetes Events; nil starts client-go's broadcaster in Run.
	Recorder k8srecord.EventRecorder
	// PressureSource reads the pressure signals; nil builds the one --pressure-source names.
	PressureSource kubelet.Source
	// Evict sends one eviction; nil posts it without client-go's retries.
	Evict func(context.Context, *policyv1.Eviction) error
}

// Agent wires the units together: the informers of its one node and that node's pods, the
// node writer (record), the eviction executor (evict), the interruption loop (interrupt), the
// pressure loop (pressure), the pods' early warning, the metrics server and readiness. It holds
// no state of its own beyond the wiring: each unit owns its state (docs/design.md).
type Agent struct {
	cfg      config.Config
	client   kube.Interface
	provider providers.Provider
	clock    clock.WithTicker
	metrics  *metrics.Metrics
	gatherer prometheus.Gatherer
	taints   plan.TaintSet

	// nodeInformer and podInformer watch this node and its pods only, built from the core
	// client alone (informers.SharedInformerFactory would link an informer and a lister for
	// every API group: see informer.New).
	nodeInformer, podInformer cache.SharedIndexInformer
	nodeLister                corelisters.NodeLister
	podLister                 corelisters.PodLister
	recorder                  k8srecord.EventRecorder
	broadcaster               k8srecord.EventBroadcaster // nil when Deps gave the recorder
	delivery                  *events.Delivery           // counts the broadcaster's events, for the stop
	notifier                  *notify.Notifier           // nil when webhooks are off
	podNotice                 *podnotice.Notifier        // the pods' early warning; nil when it and the notice endpoint are off
	ready                     atomic.Bool
	// onReady, when set (tests), runs as the agent turns ready.
	onReady func()

	refusals *record.Refusals
	// evictions checks the eviction path (RBAC, policies, the eviction guard) before an
	// interruption needs it; /readyz's detail says what it found.
	evictions *preflight.Check
	writer    *record.Writer
	exec      *evict.Executor
	intr      *interrupt.Loop
	// pressure is the local-pressure loop; nil with --pressure-source off.
	pressure *pressure.Loop
	// pressureSource is the pressure loop's source: Deps.PressureSource, or the one
	// --pressure-source names, which startPressure chooses once the node is known.
	pressureSource *sourceSlot
	// kubelet is the process's one read of the kubelet's configuration, taken in New.
	kubelet kubelet.ConfigRead
}

// sourceSlot is the pressure loop's source, filled before the loop's first reading: the loop is
// built once, in New, while the Summary API's address may need the node (startPressure).
type sourceSlot struct{ kubelet.Source }

// New builds an agent from a validated configuration.
func New(cfg config.Config, deps Deps) (*Agent, error) {
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
	a := &Agent{
		cfg:            cfg,
		client:         deps.Client,
		provider:       deps.Provider,
		clock:          deps.Clock,
		gatherer:       deps.Gatherer,
		taints:         cfg.TaintSet(),
		recorder:       deps.Recorder,
		pressureSource: &sourceSlot{Source: deps.PressureSource},
		kubelet:        kubelet.Find(cfg.KubeletLookup()),
	}
	if a.recorder == nil {
		a.broadcaster = events.NewBroadcaster(context.Background())
		a.delivery = &events.Delivery{}
		a.recorder = a.delivery.Recorder(events.Recorder(a.broadcaster, cfg.NodeName))
	}
	if a.provider == nil {
		a.provider = none.New(a.deadlineAnnotation)
	}
	if a.metrics, err = metrics.New(deps.Registerer, a.provider.Name()); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	if err := deps.Registerer.Register(newSightCollector(a)); err != nil {
		return nil, fmt.Errorf("registering the readiness metrics: %w", err)
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
	a.nodeInformer, a.podInformer = informer.Node(deps.Client, cfg.NodeName), informer.Pods(deps.Client, cfg.NodeName)
	a.nodeLister = corelisters.NewNodeLister(a.nodeInformer.GetIndexer())
	a.podLister = corelisters.NewPodLister(a.podInformer.GetIndexer())
	a.podNotice = podnotice.New(cfg, deps.Client, a.podLister, deps.Clock)
	if a.podNotice != nil {
		a.podNotice.Wrote = func(result string) { a.metrics.PodWarningWrites.WithLabelValues(result).Inc() }
	}

	a.refusals = record.NewRefusals(cfg.NodeWriteRefusals, a.metrics)
	a.evictions = preflight.New(a.client, a.clock, cfg.PodName, cfg.PodNamespace, a.ownPodUID, a.metrics.EvictionCheck)
	execOpts := evict.Options{Client: deps.Client, Pods: a.podLister, Clock: deps.Clock, Metrics: a.metrics, Recorder: a.recorder,
		Notifier: a.notifier, NodeName: cfg.NodeName, DryRun: cfg.DryRun, Filter: cfg.PodFilter(),
		ComparisonOperators: cfg.TolerationComparisonOperators, SafetyMargin: cfg.SafetyMargin, InterruptionTaint: a.taints.Evicting(),
		Evict: deps.Evict, MaxInFlight: cfg.EvictionWorkers, PodVolumes: volumes.NewReader(deps.Client)}
	if a.podNotice != nil {
		execOpts.Warner = a.podNotice
	}
	a.exec = evict.New(execOpts)
	if a.podNotice != nil {
		a.podNotice.Turn = a.exec.Background
	}
	// The writer is a sink (record.Writer): it reads the node from the lister, counts its own
	// refusals and says its own events; the interruption loop hands it the executor's drained
	// state in its wish, and selects on its PressureChanged.
	a.writer = record.NewWriter(record.WriterOptions{Client: deps.Client, NodeName: cfg.NodeName, DryRun: cfg.DryRun,
		Taints: a.taints, Clock: deps.Clock, Nodes: a.nodeLister, Refusals: a.refusals, Recorder: a.recorder, Metrics: a.metrics,
		NodeConditions: cfg.NodeConditions, LifecycleConditions: cfg.LifecycleConditions})
	intrOpts := interrupt.Options{NodeName: cfg.NodeName, Provider: a.provider, Clock: deps.Clock, Metrics: a.metrics,
		Recorder: a.recorder, Notifier: a.notifier, Taints: a.taints, MaintenanceLead: cfg.MaintenanceLead,
		SafetyMargin: cfg.SafetyMargin, PollInterval: cfg.PollInterval, DryRun: cfg.DryRun, ApproveEvents: cfg.ApproveEvents,
		ShutdownCut: shutdownCut(a.kubelet), VolumeRelease: volumeRelease(cfg, a.kubelet), Node: a.cachedNode, Writer: a.writer, Executor: a.exec}
	if cfg.PressureSource != config.PressureSourceOff {
		for _, r := range pressure.Resources {
			intrOpts.PressureTaints = append(intrOpts.PressureTaints, pressureTaint(cfg, r))
		}
	}
	a.intr = interrupt.New(intrOpts)
	// What was read of the kubelet's configuration is said once, pressure or not: shutdownCut
	// and the volume release use it.
	reportKubeletConfig(a.metrics, a.kubelet)
	if err := a.newPressure(); err != nil {
		return nil, err
	}
	return a, nil
}

// volumeRelease is VolumeReleaseOf's figure, logged once with where it comes from.
func volumeRelease(cfg config.Config, kr kubelet.ConfigRead) time.Duration {
	d, from := volumes.ReleaseOf(cfg, kr)
	klog.Background().Info("Pods with a volume that needs attaching are planned to be gone before the deadline by", "volumeRelease", d, "from", from)
	return d
}

// shutdownCut is how long the kubelet's graceful node shutdown gives the ordinary pods, from the
// kubelet's configuration (kr: the read the pressure loop shares)
// (shutdownGracePeriod - shutdownGracePeriodCriticalPods); zero when it is off, unknown (no
// file found: reportKubeletConfig says it) or unreadable (the plan then ends at the deadline alone).
func shutdownCut(kr kubelet.ConfigRead) time.Duration {
	if !kr.Known() {
		return 0
	}
	return kr.Config.ShutdownGracePeriod - kr.Config.ShutdownGracePeriodCriticalPods
}

// pressureTaint is the taint the pressure loop puts on the node for r.
func pressureTaint(cfg config.Config, r pressure.Resource) v1.Taint {
	return v1.Taint{Key: pressure.TaintKey(r), Value: "true", Effect: v1.TaintEffect(cfg.PressureTaintEffect)}
}

// newPressure builds the pressure loop from the thresholds, once; none with --pressure-source
// off. Its source is chosen in startPressure (the Summary API's address may need the node) and
// handed to the loop through its slot.
func (a *Agent) newPressure() error {
	if a.cfg.PressureSource == config.PressureSourceOff {
		return nil
	}
	thresholds, kc, kcErr, err := PressureThresholds(a.cfg, a.kubelet)
	if err != nil {
		return err
	}
	a.pressure = pressure.NewLoop(pressure.LoopOptions{NodeName: a.cfg.NodeName, Source: a.pressureSource, SourceName: a.cfg.PressureSource,
		Thresholds: thresholds, KubeletConfig: kc, ConfigErr: kcErr, Interval: a.cfg.PressureInterval,
		TransitionPeriod: a.cfg.PressureTransitionPeriod, TrendWindow: a.cfg.PressureTrendWindow, TaintEffect: a.cfg.PressureTaintEffect,
		SafetyMargin: a.cfg.SafetyMargin, PodNamespace: a.cfg.PodNamespace, PodName: a.cfg.PodName, DryRun: a.cfg.DryRun,
		Clock: a.clock, Metrics: a.metrics, Recorder: a.recorder, Pods: a.podLister, Node: a.cachedNode, Executor: a.exec, Writer: a.writer})
	return nil
}

// startPressure resolves the pressure source where it needs the node (the Summary API's
// address), then starts the pressure loop (its first reading, the taints it finds).
func (a *Agent) startPressure(ctx context.Context) error {
	if a.pressureSource.Source == nil {
		src, from, err := NewPressureSource(a.cfg, a.cachedNode())
		if err != nil {
			return err
		}
		a.pressureSource.Source = src
		klog.FromContext(ctx).Info("Reading pressure signals", "source", a.cfg.PressureSource, "from", from)
	}
	return a.pressure.Start(ctx)
}

// Run runs every loop of the agent until ctx ends. It returns nil on a clean stop. When ctx
// ends during an interruption (SIGTERM while the node drains), the agent keeps carrying out the
// plan until the window's end (or until the kubelet's SIGKILL at the end of its pod's grace),
// summarizes the window, then delivers the queued webhooks and returns.
func (a *Agent) Run(ctx context.Context) error {
	parent := ctx
	ctx, stopWork := context.WithCancel(context.WithoutCancel(parent))
	defer stopWork()
	workDone := make(chan struct{})
	defer close(workDone)
	go a.lingerOnStop(parent, a.clock, stopWork, workDone)
	logger := klog.FromContext(ctx)
	logger.Info("Starting reprieve", "version", Version, "node", a.cfg.NodeName, "provider", a.provider.Name(),
		"interruptionTaint", evict.TaintString(a.taints.Interruption), "interruptionEviction", a.cfg.InterruptionEviction,
		"safetyMargin", a.cfg.SafetyMargin, "dryRun", a.cfg.DryRun)
	// The metadata services are link-local by default; an override sends the agent elsewhere
	// for its notices, so it is said at start.
	def := config.DefaultConfig()
	for _, ep := range []struct{ flag, value, def string }{
		{"--aws-imds-endpoint", a.cfg.AWSIMDSEndpoint, def.AWSIMDSEndpoint},
		{"--gcp-metadata-endpoint", a.cfg.GCPMetadataEndpoint, def.GCPMetadataEndpoint},
		{"--azure-imds-endpoint", a.cfg.AzureIMDSEndpoint, def.AzureIMDSEndpoint},
	} {
		if ep.value != ep.def {
			logger.Info("Metadata endpoint overridden by flag", "flag", ep.flag, "endpoint", ep.value, "default", ep.def)
		}
	}

	nodeChanged := func() { a.intr.Poke(); a.writer.Poke() }
	if _, err := a.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { nodeChanged() },
		UpdateFunc: func(any, any) { nodeChanged() },
		DeleteFunc: func(any) { nodeChanged() },
	}); err != nil {
		return fmt.Errorf("watching node: %w", err)
	}
	if _, err := a.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.exec.Enqueue,
		UpdateFunc: func(_, obj any) { a.exec.Enqueue(obj) },
		DeleteFunc: a.exec.Enqueue,
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}

	g, ctx := errgroup.WithContext(ctx)
	if srv := a.metricsServer(); srv != nil {
		ln, err := net.Listen("tcp", a.cfg.MetricsBindAddress)
		if err != nil {
			return fmt.Errorf("listening on --metrics-bind-address %s: %w", a.cfg.MetricsBindAddress, err)
		}
		ln = serve.MetricsListener(ln)
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

	if a.broadcaster != nil {
		events.StartRecording(a.broadcaster, a.client, a.delivery)
		defer func() {
			// The events queued last (the window's summary at a SIGTERM, the missed
			// deadlines) are written before the broadcaster drops its queue.
			if !a.delivery.Wait(eventFlushTimeout) {
				logger.Info("Writing the queued events took too long; dropping the rest", "timeout", eventFlushTimeout)
			}
			a.broadcaster.Shutdown()
		}()
	}
	// Started and awaited as a SharedInformerFactory's Start and Shutdown do.
	var informers sync.WaitGroup
	defer informers.Wait()
	syncStart := a.clock.Now()
	for _, inf := range []cache.SharedIndexInformer{a.nodeInformer, a.podInformer} {
		informers.Go(func() { inf.RunWithContext(ctx) })
	}
	for _, inf := range []struct {
		name   string
		synced cache.InformerSynced
	}{{"node", a.nodeInformer.HasSynced}, {"pod", a.podInformer.HasSynced}} {
		if !cache.WaitForCacheSync(ctx.Done(), inf.synced) {
			_ = g.Wait()
			return fmt.Errorf("waiting for the %s cache to sync: %w", inf.name, ctx.Err())
		}
	}
	// The caches' first list is this process's first measure of the API server: the margin its
	// first evictions leave (a restart during a notice evicts within seconds), until their own
	// first answer (issue 50, case 7).
	synced := a.clock.Since(syncStart)
	// One answer's time, on the connection the caches opened: the sync's time counts the
	// connection's dial and TLS handshake too (through a 1.3 s proxy, 2.7 s for 1.3 s answers),
	// and the first clamped evictions left with a second more of margin than the answers then
	// took (issue 50, case 7, under make test's load). One GET of the node from the watch cache,
	// once per process; the sync's time when it fails or takes longer.
	seed := synced
	probeStart := a.clock.Now()
	if _, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{ResourceVersion: "0"}); err == nil {
		seed = min(seed, a.clock.Since(probeStart))
	}
	a.exec.Seed(seed)
	logger.V(2).Info("Caches synced", "took", synced, "oneAnswer", seed)

	if a.pressure == nil {
		// With pressure handling on, the pressure loop says it at its start; without it the
		// interruption plan still depends on the kubelet's graceful node shutdown.
		if kc := a.kubelet.Config; a.kubelet.Err == nil && !kc.Found {
			a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeWarning, events.ReasonKubeletConfigUnknown,
				"The kubelet's configuration was not found (tried %s): its graceful node shutdown is unknown, and the plan assumes none. "+
					"Fix: set --kubelet-config (chart value pressure.kubeletConfig) to the kubelet's --config file and mount it under --host-root",
				strings.Join(kc.Searched, ", "))
		}
	}
	// The executor's workers start first: a plan without them sends nothing (a pod due at T+5
	// went at T+6.5 in CI's make test, when the first call gave up and the workers started).
	g.Go(func() error { a.exec.Run(ctx, a.cfg.EvictionWorkers); return nil })
	// A node that carries an interruption record already (a restart during a notice) is planned
	// from it at once: the record keeps every source that has not answered, and a first call the
	// cloud holds open (Azure's first Scheduled Events call; PollOnce waits up to the larger of
	// two poll intervals and 3 s) must not hold the pods the record makes due (issue 52: a pod
	// due at the new process's start went 3.1 s late). A node without a record waits for the
	// answer: planning without it could withdraw a taint another process wrote.
	resumed := record.HasNotices(a.cachedNode())
	if resumed {
		g.Go(func() error { a.evictions.Run(ctx); return nil })
		a.intr.Reconcile(ctx)
	}
	// Ask the cloud once before planning anything else; whatever it says (or fails to say), the
	// interruption record the node carries keeps every source that has not answered.
	a.intr.PollOnce(ctx)
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
		g.Go(func() error { a.writer.WatchWrites(ctx, a.refusals, a.writeProbe); return nil })
	}
	if !resumed {
		g.Go(func() error { a.evictions.Run(ctx); return nil })
	}
	a.intr.Reconcile(ctx)
	// The notice endpoint listens before the agent says it is ready: a pod that polls it once
	// the agent is Ready must not be refused a connection.
	noticeLn, err := a.listenNotice()
	if err != nil {
		stopWork()
		_ = g.Wait()
		return err
	}
	a.ready.Store(true)
	if a.onReady != nil {
		a.onReady()
	}

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
	a.startPodNotice(ctx, g, noticeLn)
	g.Go(func() error { a.writer.Run(ctx); return nil })
	g.Go(func() error { a.intr.Run(ctx); return nil })
	start := a.clock.Now()
	g.Go(func() error { a.watchSight(ctx, start); return nil })
	if a.pressure != nil {
		g.Go(func() error { a.pressure.Run(ctx); return nil })
	}
	err = g.Wait()
	logger.Info("Stopped reprieve")
	return err
}

// listenNotice opens the notice endpoint's listener (--notice-bind-address), or returns nil
// when there is none to open.
func (a *Agent) listenNotice() (net.Listener, error) {
	if a.podNotice == nil || a.cfg.NoticeBindAddress == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.cfg.NoticeBindAddress)
	if err != nil {
		return nil, fmt.Errorf("listening on --notice-bind-address %s: %w", a.cfg.NoticeBindAddress, err)
	}
	return ln, nil
}

// startPodNotice starts the warning writer and the notice endpoint (on noticeLn, when not nil)
// under g, once the caches have synced, as far as --pod-notice and --notice-bind-address ask.
func (a *Agent) startPodNotice(ctx context.Context, g *errgroup.Group, noticeLn net.Listener) {
	if a.podNotice == nil {
		return
	}
	if _, err := a.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: a.podNotice.PodDeleted,
	}); err != nil {
		// Only a stopped informer refuses a handler: the agent is stopping. The warnings still
		// go out; only deleted pods stay in memory.
		klog.FromContext(ctx).Error(err, "Watching pod deletions for the pods' warnings failed")
	}
	if a.podNotice.Writes() {
		g.Go(func() error { a.podNotice.Run(ctx); return nil })
	}
	if noticeLn != nil {
		g.Go(func() error { return podnotice.Serve(ctx, noticeLn, a.podNotice, a.podLister, a.clock) })
	}
}

// ownPodUID is the agent's own pod's UID, from the node's pod cache (it runs on its node).
func (a *Agent) ownPodUID() (types.UID, error) {
	p, err := a.podLister.Pods(a.cfg.PodNamespace).Get(a.cfg.PodName)
	if err != nil {
		return "", err
	}
	return p.UID, nil
}

// writeProbe is the desire the write check dry-runs: what an interruption would write now.
func (a *Agent) writeProbe() record.NodeDesire {
	now := a.clock.Now()
	deadline := now.Add(2 * time.Minute).Truncate(time.Second)
	n := providers.Notice{Provider: a.provider.Name(), Source: "write-check", Kind: providers.KindSpotInterruption, ID: "write-check",
		NoticeTime: now, Deadline: deadline}
	rec := record.RecordOf([]providers.Notice{n})
	return record.NodeDesire{Intent: plan.Intent{Deadline: deadline, Interruption: &n}, Taints: a.taints,
		WriteDeadline: a.provider.Name() != none.Name, Record: &rec,
		AddedAt: func(string) time.Time { return now.Truncate(time.Second) }}
}

// eventFlushTimeout bounds the writing of the queued events when the agent stops.
const eventFlushTimeout = 5 * time.Second

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
		w := a.exec.View().Window
		now := clk.Now()
		if !w.HasDeadline() {
			stopWork()
			return
		}
		// Checked at every look, not once: a deadline that moves later after the signal (within
		// the lead) must not keep the agent past its own grace, where the kubelet's SIGKILL
		// would lose the queued webhooks.
		if w.End().After(limit) {
			logger.Info("Stop requested during an interruption whose window ends after --stop-grace: stopping now; the next agent resumes from the node",
				"windowEnd", w.End(), "stopGrace", a.cfg.StopGrace)
			stopWork()
			return
		}
		if !now.Before(w.End()) {
			// The window's summary (the InterruptionHandled event, the handled webhook, the
			// missed deadlines, the volumes released) is given before the work stops, whichever
			// loop gets there first. Its volume count waits for the releases the kubelet is due
			// to publish by the deadline, within --stop-grace (issue 50, case 6).
			sctx := context.WithoutCancel(parent)
			if a.exec.Summarize(sctx, now) || !now.Before(limit) {
				a.exec.SummarizeFinal(sctx, now)
				stopWork()
				return
			}
		}
		if !said {
			said = true
			logger.Info("Stop requested during an interruption: carrying out the plan until the window's end",
				"windowEnd", w.End(), "deadline", w.Deadline)
		}
		// Look again every second: a withdrawn notice ends the wait early; past the window's
		// end, a volume's release ends it.
		next := w.End()
		if !now.Before(next) {
			next = w.Deadline
			if limit.Before(next) {
				next = limit
			}
		}
		t := clk.NewTimer(max(min(next.Sub(now), time.Second), time.Millisecond))
		select {
		case <-t.C():
		case <-workDone:
			t.Stop()
			return
		}
	}
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
	v, ok := n.Annotations[record.AnnotationReclaimDeadline]
	return v, ok
}

// Ready reports whether the caches have synced and every metadata source has answered within
// --metadata-stale-after (docs/operations.md, "Readiness").
func (a *Agent) Ready() bool { return a.notReady() == "" }

// notReady says why the agent is not ready ("" when it is): its caches and first poll; the
// provider itself, such as Azure's first Scheduled Events call, which may take two minutes while
// the platform enables the service (providers.Readiness); a metadata source without a good
// answer within --metadata-stale-after, or none since start (the agent cannot see); the node
// writes refused.
func (a *Agent) notReady() string {
	if !a.ready.Load() {
		return "caches syncing or provider not yet polled"
	}
	if r, ok := a.provider.(providers.Readiness); ok {
		if err := r.Ready(); err != nil {
			return err.Error()
		}
	}
	if stale := a.blind(a.clock.Now()); len(stale) > 0 {
		return fmt.Sprintf("cannot see the cloud's notices: no good answer within --metadata-stale-after %s from %s",
			a.cfg.MetadataStaleAfter, strings.Join(stale, ", "))
	}
	return a.refusals.NotReady()
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
		// The mode of the interruption's evictions follows, and then what does not make the
		// agent not Ready but an operator must see (the eviction guard down), one "warning:"
		// line each.
		warn := ""
		if d := a.evictions.Detail(); d != "" {
			warn = "warning: " + d + "\n"
		}
		if why := a.notReady(); why != "" {
			http.Error(w, "not ready: "+why+"\n"+warn, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n" + whatif.EvictionSummary(a.cfg) + "\n" + warn))
	})
	return serve.NewMetricsServer(addr, mux)
}
