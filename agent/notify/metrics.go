package notify

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Delivery outcomes, the bounded label set of reprieve_webhook_deliveries_total.
const (
	OutcomeDelivered = "delivered"
	OutcomeFailed    = "failed"
	OutcomeDropped   = "dropped"
)

type metrics struct {
	deliveries *prometheus.CounterVec
	duration   prometheus.Histogram
	// Resolved once so that Notify's drop path is a single atomic add.
	delivered, failed, dropped prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "webhook", Name: "deliveries_total",
			Help: "Webhook messages by outcome: delivered, failed (after retries, or refused), dropped (queue full or shutting down).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "reprieve", Subsystem: "webhook", Name: "delivery_duration_seconds",
			Help:    "Seconds from the first attempt to delivery or final failure of each webhook message, retries included.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
	}
	// Resolving every label value also creates the series at zero, so that alerts see them
	// before the first message.
	m.delivered = m.deliveries.WithLabelValues(OutcomeDelivered)
	m.failed = m.deliveries.WithLabelValues(OutcomeFailed)
	m.dropped = m.deliveries.WithLabelValues(OutcomeDropped)
	return m
}

// Register registers the notifier's collectors on reg: reprieve_webhook_deliveries_total{outcome}
// and reprieve_webhook_delivery_duration_seconds. Counting starts at New, so nothing is lost when
// Register comes later.
func (n *Notifier) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{n.metrics.deliveries, n.metrics.duration} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("registering webhook metrics: %w", err)
		}
	}
	return nil
}
