package pressure

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	corelisters "k8s.io/client-go/listers/core/v1"
	k8srecord "k8s.io/client-go/tools/record"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/record"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// ReasonKubeletConfigUnknown is events.ReasonKubeletConfigUnknown.
const ReasonKubeletConfigUnknown = events.ReasonKubeletConfigUnknown

// pressureBlockedBackoff is how long a pod whose pressure eviction a PodDisruptionBudget
// refused is passed over, doubling to pressureBlockedMax: the next pod in rank goes instead.
const (
	pressureBlockedBackoff = time.Second
	pressureBlockedMax     = 30 * time.Second
)

// LoopOptions configures a Loop.
type LoopOptions struct {
	NodeName string
	// Source reads the signals; SourceName is the --pressure-source it came from.
	Source     kubelet.Source
	SourceName string
	// Thresholds are reprieve's and the kubelet's, from the flags and the kubelet's config
	// (KubeletConfig); ConfigErr is why that config could not be read, which turns the pressure
	// handling off. A config not found (KubeletConfig.Found false) leaves it on with the
	// kubelet's defaults, and Start records a KubeletConfigUnknown event.
	Thresholds       Thresholds
	KubeletConfig    kubelet.Config
	ConfigErr        error
	Interval         time.Duration
	TransitionPeriod time.Duration
	TrendWindow      time.Duration
	TaintEffect      string
	SafetyMargin     time.Duration
	// CutEarly evicts a pod whose whole grace no longer fits as soon as it is due, with what
	// fits (Input.CutEarly): the timeliness-first rule, measured beside the default in
	// docs/benchmarks.md, not a flag.
	CutEarly bool
	// AnyFall drops the rule that a fall must have held a share of the time it is extrapolated
	// over (Input.AnyFall): measured beside the default in docs/benchmarks.md, not a flag.
	AnyFall bool
	// PodNamespace and PodName are the agent's own pod, never evicted.
	PodNamespace, PodName string
	DryRun                bool
	Clock                 clock.WithTicker
	Metrics               *metrics.Metrics
	Recorder              k8srecord.EventRecorder
	Pods                  corelisters.PodLister
	// Node returns the informer's copy of the node, nil when not known.
	Node     func() *v1.Node
	Executor *evict.Executor
	Writer   *record.Writer
}

// Loop is the pressure loop. Its state belongs to its own goroutine (Run; Start and Observe
// before it); it hands the taints it wants to the node writer and its evictions to the executor.
type Loop struct {
	o       LoopOptions
	tracker *Tracker
	soft    *SoftTracker
	trend   *Trend
	// pace is how the readings and each signal's time to the hard threshold went lately: how
	// far ahead a pod is due (Input.Lead).
	pace *Pace
	// inFlight are the pods evicted for pressure that are still on the node.
	inFlight map[types.UID]inFlight
	// blocked are pods a PodDisruptionBudget protected, with when to try again.
	blocked map[types.UID]blockedPod
	// retry are pods whose pressure eviction failed otherwise (Candidate.Retry).
	retry map[types.UID]bool
	// awaiting are, per signal, the pods a decided reading of its current fall held for the
	// last reading that leaves them MinCutGrace (Decision.Await, Candidate.Awaited), until the
	// fall or the pressure ends.
	awaiting map[kubelet.Signal]map[types.UID]bool
	lastErr  string
	// warned remembers the signals already warned about (a threshold not above the kubelet's).
	warned map[kubelet.Signal]bool
	// taints are the pressure taints wanted on the node.
	taints map[Resource]bool
	// estimates are each signal's trend at this reading (Observe), and fallingFor how many
	// readings in a row it has been falling.
	estimates  map[kubelet.Signal]Estimate
	fallingFor map[kubelet.Signal]int
	// fallSince is when each signal's slope last turned below zero (Input.Falling).
	fallSince map[kubelet.Signal]time.Time
	// pods are each pod's usage over the trend window, by pod and kind, from which the pods are
	// ranked where the kubelet would rank them (project).
	pods map[podUsageKey]*series
	// rootfsOnImageFs says the last reading's writable layers are on imagefs.
	rootfsOnImageFs bool
}

// NewLoop returns the pressure loop; Start takes its first reading.
func NewLoop(o LoopOptions) *Loop {
	return &Loop{o: o, tracker: NewTracker(o.TransitionPeriod), soft: NewSoftTracker(), trend: NewTrend(o.TrendWindow),
		pace: NewPace(o.TrendWindow), inFlight: map[types.UID]inFlight{}, blocked: map[types.UID]blockedPod{}, retry: map[types.UID]bool{}, awaiting: map[kubelet.Signal]map[types.UID]bool{}, warned: map[kubelet.Signal]bool{},
		taints: map[Resource]bool{}, estimates: map[kubelet.Signal]Estimate{}, fallingFor: map[kubelet.Signal]int{}, fallSince: map[kubelet.Signal]time.Time{}, pods: map[podUsageKey]*series{}}
}

type inFlight struct {
	key      string
	resource Resource
	// signal is the one it was evicted for, and usage what it uses of it.
	signal kubelet.Signal
	usage  int64
}

type blockedPod struct {
	until    time.Time
	attempts int
}

// Start restores the pressure state that reprieve's own taints on the node record (a restarted
// agent keeps a taint until the transition period shows the pressure is over), and takes a
// first reading. It fails when the kubelet's config could not be read: the pressure handling
// is then off, and the interruption handling goes on without it. When the config was not found
// it goes on with the kubelet's defaults, and says so in a Warning event on the node.
func (lp *Loop) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if lp.o.ConfigErr != nil {
		lp.o.Recorder.Eventf(events.NodeRef(lp.o.NodeName), v1.EventTypeWarning, events.ReasonPressureDisabled,
			"Local pressure handling is off: %v", lp.o.ConfigErr)
		return lp.o.ConfigErr
	}
	thresholds := make([]string, 0, len(lp.o.Thresholds.Explicit))
	for _, t := range lp.o.Thresholds.Explicit {
		thresholds = append(thresholds, t.String())
	}
	hard := make([]string, 0, len(lp.o.Thresholds.Hard))
	for _, t := range lp.o.Thresholds.Hard {
		hard = append(hard, t.String())
	}
	if kc := lp.o.KubeletConfig; !kc.Found {
		lp.o.Recorder.Eventf(events.NodeRef(lp.o.NodeName), v1.EventTypeWarning, ReasonKubeletConfigUnknown,
			"The kubelet's configuration was not found (tried %s): its eviction thresholds and graceful node shutdown are unknown. "+
				"reprieve assumes the kubelet's defaults (evictionHard %s) and no graceful node shutdown. "+
				"Fix: set --kubelet-config (chart value pressure.kubeletConfig) to the kubelet's --config file and mount it under --host-root",
			strings.Join(kc.Searched, ", "), strings.Join(hard, ","))
	}
	logger.Info("Watching local pressure", "source", lp.o.SourceName, "kubeletConfig", lp.o.KubeletConfig.Path,
		"kubeletConfigFound", lp.o.KubeletConfig.Found, "kubeletHard", hard, "thresholds", thresholds,
		"headroom", lp.o.Thresholds.Headroom, "transitionPeriod", lp.o.TransitionPeriod)
	if node := lp.o.Node(); node != nil {
		for _, r := range Resources {
			if record.Owns(node, lp.Taint(r)) {
				lp.tracker.Restore(r, lp.o.Clock.Now())
				lp.setTaint(r, true)
				logger.Info("Pressure taint found on the node; keeping it until the pressure is seen to be over", "resource", r)
			}
		}
	}
	lp.Observe(ctx)
	return nil
}

// Run reads the signals every --pressure-interval until ctx ends.
func (lp *Loop) Run(ctx context.Context) {
	timer := lp.o.Clock.NewTimer(time.Duration(rand.Int64N(int64(lp.o.Interval))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
			lp.Observe(ctx)
			timer.Reset(lp.o.Interval)
		}
	}
}

// Taint is the taint reprieve puts on the node while r is under pressure.
func (lp *Loop) Taint(r Resource) v1.Taint {
	return v1.Taint{Key: TaintKey(r), Value: "true", Effect: v1.TaintEffect(lp.o.TaintEffect)}
}

// setTaint records whether r's taint is wanted and hands the wanted taints to the node writer
// when that changed.
func (lp *Loop) setTaint(r Resource, on bool) {
	if lp.taints[r] == on {
		return
	}
	lp.taints[r] = on
	var want []v1.Taint
	for _, r := range Resources {
		if lp.taints[r] {
			want = append(want, lp.Taint(r))
		}
	}
	lp.o.Writer.SetPressure(want)
}

// Observe is one iteration of the pressure loop: read, update the levels, the trend
// and the taints, then evict what the predictive rule says must go now.
func (lp *Loop) Observe(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := lp.o.Clock.Now()
	rctx, cancel := context.WithTimeout(ctx, ReadTimeout(lp.o.Interval))
	sample, err := lp.o.Source.Read(rctx)
	cancel()
	if err != nil {
		lp.o.Metrics.PressureReadErrors.Inc()
		// Once per distinct error, so that a missing file does not fill the log every second.
		if msg := err.Error(); msg != lp.lastErr && ctx.Err() == nil {
			logger.Error(err, "Reading pressure signals failed; keeping the last state for what could not be read", "source", lp.o.SourceName)
			lp.lastErr = msg
		}
	} else {
		lp.lastErr = ""
	}
	levels := lp.o.Thresholds.Levels(sample.Node)
	prev := map[kubelet.Signal]Estimate{}
	for i := range levels {
		l := &levels[i]
		if l.At.IsZero() || l.At.After(now) {
			l.At = now
		}
		lp.trend.AddLevel(*l)
		prev[l.Signal] = lp.estimates[l.Signal]
		lp.estimates[l.Signal] = lp.trend.Estimate(l.Signal)
	}
	// The pods' own usage, before any time to the threshold: a fall their own sawtooth explains
	// is no fall (timeToHard).
	lp.observePods(now, levels, sample)
	for i := range levels {
		l := &levels[i]
		e := lp.estimates[l.Signal]
		// A steepening counts once the fall is established (minSamples readings): before, the
		// estimate comes down as the fit learns the new pace, which is no acceleration, and
		// counted as one it made pods due twice as far ahead for three readings.
		if e.Falling {
			lp.fallingFor[l.Signal]++
		} else {
			lp.fallingFor[l.Signal] = 0
		}
		if !e.OK || e.Slope >= 0 {
			delete(lp.fallSince, l.Signal)
		} else if _, ok := lp.fallSince[l.Signal]; !ok {
			lp.fallSince[l.Signal] = l.At
		}
		lp.pace.Add(now, l.Signal, lp.timeToHard(now, *l), e.SteeperThan(prev[l.Signal]) && lp.fallingFor[l.Signal] > minSamples)
		// A signal reprieve only taints for: the kubelet deletes images first, and a threshold at
		// its own is where it reports DiskPressure (Levels).
		if l.Threshold <= l.Hard && l.Hard > 0 && evictsFor(l.Signal, sample.DedicatedImageFs) && !lp.warned[l.Signal] {
			lp.warned[l.Signal] = true
			logger.Error(nil, "reprieve's pressure threshold is not above the kubelet's hard threshold: the kubelet will evict first",
				"signal", l.Signal, "threshold", l.Threshold, "kubeletHard", l.Hard)
		}
		s := string(l.Signal)
		lp.o.Metrics.PressureAvailable.WithLabelValues(s).Set(float64(l.Available))
		lp.o.Metrics.PressureThreshold.WithLabelValues(s, "reprieve").Set(float64(l.Threshold))
		lp.o.Metrics.PressureThreshold.WithLabelValues(s, "kubelet_hard").Set(float64(l.Hard))
	}
	for _, ch := range lp.tracker.Observe(now, levels) {
		lp.reportPressureChange(ctx, ch)
		lp.setTaint(ch.Resource, ch.Active)
	}
	for _, r := range Resources {
		lp.o.Metrics.PressureActive.WithLabelValues(string(r)).Set(b2f(lp.tracker.Active(r)))
	}
	lp.evictForPressure(ctx, now, levels, sample, lp.soft.Observe(now, levels))
}

func (lp *Loop) reportPressureChange(ctx context.Context, ch Change) {
	logger := klog.FromContext(ctx)
	if ch.Active {
		l := ch.Level
		logger.Info("Pressure detected", "resource", ch.Resource, "signal", l.Signal, "available", l.Available,
			"threshold", l.Threshold, "kubeletHard", l.Hard)
		lp.o.Recorder.Eventf(events.NodeRef(lp.o.NodeName), v1.EventTypeWarning, events.ReasonPressureDetected,
			"%s %s is below reprieve's threshold %s (the kubelet evicts at %s): tainting %s",
			l.Signal, FormatAmount(l.Signal, l.Available), FormatAmount(l.Signal, l.Threshold), FormatAmount(l.Signal, l.Hard), TaintKey(ch.Resource))
		return
	}
	logger.Info("Pressure cleared", "resource", ch.Resource, "transitionPeriod", lp.o.TransitionPeriod)
	lp.o.Recorder.Eventf(events.NodeRef(lp.o.NodeName), v1.EventTypeNormal, events.ReasonPressureCleared,
		"No %s pressure for %s: removing %s", ch.Resource, lp.o.TransitionPeriod, TaintKey(ch.Resource))
}

// FormatAmount writes a signal's amount in its unit: bytes in binary units, inodes and PIDs as
// counts.
func FormatAmount(s kubelet.Signal, v int64) string {
	switch s {
	case kubelet.MemoryAvailable, kubelet.NodeFsAvailable, kubelet.ImageFsAvailable:
		switch f := float64(v); {
		case v >= 1<<30 || v <= -1<<30:
			return strconv.FormatFloat(f/(1<<30), 'f', 2, 64) + "Gi"
		case v >= 1<<20 || v <= -1<<20:
			return strconv.FormatFloat(f/(1<<20), 'f', 0, 64) + "Mi"
		}
	}
	return strconv.FormatInt(v, 10)
}

// stuckAfter is how long past its deletionTimestamp a pod evicted for pressure still counts as
// in flight: one held longer (a finalizer) no longer blocks the next eviction, and what it
// was to free no longer counts.
const stuckAfter = 5 * time.Second

// evictsFor reports whether reprieve evicts pods for signal s. The kubelet answers disk
// pressure by deleting unused images and containers first, which reprieve cannot do: for
// imagefs, and for nodefs when the images share its filesystem, reprieve taints and leaves
// the rest to the kubelet's garbage collection.
func evictsFor(s kubelet.Signal, dedicatedImageFs bool) bool {
	switch s {
	case kubelet.ImageFsAvailable, kubelet.ImageFsInodesFree:
		return false
	case kubelet.NodeFsAvailable, kubelet.NodeFsInodesFree:
		return dedicatedImageFs
	}
	return true
}

// evictForPressure applies the predictive rule to every resource under pressure, and the
// kubelet's soft-threshold rule to every signal whose soft threshold has held for its grace
// period (softMet). It is the actuator: it keeps the loop's books (the pods in flight, blocked,
// retried and held), sets the metrics, and carries out what decideResource says for each resource.
func (lp *Loop) evictForPressure(ctx context.Context, now time.Time, levels []Level, sample kubelet.Sample, softMet []kubelet.Signal) {
	pods, err := lp.o.Pods.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods from the cache failed")
		return
	}
	present := map[types.UID]*v1.Pod{}
	for _, pod := range pods {
		present[pod.UID] = pod
	}
	for uid := range lp.inFlight {
		pod, ok := present[uid]
		switch {
		case !ok, pod.Status.Phase == v1.PodSucceeded, pod.Status.Phase == v1.PodFailed,
			pod.DeletionTimestamp != nil && now.After(pod.DeletionTimestamp.Add(stuckAfter)):
			delete(lp.inFlight, uid)
		}
	}
	for uid, b := range lp.blocked {
		if _, ok := present[uid]; !ok || now.Sub(b.until) > pressureBlockedMax {
			delete(lp.blocked, uid)
		}
	}
	for uid := range lp.retry {
		if _, ok := present[uid]; !ok {
			delete(lp.retry, uid)
		}
	}
	view := lp.o.Executor.View()
	for _, r := range Resources {
		var soft []kubelet.Signal
		for _, sig := range softMet {
			if ResourceOf(sig) == r && evictsFor(sig, sample.DedicatedImageFs) {
				soft = append(soft, sig)
			}
		}
		if !lp.tracker.Active(r) {
			for sig := range lp.awaiting {
				if ResourceOf(sig) == r {
					delete(lp.awaiting, sig) // held for a fall that is over
				}
			}
			lp.o.Metrics.PressureTimeToHard.WithLabelValues(string(r)).Set(math.Inf(1))
			if len(soft) == 0 {
				continue
			}
		}
		lvl, ttl, shown := lp.nearest(now, r, levels, sample.DedicatedImageFs)
		if lp.tracker.Active(r) {
			lp.o.Metrics.PressureTimeToHard.WithLabelValues(string(r)).Set(shown.Seconds())
		}
		if lvl.Signal == "" && len(soft) == 0 {
			continue // nothing read this time, or only signals the kubelet's image GC answers
		}
		// Decided afresh for each resource: what an earlier one evicted is in flight now.
		dec := lp.decideResource(now, r, lvl, ttl, levels, soft, lp.evictable(pods, now), sample)
		if in := dec.in; in != nil {
			if !in.Pending {
				lp.shortenInFlight(ctx, now, r, ttl, in.Lead(), present, view.Window)
			}
			if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
				// Why a reading under pressure acted or held: the decision's whole input.
				var first string
				if len(in.Ranked) > 0 {
					first = in.Ranked[0].Pod.Namespace + "/" + in.Ranked[0].Pod.Name
				}
				logger.Info("Pressure decision", "signal", lvl.Signal, "available", lvl.Available, "timeToHard", ttl,
					"lead", in.Lead(), "gap", in.Gap, "jump", in.Jump, "uncertain", in.Uncertain, "falling", in.Falling,
					"pending", in.Pending, "unexplained", in.Unexplained, "inFlight", in.InFlight, "first", first,
					"evict", len(dec.d.Evict), "held", len(dec.d.Await))
			}
			switch {
			case ttl == Never:
				delete(lp.awaiting, lvl.Signal) // the fall stopped: what was held for it is not
			case !in.Pending:
				// Held until the pressure or the fall ends, not only to the next reading: on the
				// real node a reading between the held one and the one past the window found the
				// fall's span restarted (the persistence rule held it there, holding nothing), and
				// the pod was left to the kubelet (TestTerminatingHogOnRealNode).
				if lp.awaiting[lvl.Signal] == nil {
					lp.awaiting[lvl.Signal] = map[types.UID]bool{}
				}
				for _, uid := range dec.d.Await {
					lp.awaiting[lvl.Signal][uid] = true
				}
				for uid := range lp.awaiting[lvl.Signal] {
					if _, ok := present[uid]; !ok {
						delete(lp.awaiting[lvl.Signal], uid)
					}
				}
			}
			for _, ev := range dec.d.Evict {
				lp.pressureEvict(ctx, now, r, lvl, ttl, in.Lead(), ev, view)
			}
			if len(dec.d.Evict) > 0 {
				continue
			}
		}
		for _, ev := range dec.soft {
			lp.pressureEvict(ctx, now, r, dec.softLevel, ttl, 0, ev, view)
		}
	}
}

// nearest is the signal of r nearest its hard threshold among those reprieve evicts for (lvl;
// none when nothing was read, or only signals the kubelet's image GC answers), its time to the
// hard threshold (ttl), and the least time to it of every signal of r (shown, the metric's).
func (lp *Loop) nearest(now time.Time, r Resource, levels []Level, dedicatedImageFs bool) (lvl Level, ttl, shown time.Duration) {
	ttl, shown = Never, Never
	for _, l := range levels {
		if ResourceOf(l.Signal) != r {
			continue
		}
		t := lp.timeToHard(now, l)
		shown = min(shown, t)
		if evictsFor(l.Signal, dedicatedImageFs) && t <= ttl {
			lvl, ttl = l, t
		}
	}
	return lvl, ttl, shown
}

// evictable are the pods a pressure eviction may choose among now: not reprieve's own or one
// Keep spares, not blocked by a budget, not in flight, not at their end already (the kubelet is
// killing them).
func (lp *Loop) evictable(pods []*v1.Pod, now time.Time) []*v1.Pod {
	var out []*v1.Pod
	for _, pod := range pods {
		if Keep(pod, lp.o.PodNamespace, lp.o.PodName) != "" {
			continue
		}
		if b, ok := lp.blocked[pod.UID]; ok && now.Before(b.until) {
			continue
		}
		if _, ok := lp.inFlight[pod.UID]; ok {
			continue
		}
		if pod.DeletionTimestamp != nil && !pod.DeletionTimestamp.After(now) {
			continue
		}
		out = append(out, pod)
	}
	return out
}

// pressureDecision is what one reading decides for one resource (decideResource), which
// evictForPressure carries out.
type pressureDecision struct {
	// in and d are the predictive rule's input and decision; in is nil when the rule did not
	// run (the resource is not under pressure, or none of its signals was read).
	in *Input
	d  Decision
	// soft are the soft threshold's evictions (one pod a pass, for the first signal whose soft
	// threshold has held), and softLevel that signal's reading; carried out only when the
	// predictive rule evicts nothing.
	soft      []Eviction
	softLevel Level
}

// decideResource is the decision of one reading for resource r, whose signal nearest its hard
// threshold is lvl, ttl away (nearest), among the evictable pods: the predictive rule (Decide)
// while r is under pressure, and the kubelet's soft thresholds (DecideSoft) for the signals soft
// whose soft threshold has held its grace period. It reads the loop's state (the estimates, the
// pods in flight, retried and held) and changes none of it: evictForPressure acts on its answer.
func (lp *Loop) decideResource(now time.Time, r Resource, lvl Level, ttl time.Duration, levels []Level, soft []kubelet.Signal,
	evictable []*v1.Pod, sample kubelet.Sample) pressureDecision {
	var out pressureDecision
	// A terminating pod (a rollout's, or an interruption's) is ranked with the others, as the
	// kubelet ranks its active pods; its grace is what it has left, which a DELETE can only
	// shorten.
	podGrace := func(p *v1.Pod) time.Duration {
		g := plan.PodGrace(p)
		if p.DeletionTimestamp != nil {
			g = min(g, p.DeletionTimestamp.Sub(now))
		}
		return g
	}
	usageFor := func(sig kubelet.Signal) map[types.UID]kubelet.PodUsage {
		if sample.PodsMemoryAndPIDsOnly && ResourceOf(sig) == Disk {
			return nil // the host source's per-pod figures have no disk usage
		}
		return sample.Pods
	}
	inFlightOf := func(sig kubelet.Signal) (n int, reclaiming int64) {
		for _, f := range lp.inFlight {
			if f.resource == r {
				n++
				if f.signal == sig {
					reclaiming += f.usage
				}
			}
		}
		return n, reclaiming
	}
	if lvl.Signal != "" && lp.tracker.Active(r) {
		in := Input{
			Level: lvl, Active: true, TimeToHard: ttl,
			Ranked:       lp.retrying(lvl.Signal, lp.project(lvl.Signal, Candidates(lvl.Signal, evictable, usageFor(lvl.Signal), podGrace), ttl)),
			SafetyMargin: lp.o.SafetyMargin, Allowance: plan.RequestAllowance, Interval: lp.o.Interval,
			Pending: lp.estimates[lvl.Signal].Pending, CutEarly: lp.o.CutEarly, AnyFall: lp.o.AnyFall,
		}
		// How long the pace the estimate extrapolates has held: the readings it was fitted
		// on, or, for the window's fit, as long as the slope has been below zero.
		if e := lp.estimates[lvl.Signal]; e.OK && e.Slope < 0 && ttl != Never {
			// The estimate's standard error: the fitted level's (about half the readings'
			// noise) and the slope's over the time to the threshold, at the slope's pace.
			in.Uncertain = time.Duration(math.Hypot(e.Noise/2, ttl.Seconds()*e.SE) / -e.Slope * float64(time.Second))
			in.Falling = e.Span
			if since, ok := lp.fallSince[lvl.Signal]; ok && e.WholeWindow {
				in.Falling = max(in.Falling, lvl.At.Sub(since))
			}
			in.Unexplained = lp.unexplained(lvl.Signal, e, usageFor(lvl.Signal) != nil)
		}
		in.Gap, in.Jump = lp.pace.Of(lvl.Signal, ttl)
		in.InFlight, in.Reclaiming = inFlightOf(lvl.Signal)
		out.in, out.d = &in, Decide(in)
	}
	// The kubelet's soft thresholds: once one has held for its grace period, it evicts the
	// first ranked pod for that signal with min(evictionMaxPodGracePeriod, the pod's grace),
	// one a pass (synchronize). reprieve does the same through the Eviction API, with the
	// grace also cut to what fits before the hard threshold.
	for _, sig := range soft {
		for _, x := range levels {
			if x.Signal == sig {
				out.softLevel = x
			}
		}
		n, _ := inFlightOf(sig)
		for _, ev := range DecideSoft(Candidates(sig, evictable, usageFor(sig), podGrace), n, lp.o.KubeletConfig.MaxPodGracePeriod) {
			if ttl != Never {
				ev.Grace = max(min(ev.Grace, (ttl-lp.o.SafetyMargin-plan.RequestAllowance).Truncate(time.Second)), MinGrace)
			}
			out.soft = append(out.soft, ev)
		}
		break // one pod a pass
	}
	return out
}

// retrying marks the candidates whose eviction failed at an earlier reading, and those that
// a decided reading of sig's current fall held for the last reading that leaves them
// MinCutGrace.
func (lp *Loop) retrying(sig kubelet.Signal, cs []Candidate) []Candidate {
	for i := range cs {
		cs[i].Retry = lp.retry[cs[i].Pod.UID]
		cs[i].Awaited = lp.awaiting[sig][cs[i].Pod.UID]
	}
	return cs
}

// timeToHard is the estimate of when l's signal reaches the kubelet's hard threshold, from its
// trend, at now (Observe's estimate of this reading): Never when it is not falling beyond the
// noise, or falls within a sawtooth, above its lowest recent trough (Estimate). What the kubelet
// reclaims first counts as available (Level.Effective).
func (lp *Loop) timeToHard(now time.Time, l Level) time.Duration {
	e := lp.estimates[l.Signal]
	a := l.Effective()
	if e.Sawtooth && float64(a) > e.Floor-e.Tolerance && a > l.Hard {
		return Never
	}
	if e.Falling && ResourceOf(l.Signal) == Memory && lp.podsSawtooth(l, e) {
		return Never
	}
	if e.OK && a > l.Hard {
		// From where the fit puts the signal, not the reading alone: the reading's noise over a
		// slow fall is seconds of the estimate (±10 MiB at 10 MiB/s: ±1 s).
		a = min(a+int64(3*e.Noise), max(int64(e.Level), l.Hard))
	}
	t := TimeTo(a, l.Hard, e.Slope, e.OK && e.Falling)
	if t != Never {
		// The estimate runs from when the source measured, not from now.
		t = max(t-now.Sub(l.At), 0)
	}
	return t
}

// shortenInFlight shortens the grace of the pods already evicted for r that would outlive the
// current estimate (the fall sped up since): a later DELETE can only shorten a grace. Only by
// more than lead (the estimate moves by that between two readings without the fall speeding
// up: the pod was due a reading early for it), and never to less than MinCutGrace, which gains
// the pod nothing over the kubelet's own eviction (issue 47: a ±10 MiB reading cut a 3 s pod's
// grace to 1 s).
func (lp *Loop) shortenInFlight(ctx context.Context, now time.Time, r Resource, ttl, lead time.Duration, present map[types.UID]*v1.Pod, w plan.Window) {
	if ttl == Never {
		return
	}
	end := now.Add(max(ttl-lp.o.SafetyMargin, MinGrace) + lead)
	for uid, f := range lp.inFlight {
		pod := present[uid]
		if f.resource != r || pod == nil || pod.DeletionTimestamp == nil || !pod.DeletionTimestamp.After(end) {
			continue
		}
		grace := max((ttl - lp.o.SafetyMargin - plan.RequestAllowance).Truncate(time.Second), MinGrace)
		if grace < MinCutGrace {
			continue
		}
		if pod.DeletionGracePeriodSeconds != nil && time.Duration(*pod.DeletionGracePeriodSeconds)*time.Second <= grace {
			continue
		}
		grace, err := lp.o.Executor.Delete(ctx, pod, grace, w)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Shortening the grace of a pod evicted for pressure failed", "pod", klog.KObj(pod))
			continue
		}
		lp.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultGraceShortened).Inc()
		klog.FromContext(ctx).Info("Shortened the grace of a pod evicted for pressure: the signal falls faster than estimated",
			"pod", klog.KObj(pod), "grace", grace, "timeToHard", ttl)
		lp.o.Recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonGraceShortened, "Grace shortened to %s: %s pressure rises faster than estimated", grace, r)
	}
}

// pressureEvict evicts one pod for pressure through the Eviction API. While an interruption is
// pending its window bounds the grace too: a pressure eviction never gives more than the
// interruption plan would. lead is Decide's (Input.Lead), logged; 0 for a soft threshold's.
func (lp *Loop) pressureEvict(ctx context.Context, now time.Time, r Resource, lvl Level, ttl, lead time.Duration, ev Eviction, view evict.View) {
	logger := klog.FromContext(ctx)
	pod := ev.Pod
	grace := ev.Grace
	if view.Window.HasDeadline() {
		// An estimate for the check below; the executor cuts it again when the request leaves
		// (Executor.fit), as syncPod does.
		grace = min(grace, plan.GraceAt(grace, view.Window, now.Add(plan.RequestAllowance+plan.Tail(pod))))
	}
	eta := "now"
	if ttl > 0 {
		eta = "in about " + ttl.Round(time.Second).String()
	}
	var err error
	if pod.DeletionTimestamp != nil {
		// Already terminating (a rollout's delete): a DELETE with a shorter grace, as the kubelet
		// cuts the grace of a terminating pod it evicts (calculateEffectiveGracePeriod takes the
		// smaller). One whose end comes sooner anyway needs nothing.
		if left := pod.DeletionTimestamp.Sub(now); grace >= left {
			return
		}
		grace, err = lp.o.Executor.Delete(ctx, pod, grace, view.Window)
	} else {
		grace, err = lp.o.Executor.Evict(ctx, pod, grace, view.Window)
	}
	switch {
	case err == nil:
		lp.inFlight[pod.UID] = inFlight{key: pod.Namespace + "/" + pod.Name, resource: r, signal: lvl.Signal, usage: ev.Usage}
		delete(lp.blocked, pod.UID)
		delete(lp.retry, pod.UID)
		lp.o.Metrics.PressureEvictionsTotal.WithLabelValues(string(lvl.Signal)).Inc()
		lp.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultEvicted).Inc()
		logger.Info("Evicted pod for pressure", "pod", klog.KObj(pod), "signal", lvl.Signal, "available", lvl.Available,
			"kubeletHard", lvl.Hard, "timeToHard", ttl, "lead", lead, "grace", grace, "podGrace", ev.Candidate.Grace, "usage", ev.Usage)
		verb := "Evicted"
		if pod.DeletionTimestamp != nil {
			verb = "Cut the grace of this terminating pod"
		}
		if lp.o.DryRun {
			verb = "Dry run: would have evicted"
		}
		lp.o.Recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonPressureEviction,
			"%s for %s pressure with a %s grace (the pod asks %s): %s reaches the kubelet's hard threshold %s %s",
			verb, r, grace, ev.Candidate.Grace, lvl.Signal, FormatAmount(lvl.Signal, lvl.Hard), eta)
	case evict.IsPDBRefusal(err):
		b := lp.blocked[pod.UID]
		b.attempts++
		b.until = now.Add(min(pressureBlockedBackoff<<min(b.attempts-1, 5), pressureBlockedMax))
		lp.blocked[pod.UID] = b
		lp.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultPDBBlocked).Inc()
		logger.Info("A PodDisruptionBudget blocks the pressure eviction; trying the next pod", "pod", klog.KObj(pod), "retryAt", b.until)
		if b.attempts == 1 {
			lp.o.Recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonEvictionBlocked, "A PodDisruptionBudget blocks its eviction for %s pressure", r)
		}
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone, or replaced by a pod of the same name: nothing to do.
	default:
		lp.retry[pod.UID] = true
		lp.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
		logger.Error(err, "Evicting pod for pressure failed; will retry", "pod", klog.KObj(pod))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
