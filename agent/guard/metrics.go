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
)

var results = []string{ResultAllowed, ResultDenied, ResultError}

// Metrics holds the guard's collectors.
type Metrics struct {
	ReviewsTotal *prometheus.CounterVec
}

// NewMetrics creates the guard's collectors on reg, with every result at zero so that alerts
// see the series before the first review.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		ReviewsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "reviews_total",
			Help: "Eviction admission reviews answered by the eviction guard, by result (allowed, denied, error).",
		}, []string{"result"}),
	}
	if err := reg.Register(m.ReviewsTotal); err != nil {
		return nil, fmt.Errorf("registering reprieve_guard_reviews_total: %w", err)
	}
	for _, r := range results {
		m.ReviewsTotal.WithLabelValues(r)
	}
	return m, nil
}
