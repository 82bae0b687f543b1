package guard

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Review results, the bounded label set of reprieve_guard_reviews_total.
const (
	// ResultAllowed: an eviction of a pod on the caller's own node, or a request the guard does
	// not judge (another identity, another resource).
	ResultAllowed = "allowed"
	// ResultDenied: an eviction refused (another node, no node claim, UID mismatch, no pod).
	ResultDenied = "denied"
	// ResultError: the pod could not be read; the API server's failurePolicy decides.
	ResultError = "error"
	// ResultRejected: a request refused before it was judged: its source past its limits, a
	// caller without the client certificate --client-ca-file asks for, or a body that is no
	// AdmissionReview. Forged reviews land here, not in error, which says that the guard
	// failed the API server.
	ResultRejected = "rejected"
)

var results = []string{ResultAllowed, ResultDenied, ResultError, ResultRejected}

// Where a review's pod was found, the bounded label set of reprieve_guard_pod_lookups_total.
const (
	// FromIndex: the guard's watch-fed index (PodIndex) knew the pod; no call to the API server.
	FromIndex = "index"
	// FromAPI: the index had not seen the pod bound, and the guard read it with a GET.
	FromAPI = "api"
)

// Metrics holds the guard's collectors.
type Metrics struct {
	ReviewsTotal *prometheus.CounterVec
	// ConnectionsRefused counts connections closed at accept, past the caps per source or in all.
	ConnectionsRefused prometheus.Counter
	// PodLookups counts the pods the guard looked up to judge a review, by where it found them.
	PodLookups *prometheus.CounterVec
	// SourceInFlightPeak is the most reviews one source address has had in flight at once.
	SourceInFlightPeak prometheus.Gauge
}

// NewMetrics creates the guard's collectors on reg, with every result at zero so that alerts
// see the series before the first review.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		ReviewsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "reviews_total",
			Help: "Eviction admission reviews answered by the eviction guard, by result (allowed, denied, error, rejected).",
		}, []string{"result"}),
		ConnectionsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "connections_refused_total",
			Help: "Connections the eviction guard closed at once, past its caps per source address or in all.",
		}),
		PodLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "pod_lookups_total",
			Help: "Pods the eviction guard looked up to judge a review, by where it found them: index (its watch of the cluster's pods) or api (a GET, for a pod the index had not seen bound).",
		}, []string{"from"}),
		SourceInFlightPeak: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "source_reviews_in_flight_peak",
			Help: "The most reviews one source address has had in flight at once since the eviction guard started (against --source-reviews-in-flight).",
		}),
	}
	if err := register(reg, []named{{"reprieve_guard_reviews_total", m.ReviewsTotal}, {"reprieve_guard_connections_refused_total", m.ConnectionsRefused},
		{"reprieve_guard_pod_lookups_total", m.PodLookups}, {"reprieve_guard_source_reviews_in_flight_peak", m.SourceInFlightPeak}}); err != nil {
		return nil, err
	}
	for _, r := range results {
		m.ReviewsTotal.WithLabelValues(r)
	}
	for _, f := range []string{FromIndex, FromAPI} {
		m.PodLookups.WithLabelValues(f)
	}
	return m, nil
}

// IndexMetrics holds the collectors of the guard's pod index.
type IndexMetrics struct {
	// Pods is how many pods the index holds; Synced is 1 once it has had its first full list.
	Pods, Synced prometheus.Gauge
	// ListWatchErrors counts the index's lists and watches that failed to start.
	ListWatchErrors prometheus.Counter
}

// NewIndexMetrics creates the index's collectors on reg.
func NewIndexMetrics(reg prometheus.Registerer) (*IndexMetrics, error) {
	m := &IndexMetrics{
		Pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "index_pods",
			Help: "Pods bound to a node that the eviction guard's index holds.",
		}),
		Synced: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "index_synced",
			Help: "1 once the eviction guard's pod index has had its first full list (the guard is ready from then on), else 0.",
		}),
		ListWatchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "index_list_watch_errors_total",
			Help: "Lists and watches of pods by the eviction guard's index that failed to start; meanwhile the index keeps what it had, and pods it has not seen are read with a GET.",
		}),
	}
	if err := register(reg, []named{{"reprieve_guard_index_pods", m.Pods}, {"reprieve_guard_index_synced", m.Synced}, {"reprieve_guard_index_list_watch_errors_total", m.ListWatchErrors}}); err != nil {
		return nil, err
	}
	return m, nil
}

// named is a collector with the name its registration error reports.
type named struct {
	name string
	c    prometheus.Collector
}

// register registers each collector on reg, naming the first that fails.
func register(reg prometheus.Registerer, cs []named) error {
	for _, c := range cs {
		if err := reg.Register(c.c); err != nil {
			return fmt.Errorf("registering %s: %w", c.name, err)
		}
	}
	return nil
}
