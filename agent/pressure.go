package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/metrics"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// pressureBlockedBackoff is how long a pod whose pressure eviction a PodDisruptionBudget
// refused is passed over, doubling to pressureBlockedMax: the next pod in rank goes instead.
const (
	pressureBlockedBackoff = time.Second
	pressureBlockedMax     = 30 * time.Second
)

// pressureState is the pressure loop's memory, guarded by its own goroutine (only the taints
// are read elsewhere, under Agent.mu).
type pressureState struct {
	source     kubelet.Source
	thresholds pressure.Thresholds
	kubeletCfg kubelet.Config
	tracker    *pressure.Tracker
	trend      *pressure.Trend
	// inFlight are the pods evicted for pressure that are still on the node.
	inFlight map[types.UID]inFlight
	// blocked are pods a PodDisruptionBudget protected, with when to try again.
	blocked map[types.UID]blockedPod
	lastErr string
	// configErr is why the kubelet's config could not be read; it turns pressure handling off.
	configErr error
	// warned remembers the signals already warned about (a threshold not above the kubelet's).
	warned map[kubelet.Signal]bool
}

type inFlight struct {
	key      string
	resource pressure.Resource
	// signal is the one it was evicted for, and usage what it uses of it.
	signal kubelet.Signal
	usage  int64
}

type blockedPod struct {
	until    time.Time
	attempts int
}

// PressureThresholds reads what the levels are computed from: reprieve's thresholds from the
// flags and the kubelet's from its config file under --host-root. A flag that does not parse is
// err; a kubelet config that cannot be read or parsed is kubeletErr (the thresholds then hold
// the kubelet's defaults), which turns only the pressure handling off.
func PressureThresholds(cfg Config) (t pressure.Thresholds, kc kubelet.Config, kubeletErr, err error) {
	explicit, headroom, reclaim, err := cfg.PressureThresholdsOf()
	if err != nil {
		return t, kc, nil, err
	}
	kc, kubeletErr = kubelet.ReadConfig(filepath.Join(cfg.HostRoot, cfg.KubeletConfig))
	if kubeletErr != nil {
		kubeletErr = fmt.Errorf("reading the kubelet's eviction thresholds: %w", kubeletErr)
	}
	if reclaim == nil {
		reclaim = kc.MinimumReclaim
	}
	return pressure.Thresholds{Explicit: explicit, Headroom: headroom, Hard: kc.Hard, Soft: kc.Soft, MinReclaim: reclaim}, kc, kubeletErr, nil
}

// NewPressureSource builds the source --pressure-source names. For the Summary API without
// --kubelet-summary-url, node gives the kubelet's address. It also returns what it reads from.
func NewPressureSource(cfg Config, node *v1.Node) (kubelet.Source, string, error) {
	if cfg.PressureSource == PressureSourceHost {
		return &kubelet.HostSource{Root: cfg.HostRoot, KubeletRootDir: cfg.KubeletRootDir, ImageFsDir: cfg.ImageFsDir}, cfg.HostRoot, nil
	}
	url := cfg.KubeletSummaryURL
	if url == "" {
		if node == nil {
			return nil, "", errors.New("finding the kubelet's Summary API: node not found; set --kubelet-summary-url")
		}
		var err error
		if url, err = SummaryURL(node); err != nil {
			return nil, "", err
		}
	}
	token := cfg.KubeletTokenFile
	if _, err := os.Stat(token); err != nil {
		token = ""
	}
	ca := cfg.KubeletCAFile
	if _, err := os.Stat(ca); err != nil || cfg.KubeletInsecureTLS {
		// Outside a pod (or with a plain-HTTP test server) there is no in-cluster CA: the
		// system's roots verify the kubelet then.
		ca = ""
	}
	src, err := kubelet.NewSummarySource(url, ca, token, cfg.KubeletInsecureTLS)
	if err != nil {
		return nil, "", fmt.Errorf("setting up the kubelet's Summary API client: %w", err)
	}
	return src, url, nil
}

// newPressure reads the thresholds; nil when --pressure-source is off. The source is built in
// startPressure: the Summary API's address may need the node.
func newPressure(cfg Config, source kubelet.Source) (*pressureState, error) {
	if cfg.PressureSource == PressureSourceOff {
		return nil, nil
	}
	thresholds, kc, kcErr, err := PressureThresholds(cfg)
	if err != nil {
		return nil, err
	}
	return &pressureState{
		source:     source,
		thresholds: thresholds,
		kubeletCfg: kc,
		configErr:  kcErr,
		tracker:    pressure.NewTracker(cfg.PressureTransitionPeriod),
		trend:      pressure.NewTrend(cfg.PressureTrendWindow),
		inFlight:   map[types.UID]inFlight{},
		blocked:    map[types.UID]blockedPod{},
		warned:     map[kubelet.Signal]bool{},
	}, nil
}

// startPressure resolves what needs the node (the Summary API's address), restores the
// pressure state that reprieve's own taints on the node record (a restarted agent keeps a
// taint until the transition period shows the pressure is over), and takes a first reading.
func (a *Agent) startPressure(ctx context.Context) error {
	p := a.pressure
	logger := klog.FromContext(ctx)
	if p.configErr != nil {
		a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeWarning, events.ReasonPressureDisabled,
			"Local pressure handling is off: %v", p.configErr)
		return p.configErr
	}
	node := a.cachedNode()
	if p.source == nil {
		src, from, err := NewPressureSource(a.cfg, node)
		if err != nil {
			return err
		}
		p.source = src
		logger.Info("Reading pressure signals", "source", a.cfg.PressureSource, "from", from)
	}
	thresholds := make([]string, 0, len(p.thresholds.Explicit))
	for _, t := range p.thresholds.Explicit {
		thresholds = append(thresholds, t.String())
	}
	hard := make([]string, 0, len(p.thresholds.Hard))
	for _, t := range p.thresholds.Hard {
		hard = append(hard, t.String())
	}
	logger.Info("Watching local pressure", "source", a.cfg.PressureSource, "kubeletConfig", p.kubeletCfg.Path,
		"kubeletConfigFound", p.kubeletCfg.Found, "kubeletHard", hard, "thresholds", thresholds,
		"headroom", p.thresholds.Headroom, "transitionPeriod", a.cfg.PressureTransitionPeriod)
	if node != nil {
		own := setOf(parseOwned(node).Taints)
		for _, r := range pressure.Resources {
			if own[taintID(a.pressureTaint(r))] {
				p.tracker.Restore(r, a.clock.Now())
				a.setPressureTaint(r, true)
				logger.Info("Pressure taint found on the node; keeping it until the pressure is seen to be over", "resource", r)
			}
		}
	}
	a.observePressure(ctx)
	return nil
}

// SummaryURL is the kubelet's Summary API on the node's InternalIP and kubelet port.
func SummaryURL(node *v1.Node) (string, error) {
	port := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	if port == 0 {
		port = 10250
	}
	for _, addr := range node.Status.Addresses {
		if addr.Type == v1.NodeInternalIP {
			return "https://" + net.JoinHostPort(addr.Address, strconv.Itoa(port)) + "/stats/summary", nil
		}
	}
	return "", fmt.Errorf("finding the kubelet's Summary API: node %s has no InternalIP; set --kubelet-summary-url", node.Name)
}

// pressureLoop reads the signals every --pressure-interval.
func (a *Agent) pressureLoop(ctx context.Context) {
	timer := a.clock.NewTimer(time.Duration(rand.Int64N(int64(a.cfg.PressureInterval))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
			a.observePressure(ctx)
			timer.Reset(a.cfg.PressureInterval)
		}
	}
}

func (a *Agent) pressureTaint(r pressure.Resource) v1.Taint {
	return v1.Taint{Key: pressure.TaintKey(r), Value: "true", Effect: v1.TaintEffect(a.cfg.PressureTaintEffect)}
}

// setPressureTaint records whether r's taint is wanted and reports whether that changed.
func (a *Agent) setPressureTaint(r pressure.Resource, on bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pressureTaints == nil {
		a.pressureTaints = map[pressure.Resource]bool{}
	}
	was := a.pressureTaints[r]
	a.pressureTaints[r] = on
	return was != on
}

// wantedPressureTaints returns the pressure taints wanted on the node; a.mu must be held.
func (a *Agent) wantedPressureTaints() []v1.Taint {
	var out []v1.Taint
	for _, r := range pressure.Resources {
		if a.pressureTaints[r] {
			out = append(out, a.pressureTaint(r))
		}
	}
	return out
}

// observePressure is one iteration of the pressure loop: read, update the levels, the trend
// and the taints, then evict what the predictive rule says must go now.
func (a *Agent) observePressure(ctx context.Context) {
	p := a.pressure
	logger := klog.FromContext(ctx)
	now := a.clock.Now()
	rctx, cancel := context.WithTimeout(ctx, max(2*a.cfg.PressureInterval, 3*time.Second))
	sample, err := p.source.Read(rctx)
	cancel()
	if err != nil {
		a.metrics.PressureReadErrors.Inc()
		// Once per distinct error, so that a missing file does not fill the log every second.
		if msg := err.Error(); msg != p.lastErr && ctx.Err() == nil {
			logger.Error(err, "Reading pressure signals failed; keeping the last state for what could not be read", "source", a.cfg.PressureSource)
			p.lastErr = msg
		}
	} else {
		p.lastErr = ""
	}
	levels := p.thresholds.Levels(sample.Node)
	for i := range levels {
		l := &levels[i]
		if l.At.IsZero() || l.At.After(now) {
			l.At = now
		}
		p.trend.Add(l.At, l.Signal, l.Available)
		if l.Threshold <= l.Hard && l.Hard > 0 && !p.warned[l.Signal] {
			p.warned[l.Signal] = true
			logger.Error(nil, "reprieve's pressure threshold is not above the kubelet's hard threshold: the kubelet will evict first",
				"signal", l.Signal, "threshold", l.Threshold, "kubeletHard", l.Hard)
		}
		s := string(l.Signal)
		a.metrics.PressureAvailable.WithLabelValues(s).Set(float64(l.Available))
		a.metrics.PressureThreshold.WithLabelValues(s, "reprieve").Set(float64(l.Threshold))
		a.metrics.PressureThreshold.WithLabelValues(s, "kubelet_hard").Set(float64(l.Hard))
	}
	for _, ch := range p.tracker.Observe(now, levels) {
		a.reportPressureChange(ctx, ch)
		if a.setPressureTaint(ch.Resource, ch.Active) {
			a.signalNode()
		}
	}
	for _, r := range pressure.Resources {
		a.metrics.PressureActive.WithLabelValues(string(r)).Set(b2f(p.tracker.Active(r)))
	}
	a.evictForPressure(ctx, now, levels, sample)
}

func (a *Agent) reportPressureChange(ctx context.Context, ch pressure.Change) {
	logger := klog.FromContext(ctx)
	if ch.Active {
		l := ch.Level
		logger.Info("Pressure detected", "resource", ch.Resource, "signal", l.Signal, "available", l.Available,
			"threshold", l.Threshold, "kubeletHard", l.Hard)
		a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeWarning, events.ReasonPressureDetected,
			"%s %s is below reprieve's threshold %s (the kubelet evicts at %s): tainting %s",
			l.Signal, FormatAmount(l.Signal, l.Available), FormatAmount(l.Signal, l.Threshold), FormatAmount(l.Signal, l.Hard), pressure.TaintKey(ch.Resource))
		return
	}
	logger.Info("Pressure cleared", "resource", ch.Resource, "transitionPeriod", a.cfg.PressureTransitionPeriod)
	a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeNormal, events.ReasonPressureCleared,
		"No %s pressure for %s: removing %s", ch.Resource, a.cfg.PressureTransitionPeriod, pressure.TaintKey(ch.Resource))
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

// evictForPressure applies the predictive rule to every resource under pressure.
func (a *Agent) evictForPressure(ctx context.Context, now time.Time, levels []pressure.Level, sample kubelet.Sample) {
	p := a.pressure
	pods, err := a.podLister.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods from the cache failed")
		return
	}
	present := map[types.UID]*v1.Pod{}
	for _, pod := range pods {
		present[pod.UID] = pod
	}
	for uid := range p.inFlight {
		pod, ok := present[uid]
		switch {
		case !ok, pod.Status.Phase == v1.PodSucceeded, pod.Status.Phase == v1.PodFailed,
			pod.DeletionTimestamp != nil && now.After(pod.DeletionTimestamp.Add(stuckAfter)):
			delete(p.inFlight, uid)
		}
	}
	for uid, b := range p.blocked {
		if _, ok := present[uid]; !ok || now.Sub(b.until) > pressureBlockedMax {
			delete(p.blocked, uid)
		}
	}
	view := a.currentView()
	for _, r := range pressure.Resources {
		if !p.tracker.Active(r) {
			a.metrics.PressureTimeToHard.WithLabelValues(string(r)).Set(math.Inf(1))
			continue
		}
		// The signal of r nearest its hard threshold decides, among those reprieve evicts for.
		var lvl pressure.Level
		ttl, shown := pressure.Never, pressure.Never
		for _, l := range levels {
			if pressure.ResourceOf(l.Signal) != r {
				continue
			}
			slope, ok := p.trend.Slope(l.Signal)
			t := pressure.TimeTo(l.Available, l.Hard, slope, ok)
			if t != pressure.Never {
				// The estimate runs from when the source measured, not from now.
				t = max(t-now.Sub(l.At), 0)
			}
			shown = min(shown, t)
			if evictsFor(l.Signal, sample.DedicatedImageFs) && t <= ttl {
				lvl, ttl = l, t
			}
		}
		a.metrics.PressureTimeToHard.WithLabelValues(string(r)).Set(shown.Seconds())
		if lvl.Signal == "" {
			continue // nothing read this time, or only signals the kubelet's image GC answers
		}
		var evictable []*v1.Pod
		for _, pod := range pods {
			if pressure.Keep(pod, a.cfg.PodNamespace, a.cfg.PodName) != "" {
				continue
			}
			if b, ok := p.blocked[pod.UID]; ok && now.Before(b.until) {
				continue
			}
			if _, ok := p.inFlight[pod.UID]; ok {
				continue
			}
			evictable = append(evictable, pod)
		}
		a.shortenInFlight(ctx, now, r, ttl, present)
		in := pressure.Input{
			Level: lvl, Active: true, TimeToHard: ttl,
			Ranked:       pressure.Candidates(lvl.Signal, evictable, sample.Pods, plan.PodGrace),
			SafetyMargin: a.cfg.SafetyMargin, Allowance: plan.RequestAllowance,
		}
		for _, f := range p.inFlight {
			if f.resource == r {
				in.InFlight++
				if f.signal == lvl.Signal {
					in.Reclaiming += f.usage
				}
			}
		}
		for _, ev := range pressure.Decide(in) {
			a.pressureEvict(ctx, now, r, lvl, ttl, ev, view)
		}
	}
}

// shortenInFlight shortens the grace of the pods already evicted for r that would outlive the
// current estimate (the fall sped up since): a later DELETE can only shorten a grace.
func (a *Agent) shortenInFlight(ctx context.Context, now time.Time, r pressure.Resource, ttl time.Duration, present map[types.UID]*v1.Pod) {
	if ttl == pressure.Never {
		return
	}
	end := now.Add(max(ttl-a.cfg.SafetyMargin, pressure.MinGrace))
	for uid, f := range a.pressure.inFlight {
		pod := present[uid]
		if f.resource != r || pod == nil || pod.DeletionTimestamp == nil || !pod.DeletionTimestamp.After(end) {
			continue
		}
		grace := max((ttl - a.cfg.SafetyMargin - plan.RequestAllowance).Truncate(time.Second), pressure.MinGrace)
		if pod.DeletionGracePeriodSeconds != nil && time.Duration(*pod.DeletionGracePeriodSeconds)*time.Second <= grace {
			continue
		}
		if err := a.deletePod(ctx, pod, grace); err != nil {
			klog.FromContext(ctx).Error(err, "Shortening the grace of a pod evicted for pressure failed", "pod", klog.KObj(pod))
			continue
		}
		a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultGraceShortened).Inc()
		klog.FromContext(ctx).Info("Shortened the grace of a pod evicted for pressure: the signal falls faster than estimated",
			"pod", klog.KObj(pod), "grace", grace, "timeToHard", ttl)
		a.recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonGraceShortened, "Grace shortened to %s: %s pressure rises faster than estimated", grace, r)
	}
}

// pressureEvict evicts one pod for pressure through the Eviction API. While an interruption is
// pending its window bounds the grace too: a pressure eviction never gives more than the
// interruption plan would.
func (a *Agent) pressureEvict(ctx context.Context, now time.Time, r pressure.Resource, lvl pressure.Level, ttl time.Duration, ev pressure.Eviction, view planView) {
	p := a.pressure
	logger := klog.FromContext(ctx)
	pod := ev.Pod
	grace := ev.Grace
	if view.window.HasDeadline() {
		// As syncPod does: from when the request lands, not from now.
		grace = min(grace, plan.GraceAt(ev.Candidate.Grace, view.window, now.Add(plan.RequestAllowance)))
	}
	eta := "now"
	if ttl > 0 {
		eta = "in about " + ttl.Round(time.Second).String()
	}
	err := a.evict(ctx, pod, grace)
	switch {
	case err == nil:
		p.inFlight[pod.UID] = inFlight{key: pod.Namespace + "/" + pod.Name, resource: r, signal: lvl.Signal, usage: ev.Usage}
		delete(p.blocked, pod.UID)
		a.metrics.PressureEvictionsTotal.WithLabelValues(string(lvl.Signal)).Inc()
		a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultEvicted).Inc()
		logger.Info("Evicted pod for pressure", "pod", klog.KObj(pod), "signal", lvl.Signal, "available", lvl.Available,
			"kubeletHard", lvl.Hard, "timeToHard", ttl, "grace", grace, "podGrace", ev.Candidate.Grace, "usage", ev.Usage)
		verb := "Evicted"
		if a.cfg.DryRun {
			verb = "Dry run: would have evicted"
		}
		a.recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonPressureEviction,
			"%s for %s pressure with a %s grace (the pod asks %s): %s reaches the kubelet's hard threshold %s %s",
			verb, r, grace, ev.Candidate.Grace, lvl.Signal, FormatAmount(lvl.Signal, lvl.Hard), eta)
	case isPDBRefusal(err):
		b := p.blocked[pod.UID]
		b.attempts++
		b.until = now.Add(min(pressureBlockedBackoff<<min(b.attempts-1, 5), pressureBlockedMax))
		p.blocked[pod.UID] = b
		a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultPDBBlocked).Inc()
		logger.Info("A PodDisruptionBudget blocks the pressure eviction; trying the next pod", "pod", klog.KObj(pod), "retryAt", b.until)
		if b.attempts == 1 {
			a.recorder.Eventf(pod, v1.EventTypeWarning, events.ReasonEvictionBlocked, "A PodDisruptionBudget blocks its eviction for %s pressure", r)
		}
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone, or replaced by a pod of the same name: nothing to do.
	default:
		a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
		logger.Error(err, "Evicting pod for pressure failed; will retry", "pod", klog.KObj(pod))
	}
}
