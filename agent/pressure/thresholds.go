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
	// ImageGC says the kubelet's image garbage collection runs, from ImageGCHigh of the image
	// filesystem used down to ImageGCLow (kubelet.Config.ImageGC).
	ImageGC                 bool
	ImageGCLow, ImageGCHigh float64
}

// ThresholdsFrom is what the levels are computed from, given the kubelet's configuration kc and
// reprieve's flags: its explicit thresholds (none: derived with headroom) and minimum reclaims
// (nil: the kubelet's). The kubelet's hard thresholds are those its eviction manager holds: its
// evictionHard, and the allocatableMemory.available copies of the memory ones
// (kubelet.Config.EvictionHard).
func ThresholdsFrom(kc kubelet.Config, explicit []kubelet.Threshold, headroom float64, reclaim map[kubelet.Signal]kubelet.Threshold) Thresholds {
	hard, kubeletReclaim := kc.EvictionHard()
	if reclaim == nil {
		reclaim = kubeletReclaim
	}
	t := Thresholds{Explicit: explicit, Headroom: headroom, Hard: hard, Soft: kc.Soft, SoftGrace: kc.SoftGracePeriod,
		MinReclaim: reclaim}
	t.ImageGCLow, t.ImageGCHigh, t.ImageGC = kc.ImageGC()
	return t
}

// imageGCSignal reports whether the kubelet's image garbage collection frees s's filesystem:
// imagefs.available, and nodefs.available when the images share nodefs.
func imageGCSignal(s kubelet.Signal, dedicatedImageFs bool) bool {
	return s == kubelet.ImageFsAvailable || s == kubelet.NodeFsAvailable && !dedicatedImageFs
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
// derived threshold is the larger of the kubelet's hard and soft thresholds plus the headroom,
// except on a filesystem the kubelet's image garbage collection frees (imageGCSignal): there it
// never lies inside the collection's band, where the kubelet deletes images every 5 minutes
// without any pressure (from ImageGCHigh used down to ImageGCLow; a node whose images fill its
// disk lives there). It is then halfway from the kubelet's threshold to where the collection
// starts, or, when the kubelet's threshold is already there (imagefs.available<15% against
// 85%: the defaults), the kubelet's own: where the kubelet reports DiskPressure, and deletes
// unused images before it evicts.
func (t Thresholds) Levels(obs kubelet.Observations) []Level {
	dedicated := kubelet.DedicatedImageFs(obs)
	var out []Level
	for _, s := range kubelet.Signals {
		o, ok := obs[s]
		if !ok {
			continue
		}
		l := Level{Signal: s, Available: o.Available, Capacity: o.Capacity, At: o.Time, Reclaimable: o.Reclaimable}
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
			if edge := int64((1 - t.ImageGCHigh) * float64(o.Capacity)); t.ImageGC && imageGCSignal(s, dedicated) && l.Threshold >= edge {
				// Above the band's edge (in what is available): halfway down to the kubelet's,
				// or one unit above it, so that reprieve's is still above the kubelet's.
				l.Threshold = max(base+(edge-base)/2, satAdd(base, 1))
			}
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
