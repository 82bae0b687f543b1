package pressure

import (
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Thresholds are what the levels are computed from: reprieve's thresholds, either given
// (Explicit, in the kubelet's syntax) or derived from the kubelet's hard ones plus Headroom,
// and the kubelet's hard thresholds and minimum reclaims.
type Thresholds struct {
	// Explicit are reprieve's own thresholds (--pressure-thresholds); when set, only these
	// signals are watched.
	Explicit []kubelet.Threshold
	// Headroom is the share of capacity added to the kubelet's hard threshold (0 where it has
	// none) to give reprieve's threshold for every signal, when Explicit is empty.
	Headroom float64
	// Hard are the kubelet's hard eviction thresholds: what reprieve must act before.
	Hard []kubelet.Threshold
	// Soft are the kubelet's soft thresholds: a derived threshold starts above them too, so
	// that reprieve taints before the kubelet's soft eviction begins.
	Soft []kubelet.Threshold
	// SoftGrace is each soft threshold's evictionSoftGracePeriod: how long it must hold before
	// the kubelet evicts for it.
	SoftGrace map[kubelet.Signal]time.Duration
	// MinReclaim is how far above its threshold a signal must come back to end the pressure.
	MinReclaim map[kubelet.Signal]kubelet.Threshold
}

func find(ts []kubelet.Threshold, s kubelet.Signal) (kubelet.Threshold, bool) {
	for _, t := range ts {
		if t.Signal == s {
			return t, true
		}
	}
	return kubelet.Threshold{}, false
}

// Levels returns the level of every watched signal that obs holds, in kubelet.Signals order. A
// derived threshold is the larger of the kubelet's hard and soft thresholds plus the headroom.
func (t Thresholds) Levels(obs kubelet.Observations) []Level {
	var out []Level
	for _, s := range kubelet.Signals {
		o, ok := obs[s]
		if !ok {
			continue
		}
		l := Level{Signal: s, Available: o.Available, Capacity: o.Capacity, At: o.Time}
		if h, ok := find(t.Hard, s); ok {
			l.Hard = h.Value(o.Capacity)
		}
		if len(t.Explicit) > 0 {
			e, ok := find(t.Explicit, s)
			if !ok {
				continue
			}
			l.Threshold = e.Value(o.Capacity)
		} else {
			base := l.Hard
			if soft, ok := find(t.Soft, s); ok {
				base = max(base, soft.Value(o.Capacity))
			}
			l.Threshold = satAdd(base, int64(t.Headroom*float64(o.Capacity)))
		}
		if m, ok := t.MinReclaim[s]; ok {
			l.MinReclaim = m.Value(o.Capacity)
		}
		if soft, ok := find(t.Soft, s); ok {
			l.HasSoft, l.Soft, l.SoftGrace = true, soft.Value(o.Capacity), t.SoftGrace[s]
		}
		out = append(out, l)
	}
	return out
}
