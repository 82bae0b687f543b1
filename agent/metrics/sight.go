package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sight exports, at each scrape, whether the agent is Ready and what it sees of the cloud:
// each metadata source's last good answer and how many are stale (docs/operations.md,
// "Readiness"). Its functions are the agent's; nil ones export nothing.
type Sight struct {
	Provider string
	// Ready says whether the agent is Ready.
	Ready func() bool
	// LastAnswers says when each source last answered (zero: not since start); Stale how many
	// sources are past the bound. Both nil with --provider none.
	LastAnswers func() map[string]time.Time
	Stale       func() int

	ready, lastAnswer, stale *prometheus.Desc
}

// NewSight returns the collector; register it with the agent's other collectors.
func NewSight(s Sight) *Sight {
	s.ready = prometheus.NewDesc(Namespace+"_ready",
		"1 while the agent is Ready (its caches synced and every metadata source answered within --metadata-stale-after), else 0.", nil, nil)
	s.lastAnswer = prometheus.NewDesc(Namespace+"_metadata_last_answer_timestamp_seconds",
		"When each metadata source last gave a good answer, as a Unix timestamp; 0 when it has not since the agent started.",
		[]string{"provider", "source"}, nil)
	s.stale = prometheus.NewDesc(Namespace+"_metadata_sources_stale",
		"How many metadata sources have given no good answer within --metadata-stale-after (or none since start): above 0 the agent cannot see the cloud's notices.",
		[]string{"provider"}, nil)
	return &s
}

// Describe implements prometheus.Collector.
func (s *Sight) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.ready
	ch <- s.lastAnswer
	ch <- s.stale
}

// Collect implements prometheus.Collector.
func (s *Sight) Collect(ch chan<- prometheus.Metric) {
	if s.Ready != nil {
		v := 0.0
		if s.Ready() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(s.ready, prometheus.GaugeValue, v)
	}
	if s.LastAnswers != nil {
		for src, t := range s.LastAnswers() {
			v := 0.0
			if !t.IsZero() {
				v = float64(t.UnixNano()) / 1e9
			}
			ch <- prometheus.MustNewConstMetric(s.lastAnswer, prometheus.GaugeValue, v, s.Provider, src)
		}
	}
	if s.Stale != nil {
		ch <- prometheus.MustNewConstMetric(s.stale, prometheus.GaugeValue, float64(s.Stale()), s.Provider)
	}
}
