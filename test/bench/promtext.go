package main

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// sample is one sample of the Prometheus text format, as a line of it reads: a histogram's
// buckets are name_bucket with an le label, its sum and count name_sum and name_count.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// parseMetrics reads the Prometheus text format (prometheus/common's expfmt parser) into
// samples: counters, gauges, untyped, and histograms and summaries by their series.
func parseMetrics(text string) ([]sample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing the Prometheus text format: %w", err)
	}
	var out []sample
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := func(extra ...string) map[string]string {
				l := make(map[string]string, len(m.GetLabel())+1)
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				for i := 0; i+1 < len(extra); i += 2 {
					l[extra[i]] = extra[i+1]
				}
				return l
			}
			add := func(suffix string, v float64, extra ...string) {
				out = append(out, sample{Name: name + suffix, Labels: labels(extra...), Value: v})
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add("", m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add("", m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add("_bucket", float64(b.GetCumulativeCount()), "le", model.FloatString(b.GetUpperBound()).String())
				}
				add("_sum", h.GetSampleSum())
				add("_count", float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add("", q.GetValue(), "quantile", model.FloatString(q.GetQuantile()).String())
				}
				add("_sum", s.GetSampleSum())
				add("_count", float64(s.GetSampleCount()))
			default:
				add("", m.GetUntyped().GetValue())
			}
		}
	}
	return out, nil
}

// sum adds the values of every sample named name whose labels match all of match (a value
// starting with "!" must differ).
func sum(samples []sample, name string, match map[string]string) float64 {
	total := 0.0
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if neg, isNeg := strings.CutPrefix(v, "!"); isNeg {
				ok = ok && s.Labels[k] != neg
			} else {
				ok = ok && s.Labels[k] == v
			}
		}
		if ok {
			total += s.Value
		}
	}
	return total
}
