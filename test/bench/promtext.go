package main

import (
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text format.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// parseMetrics reads the Prometheus text format: enough for counters, gauges and histogram
// buckets (comments and malformed lines are skipped).
func parseMetrics(text string) []sample {
	var out []sample
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i < 0 {
			continue
		} else if line[i] == '{' {
			s.Name = line[:i]
			end := strings.LastIndex(line, "}")
			if end < i {
				continue
			}
			parseLabels(line[i+1:end], s.Labels)
			rest = line[end+1:]
		} else {
			s.Name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.Value = v
		out = append(out, s)
	}
	return out
}

func parseLabels(s string, into map[string]string) {
	for s != "" {
		eq := strings.Index(s, "=\"")
		if eq < 0 {
			return
		}
		key := strings.TrimSpace(strings.TrimLeft(s[:eq], ","))
		s = s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(s); i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if s[i] == '"' {
				break
			}
			val.WriteByte(s[i])
		}
		into[key] = val.String()
		if i >= len(s) {
			return
		}
		s = s[i+1:]
	}
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
