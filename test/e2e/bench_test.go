package e2e

import "strings"

// The benchmarks moved to the benchmark program test/bench (make bench), which measures the
// eviction burst that BenchmarkEvictionBurst measured here, with the drain comparison, deadline
// compliance, reaction time, footprint and fleet scale.

// grep returns the lines of text that start with prefix (metric families in test messages).
func grep(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
