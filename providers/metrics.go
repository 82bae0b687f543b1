package providers

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Request outcomes, the bounded label set of reprieve_metadata_requests_total.
const (
	OutcomeSuccess     = "success"      // 2xx
	OutcomeNotFound    = "not_found"    // 404: IMDS's "nothing pending"
	OutcomeThrottled   = "throttled"    // 429
	OutcomeClientError = "client_error" // other 4xx (401 for an expired token among them)
	OutcomeServerError = "server_error" // 5xx
	OutcomeError       = "error"        // no answer: refused, reset, timed out
)

var requestOutcomes = []string{OutcomeSuccess, OutcomeNotFound, OutcomeThrottled, OutcomeClientError, OutcomeServerError, OutcomeError}

// RequestMetrics counts and times a provider's HTTP requests to its metadata service.
type RequestMetrics struct {
	provider string
	total    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewRequestMetrics registers reprieve_metadata_requests_total and
// reprieve_metadata_request_duration_seconds on reg, with every outcome at zero.
func NewRequestMetrics(reg prometheus.Registerer, provider string) (*RequestMetrics, error) {
	m := &RequestMetrics{
		provider: provider,
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "metadata", Name: "requests_total",
			Help: "HTTP requests to the cloud's metadata service, by provider and outcome.",
		}, []string{"provider", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "reprieve", Subsystem: "metadata", Name: "request_duration_seconds",
			Help:    "Latency of HTTP requests to the cloud's metadata service.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}, []string{"provider"}),
	}
	for _, o := range requestOutcomes {
		m.total.WithLabelValues(provider, o)
	}
	for _, c := range []prometheus.Collector{m.total, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Wrap returns next (http.DefaultTransport when nil) instrumented with m.
func (m *RequestMetrics) Wrap(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := next.RoundTrip(req)
		m.duration.WithLabelValues(m.provider).Observe(time.Since(start).Seconds())
		m.total.WithLabelValues(m.provider, outcome(resp, err)).Inc()
		return resp, err
	})
}

func outcome(resp *http.Response, err error) string {
	switch {
	case err != nil:
		return OutcomeError
	case resp.StatusCode < 300:
		return OutcomeSuccess
	case resp.StatusCode == http.StatusNotFound:
		return OutcomeNotFound
	case resp.StatusCode == http.StatusTooManyRequests:
		return OutcomeThrottled
	case resp.StatusCode < 500:
		return OutcomeClientError
	default:
		return OutcomeServerError
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
