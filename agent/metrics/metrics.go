// Package metrics holds every Prometheus collector of the agent, created once and registered on
// the agent's own registry, so that each unit of the agent counts what it does without owning
// the registry.
package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/providers"
)

// Namespace is the first part of every metric name.
const Namespace = "reprieve"

// Eviction results, the bounded label set of reprieve_evictions_requests_total.
const (
	ResultEvicted        = "evicted"
	ResultPDBBlocked     = "pdb_blocked"
	ResultForcedDelete   = "forced_delete"
	ResultGraceShortened = "grace_shortened"
	ResultFailed         = "failed"
	ResultGone           = "gone"
)

var evictionResults = []string{ResultEvicted, ResultPDBBlocked, ResultForcedDelete, ResultGraceShortened, ResultFailed, ResultGone}

// Volume results, the label set of reprieve_window_volumes_total.
const (
	VolumeReleased   = "released"
	VolumeStillInUse = "still_in_use"
)

// Poll outcomes, the label set of reprieve_metadata_polls_total.
var pollOutcomes = []string{"ok", "error"}

// Metrics holds every collector of the agent. Labels are bounded: never pod names or event IDs
// (the scrape adds the node).
type Metrics struct {
	NoticesTotal          *prometheus.CounterVec
	ReclaimDeadline       prometheus.Gauge
	NoticeToTaint         prometheus.Histogram
	PollsTotal            *prometheus.CounterVec
	TaintActive           *prometheus.GaugeVec
	EvictionRequestsTotal *prometheus.CounterVec
	EvictionLateness      prometheus.Histogram
	BlockedPods           prometheus.Gauge
	MissedDeadlineTotal   prometheus.Counter
	VolumeAtRiskTotal     prometheus.Counter
	// WindowVolumes counts, at each window's summary (when their release is due: the window's
	// end, or the last released, or the deadline), the volumes the node listed in use during
	// the window by whether they were released by then (VolumeReleased, VolumeStillInUse).
	WindowVolumes *prometheus.CounterVec
	// EvictionCheck is the last dry-run eviction's verdict on the eviction path (RBAC, the
	// policies, the eviction guard), one status at 1.
	EvictionCheck *prometheus.GaugeVec
	BuildInfo     *prometheus.GaugeVec
	// NodeWritesRefused and NodeWriteRefusalsInARow count writes of the agent's own node that
	// the API server refused (403): without them a token the policy binds to no node fails
	// closed in silence, the node unprotected.
	NodeWritesRefused       prometheus.Counter
	NodeWriteRefusalsInARow prometheus.Gauge
	// PodWarningWrites counts the early warnings' pods/status patches by result: a warning
	// that keeps failing reaches no workload, however well the node is drained.
	PodWarningWrites *prometheus.CounterVec

	PressureAvailable      unitGauges
	PressureThreshold      unitGauges
	PressureActive         *prometheus.GaugeVec
	PressureTimeToHard     *prometheus.GaugeVec
	PressureEvictionsTotal *prometheus.CounterVec
	PressureReadErrors     prometheus.Counter
	// KubeletConfigKnown is reprieve_kubelet_config_known (see New).
	KubeletConfigKnown *prometheus.GaugeVec
}

// New creates the collectors and registers them on reg. Counters are created at zero
// for every label value so that rates and alerts see them before the first event.
func New(reg prometheus.Registerer, provider string) (*Metrics, error) {
	m := &Metrics{
		NoticesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "notices", Name: "received_total",
			Help: "Notices received from the cloud, by provider and kind.",
		}, []string{"provider", "kind"}),
		ReclaimDeadline: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "notices", Name: "reclaim_deadline_timestamp_seconds",
			Help: "The pending reclaim deadline as a Unix timestamp; 0 when none.",
		}),
		NoticeToTaint: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "notices", Name: "taint_latency_seconds",
			Help:    "Seconds from a notice (its notice time, else when reprieve first saw it) to its taint being on the node.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30},
		}),
		PollsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "metadata", Name: "polls_total",
			Help: "Polls of the provider (all of its metadata sources), by provider and outcome (ok, error).",
		}, []string{"provider", "outcome"}),
		TaintActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "taints", Name: "active",
			Help: "1 while reprieve's taint with this key is on the node (or, in a dry run, would be).",
		}, []string{"key"}),
		EvictionRequestsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "requests_total",
			Help: "Eviction and delete requests, by result.",
		}, []string{"result"}),
		EvictionLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "lateness_seconds",
			Help:    "How long after its planned time (or after the notice, for a plan already past then) each pod's eviction took effect.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}),
		BlockedPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "blocked_pods",
			Help: "Pods whose last eviction request a PodDisruptionBudget refused.",
		}),
		MissedDeadlineTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "missed_deadline_total",
			Help: "Pods reprieve planned to evict that were still present at the end of the window (deadline - safety margin). Must stay 0.",
		}),
		VolumeAtRiskTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "volume_at_risk_total",
			Help: "Pods with a volume that needs attaching that could not be gone --volume-release before the deadline (the window too short for their grace, or the eviction late): the attach/detach controller may wait six minutes to detach it.",
		}),
		WindowVolumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "window", Name: "volumes_total",
			Help: "At each interruption window's summary, when the volumes' release is due (the window's end, or while a volume of the evicted pods is still listed in use the last release or the deadline), the volumes the node listed in status.volumesInUse during the window: released (gone from the list by then) or still_in_use (the attach/detach controller may wait six minutes to detach it from the reclaimed machine).",
		}, []string{"result"}),
		EvictionCheck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "evictions", Name: "check_status",
			Help: "1 for the status of the last server-side dry-run eviction of the agent's own pod (at start, every 10 minutes, with backoff while it fails): ok, guard_unreachable, refused or unknown.",
		}, []string{"status"}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "build_info",
			Help: "Always 1; the labels say which build is running.",
		}, []string{"version", "revision", "goversion", "goos", "goarch"}),
		NodeWritesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "node", Name: "writes_refused_total",
			Help: "Writes of the agent's own node (patches, and the start-up dry run) that the API server refused with 403: RBAC, or the admission policy (a token without the node claim).",
		}),
		NodeWriteRefusalsInARow: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "node", Name: "write_refusals_in_a_row",
			Help: "Node writes refused since the last one that succeeded; at --node-write-refusals the agent is not ready.",
		}),
		PodWarningWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "pod_warnings", Name: "writes_total",
			Help: "Writes of the early warning (the reprieve.io/Interruption condition and annotations) to pods' status, by result: written or failed (retried with backoff).",
		}, []string{"result"}),
		// The pressure signals keep the kubelet's names; one metric per unit (the Prometheus
		// naming guide): bytes for memory.available, nodefs.available and imagefs.available,
		// inodes for *.inodesFree, PIDs for pid.available.
		PressureAvailable: newUnitGauges("available", "The last reading of each pressure signal, as the kubelet computes it", "signal"),
		PressureThreshold: newUnitGauges("threshold", "Each signal's thresholds: kind=reprieve (taint and predictive evictions from here) and kind=kubelet_hard (the kubelet evicts with a 1 s grace here)", "signal", "kind"),
		PressureActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "pressure", Name: "active",
			Help: "1 while the resource (memory, disk, pid) is under pressure by reprieve's thresholds.",
		}, []string{"resource"}),
		PressureTimeToHard: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "pressure", Name: "time_to_hard_threshold_seconds",
			Help: "Under pressure, the estimate of when the resource's nearest signal reaches the kubelet's hard threshold; +Inf when it is not falling or not under pressure.",
		}, []string{"resource"}),
		PressureEvictionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "pressure", Name: "evictions_total",
			Help: "Pods evicted for pressure, by the signal that decided it.",
		}, []string{"signal"}),
		PressureReadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "pressure", Name: "read_errors_total",
			Help: "Readings of the pressure signals that failed in whole or in part.",
		}),
	}
	for _, s := range kubelet.Signals {
		m.PressureEvictionsTotal.WithLabelValues(string(s))
	}
	for _, k := range providers.Kinds {
		m.NoticesTotal.WithLabelValues(provider, string(k))
	}
	for _, o := range pollOutcomes {
		m.PollsTotal.WithLabelValues(provider, o)
	}
	for _, r := range []string{"written", "failed"} {
		m.PodWarningWrites.WithLabelValues(r)
	}
	for _, r := range evictionResults {
		m.EvictionRequestsTotal.WithLabelValues(r)
	}
	for _, r := range []string{VolumeReleased, VolumeStillInUse} {
		m.WindowVolumes.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.NoticesTotal, m.ReclaimDeadline, m.NoticeToTaint, m.PollsTotal, m.TaintActive,
		m.EvictionRequestsTotal, m.EvictionLateness, m.BlockedPods, m.MissedDeadlineTotal, m.VolumeAtRiskTotal, m.WindowVolumes, m.EvictionCheck, m.BuildInfo,
		m.NodeWritesRefused, m.NodeWriteRefusalsInARow, m.PodWarningWrites,
		m.PressureAvailable.bytes, m.PressureAvailable.inodes, m.PressureAvailable.pids,
		m.PressureThreshold.bytes, m.PressureThreshold.inodes, m.PressureThreshold.pids, m.PressureActive, m.PressureTimeToHard, m.PressureEvictionsTotal, m.PressureReadErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Whether the kubelet's configuration (its eviction thresholds and graceful node shutdown)
	// was found and parsed: 0 when it is unknown and the kubelet's defaults are assumed, or
	// unreadable. path is the file read, "" when none was found.
	m.KubeletConfigKnown = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "kubelet", Name: "config_known",
		Help: "1 when the kubelet's configuration file was found and parsed; 0 when it is unknown (not found: the kubelet's defaults are assumed) or unreadable.",
	}, []string{"path"})
	if err := reg.Register(m.KubeletConfigKnown); err != nil {
		return nil, err
	}
	return m, nil
}

// unitGauges is one pressure gauge split by unit: reprieve_pressure_<name>_bytes, _inodes and
// _pids, each with the same labels, the first of which is the kubelet's signal name.
type unitGauges struct {
	bytes, inodes, pids *prometheus.GaugeVec
}

func newUnitGauges(name, help string, labels ...string) unitGauges {
	vec := func(unit, which string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "pressure", Name: name + "_" + unit,
			Help: help + ", in " + unit + " (" + which + ").",
		}, labels)
	}
	return unitGauges{
		bytes:  vec("bytes", "memory.available, nodefs.available, imagefs.available"),
		inodes: vec("inodes", "nodefs.inodesFree, imagefs.inodesFree"),
		pids:   vec("pids", "pid.available"),
	}
}

// WithLabelValues returns the gauge of the signal's unit; the first value is the signal.
func (u unitGauges) WithLabelValues(signal string, rest ...string) prometheus.Gauge {
	vec := u.bytes
	switch {
	case strings.HasSuffix(signal, ".inodesFree"):
		vec = u.inodes
	case signal == "pid.available":
		vec = u.pids
	}
	return vec.WithLabelValues(append([]string{signal}, rest...)...)
}
