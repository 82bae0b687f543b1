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

// Metrics holds the guard's collectors.
type Metrics struct {
	ReviewsTotal *prometheus.CounterVec
	// ConnectionsRefused counts connections closed at accept, past the caps per source or in all.
	ConnectionsRefused prometheus.Counter
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
	}
	for _, c := range []struct {
		name string
		c    prometheus.Collector
	}{{"reprieve_guard_reviews_total", m.ReviewsTotal}, {"reprieve_guard_connections_refused_total", m.ConnectionsRefused}} {
		if err := reg.Register(c.c); err != nil {
			return nil, fmt.Errorf("registering %s: %w", c.name, err)
		}
	}
	for _, r := range results {
		m.ReviewsTotal.WithLabelValues(r)
	}
	return m, nil
}
