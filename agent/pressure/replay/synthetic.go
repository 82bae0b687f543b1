package replay

import (
	"math/rand/v2"
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// Synthetic returns the series the real node cannot make cheaply, each labelled by
// KubeletEvictions: a 64 GiB node, an hour or three of reading noise, the cases of issue 47 as
// the Summary API would report them, and a disk that images fill while the kubelet's image
// garbage collection runs. Each is generated from a fixed seed: the same every time.
func Synthetic() ([]*Series, error) {
	var out []*Series
	for _, gen := range synthetic {
		s := gen()
		s.Origin = "synthetic"
		if s.IntervalMs == 0 {
			s.IntervalMs = 1000
		}
		ev, err := KubeletEvictions(s)
		if err != nil {
			return nil, err
		}
		s.KubeletEvictions = ev
		if err := s.Validate(); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// issuePods are issue 47's three pods on a 64 GiB node: graces of 120 s, 30 s and 10 s, no
// requests (each above it: ranked by usage), using 8, 6 and 4 GiB.
func issuePods() ([]Pod, map[string]int64) {
	return []Pod{{Name: "batch", Grace: 120}, {Name: "web", Grace: 30}, {Name: "cache", Grace: 10}},
		map[string]int64{"batch": 8 * gib, "web": 6 * gib, "cache": 4 * gib}
}

// memorySeries builds a memory series: each second for length, usage(t) gives each pod's
// working set and extra(t) what else the node uses beyond the pods and a base; the node's
// memory.available is capacity less the pods' usage, less extra, less base, plus noise drawn
// uniformly within ±jitter.
type memorySeries struct {
	name, desc, kubelet string
	capacity            int64
	// base is what the node uses outside the pods, set so that available starts at start.
	start  int64
	length time.Duration
	jitter int64
	pods   []Pod
	usage  func(t time.Duration) map[string]int64
	seed   uint64
}

func (m memorySeries) build() *Series {
	rng := rand.New(rand.NewPCG(m.seed, 47))
	s := &Series{Name: m.name, Description: m.desc, Kubelet: m.kubelet, Source: "summary", IntervalMs: 1000, Pods: m.pods}
	var base int64
	for i := 0; time.Duration(i)*time.Second <= m.length; i++ {
		t := time.Duration(i) * time.Second
		u := m.usage(t)
		var sum int64
		for _, v := range u {
			sum += v
		}
		if i == 0 {
			base = m.capacity - sum - m.start
		}
		noise := int64(0)
		if m.jitter > 0 {
			noise = rng.Int64N(2*m.jitter+1) - m.jitter
		}
		avail := max(m.capacity-base-sum+noise, 0)
		pods := map[string]Usage{}
		for name, v := range u {
			pods[name] = Usage{Memory: v, Processes: 3}
		}
		s.Readings = append(s.Readings, Reading{AtMs: t.Milliseconds(), Node: map[kubelet.Signal][2]int64{kubelet.MemoryAvailable: {avail, m.capacity}}, Pods: pods})
	}
	return s
}

const hard1Gi = "evictionHard:\n  memory.available: 1Gi\n"

var synthetic = []func() *Series{
	// Issue 47, point 1: jitter. 1.5 GiB above the kubelet's 1Gi on a 64 GiB node (under
	// reprieve's derived 1Gi + 5%), ±10 MiB of reading noise, for an hour.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-jitter-64g-1h", desc: "64 GiB node 1.5 GiB above the kubelet's memory.available<1Gi, flat with ±10 MiB of reading noise, for an hour",
			kubelet: hard1Gi, capacity: 64 * gib, start: 2560 * mib, length: time.Hour, jitter: 10 * mib, pods: pods,
			usage: func(time.Duration) map[string]int64 { return use }, seed: 1}.build()
	},
	// Hours of noise on a smaller node: 16 GiB, the kubelet's default 100Mi, 600 MiB above it
	// (under reprieve's derived 100Mi + 5%) with ±10 MiB of noise, for three hours; pods of
	// 30 s, 10 s and 3 s.
	func() *Series {
		pods := []Pod{{Name: "api", Grace: 30}, {Name: "worker", Grace: 10}, {Name: "agent", Grace: 3, DaemonSet: true}}
		use := map[string]int64{"api": 6 * gib, "worker": 4 * gib, "agent": 200 * mib}
		return memorySeries{name: "synthetic-noise-16g-3h", desc: "16 GiB node 600 MiB above the kubelet's default memory.available<100Mi, ±10 MiB of reading noise, three hours",
			kubelet: "", capacity: 16 * gib, start: 700 * mib, length: 3 * time.Hour, jitter: 10 * mib, pods: pods,
			usage: func(time.Duration) map[string]int64 { return use }, seed: 2}.build()
	},
	// Point 2: a step kept. web takes 800 MiB at once two minutes in (a JVM's heap, a model
	// loaded) and keeps it, leaving 1.8 GiB: 0.8 GiB above the kubelet's threshold.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-step-64g", desc: "64 GiB node at 2.6 GiB; web takes 800 MiB at once at 2 min and keeps it, leaving 1.8 GiB (0.8 GiB above memory.available<1Gi); ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 2662 * mib, length: 10 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= 2*time.Minute {
					u["web"] += 800 * mib
				}
				return u
			}, seed: 3}.build()
	},
	// Point 3: a garbage collector's sawtooth. web's heap grows 50 MiB/s for 20 s, from 1.5 GiB
	// above the kubelet's threshold to 0.5 GiB above it, then the collector frees it at once;
	// a minute flat first, twenty minutes in all.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-sawtooth-64g", desc: "64 GiB node; web's heap grows 50 MiB/s for 20 s from 1.5 GiB to 0.5 GiB above memory.available<1Gi, then its collector frees it; after a minute flat, for 20 minutes; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 2560 * mib, length: 20 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= time.Minute {
					into := (t - time.Minute) % (21 * time.Second)
					u["web"] += min(int64(into/time.Second), 20) * 50 * mib
				}
				return u
			}, seed: 4}.build()
	},
	// A burst of page cache: cache reads a 2 GiB file twice (its pages active: the kubelet
	// counts them as used) at 400 MiB/s, from 3.5 GiB above the threshold to 1.5 GiB above,
	// holds it two minutes, then drops it; every five minutes for twenty.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-pagecache-64g", desc: "64 GiB node; cache fills 2 GiB of active page cache at 400 MiB/s (3.5 GiB to 1.5 GiB above memory.available<1Gi), holds it 2 min, drops it; every 5 min; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 4608 * mib, length: 20 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				into := t % (5 * time.Minute)
				switch {
				case into < 30*time.Second:
				case into < 35*time.Second:
					u["cache"] += int64((into-30*time.Second)/time.Second+1) * 400 * mib
				case into < 155*time.Second:
					u["cache"] += 2 * gib
				}
				return u
			}, seed: 5}.build()
	},
	// Falling: batch leaks 50 MiB/s from 8 GiB above the kubelet's threshold: the kubelet
	// evicts it at its threshold; reprieve must first, with its whole 120 s.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-leak-64g", desc: "64 GiB node; batch (120 s) leaks 50 MiB/s from 8 GiB above memory.available<1Gi; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 9 * gib, length: 4 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= 20*time.Second {
					u["batch"] += int64((t-20*time.Second)/time.Second) * 50 * mib
				}
				return u
			}, seed: 6}.build()
	},
	// Falling, slower: batch leaks 20 MiB/s from 6 GiB above the kubelet's threshold, so that
	// its 120 s fit after reprieve's derived threshold (1Gi + 5%: 3.2 GiB above) is crossed.
	func() *Series {
		pods, use := issuePods()
		return memorySeries{name: "synthetic-slow-leak-64g", desc: "64 GiB node; batch (120 s) leaks 20 MiB/s from 6 GiB above memory.available<1Gi; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 7 * gib, length: 6 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= 20*time.Second {
					u["batch"] += int64((t-20*time.Second)/time.Second) * 20 * mib
				}
				return u
			}, seed: 11}.build()
	},
	// Falling: a leak that starts after a step. cache (5 GiB) takes 800 MiB at once, then 30 s
	// later starts leaking 30 MiB/s.
	func() *Series {
		pods, use := issuePods()
		use["cache"] = 5 * gib
		return memorySeries{name: "synthetic-step-then-leak-64g", desc: "64 GiB node at 4 GiB above memory.available<1Gi; cache (10 s, 5 GiB) takes 800 MiB at once at 60 s, then leaks 30 MiB/s from 90 s; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 5 * gib, length: 5 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= time.Minute {
					u["cache"] += 800 * mib
				}
				if t >= 90*time.Second {
					u["cache"] += int64((t-90*time.Second)/time.Second) * 30 * mib
				}
				return u
			}, seed: 7}.build()
	},
	// Falling, point 4: two pods, one leaking, one large and steady. leak (30 s) grows 50 MiB/s
	// from 2 GiB; big (30 s) holds 7 GiB. Where the kubelet's threshold is met, leak uses more
	// than big, and the kubelet evicts it alone; ranked on the usage of earlier, big would go.
	func() *Series {
		pods := []Pod{{Name: "leak", Grace: 30}, {Name: "big", Grace: 30}}
		return memorySeries{name: "synthetic-two-pods-64g", desc: "64 GiB node 6 GiB above memory.available<1Gi; leak (30 s) grows 50 MiB/s from 2 GiB, big (30 s) holds 7 GiB; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 7 * gib, length: 4 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				l := 2 * gib
				if t >= 10*time.Second {
					l += int64((t-10*time.Second)/time.Second) * 50 * mib
				}
				return map[string]int64{"leak": l, "big": 7 * gib}
			}, seed: 8}.build()
	},
	// Falling, the real node's shape on a 16 GiB node: a DaemonSet's pod (3 s) leaking
	// 50 MiB/s beside a web pod of a lower priority, from 900 MiB above the kubelet's 100Mi.
	func() *Series {
		pods := []Pod{{Name: "agent", Grace: 3, DaemonSet: true, Priority: 1000, MemoryRequest: "200Mi"}, {Name: "web", Grace: 30, MemoryRequest: "1Gi"}}
		return memorySeries{name: "synthetic-daemonset-leak-16g", desc: "16 GiB node 900 MiB above memory.available<100Mi; a DaemonSet's pod (3 s, priority 1000, 200Mi requested) leaks 50 MiB/s beside web (30 s, within its 1Gi); ±10 MiB of noise",
			kubelet: "", capacity: 16 * gib, start: 1000 * mib, length: 2 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				a := 100 * mib
				if t >= 10*time.Second {
					a += int64((t-10*time.Second)/time.Second) * 50 * mib
				}
				return map[string]int64{"agent": a, "web": 700 * mib}
			}, seed: 9}.build()
	},
	// Falling faster and faster: web's leak grows by 3 MiB/s every second (a cache that
	// doubles its batches), from 1.4 GiB above the kubelet's default 100Mi on a 16 GiB node. Its
	// 30 s cannot fit after reprieve's threshold (5% of 16 GiB above the kubelet's), so it waits
	// for the last reading that leaves it 3 s; the estimate, steepening with the fall, moves by
	// more than a reading between two and steps over that reading (9.4 s to 7.9 s from the
	// threshold a second later). Before, web was left to the kubelet; held for that reading, it
	// goes at the next with 2 s (issue 47, the real node's missed window).
	func() *Series {
		pods := []Pod{{Name: "web", Grace: 30}, {Name: "quiet", Grace: 30}}
		return memorySeries{name: "synthetic-accelerating-leak-16g", desc: "16 GiB node 1.4 GiB above memory.available<100Mi; web (30 s) leaks faster by 3 MiB/s every second from 10 s, beside quiet (30 s, 1 GiB); ±10 MiB of noise",
			kubelet: "", capacity: 16 * gib, start: 1500 * mib, length: 2 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				w := 2 * gib
				if t >= 10*time.Second {
					s := int64((t - 10*time.Second) / time.Second)
					w += 3 * s * s * mib / 2
				}
				return map[string]int64{"web": w, "quiet": gib}
			}, seed: 23}.build()
	},
	// A sawtooth whose troughs another pod moves: jvm's heap grows 50 MiB/s for 20 s and is
	// freed, its troughs 1.2 GiB above the kubelet's threshold, until model takes 800 MiB at once
	// two minutes in: from then on the troughs are 400 MiB above it, below every trough the node
	// saw. jvm's own peaks still bound its growth, and the kubelet never evicts.
	func() *Series {
		pods := []Pod{{Name: "jvm", Grace: 120}, {Name: "model", Grace: 30}}
		return memorySeries{name: "synthetic-sawtooth-moved-64g", desc: "64 GiB node; jvm's heap grows 50 MiB/s for 20 s and is freed, troughs 1.2 GiB above memory.available<1Gi, until model takes 800 MiB at once at 2 min: troughs 400 MiB above; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: gib + 2200*mib, length: 10 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := map[string]int64{"jvm": 4 * gib, "model": 2 * gib}
				u["jvm"] += min(int64(t/time.Second)%21, 20) * 50 * mib
				if t >= 2*time.Minute {
					u["model"] += 800 * mib
				}
				return u
			}, seed: 13}.build()
	},
	// Falling: a pod that dropped 1 GiB (a batch ended) then leaks past where it was: its own
	// peak no longer bounds it. cache (10 s) at 7 GiB frees 1 GiB at 60 s, leaks 30 MiB/s from
	// 90 s.
	func() *Series {
		pods, use := issuePods()
		use["cache"] = 7 * gib
		return memorySeries{name: "synthetic-drop-then-leak-64g", desc: "64 GiB node at 3 GiB above memory.available<1Gi; cache (10 s, 7 GiB) frees 1 GiB at 60 s, then leaks 30 MiB/s from 90 s past its old peak; ±10 MiB of noise",
			kubelet: hard1Gi, capacity: 64 * gib, start: 4 * gib, length: 5 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := copyUsage(use)
				if t >= time.Minute {
					u["cache"] -= gib
				}
				if t >= 90*time.Second {
					u["cache"] += int64((t-90*time.Second)/time.Second) * 30 * mib
				}
				return u
			}, seed: 14}.build()
	},
	// The real node's healthy soak on paper: a 24 GiB node, its workloads at once (a step of
	// 800 MiB kept, a sawtooth to 1000 MiB at 50 MiB/s, 1500 MiB of page cache filled at
	// 300 MiB/s, held a minute and dropped every three, 600 ± 60 MiB of jitter), together within
	// 700 MiB of the kubelet's threshold at their peaks and under reprieve's (5% of 24 GiB above
	// it) for most of the time: the sawtooth's troughs move with the others, and only its own
	// peaks bound it.
	func() *Series {
		pods := []Pod{{Name: "quiet", Grace: 3, MemoryRequest: "64Mi"}, {Name: "model", Grace: 30}, {Name: "jvm", Grace: 120},
			{Name: "reader", Grace: 10, EmptyDir: true}, {Name: "cache", Grace: 30}}
		rng := rand.New(rand.NewPCG(12, 47))
		jitter := int64(600) * mib
		return memorySeries{name: "synthetic-mixed-24g", desc: "24 GiB node, the soak's workloads at once: a kept step, a sawtooth, page cache filled and dropped, jitter; 700 MiB above memory.available<1Gi at their peaks",
			kubelet: hard1Gi, capacity: 24 * gib, start: gib + 3760*mib, length: 15 * time.Minute, jitter: 10 * mib, pods: pods,
			usage: func(t time.Duration) map[string]int64 {
				u := map[string]int64{"quiet": 10 * mib, "model": 20 * mib, "jvm": 50 * mib, "reader": 10 * mib, "cache": jitter}
				if t >= time.Minute {
					u["model"] += 800 * mib
				}
				into := int64(t/time.Second) % 21
				u["jvm"] += min(into, 20) * 50 * mib
				switch p := t % (3 * time.Minute); {
				case p < 5*time.Second:
					u["reader"] += int64(p/time.Second+1) * 300 * mib
				case p < 65*time.Second:
					u["reader"] += 1500 * mib
				}
				jitter = max(540*mib, min(660*mib, jitter+rng.Int64N(121*mib)-60*mib))
				return u
			}, seed: 12}.build()
	},
	imageGC(false),
	imageGC(true),
}

func copyUsage(u map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(u))
	for k, v := range u {
		out[k] = v
	}
	return out
}

// imageGC is a disk that image pulls fill, with the kubelet's image garbage collection on (its
// defaults, 85% and 80%, every 5 minutes: realImageGCManager.GarbageCollect) and its eviction
// manager's reclaim at its hard threshold (every 10 s: reclaimNodeLevelResources deletes every
// unused image). A 100 GiB filesystem, shared by nodefs and imagefs (dedicated false: the
// kubelet's defaults nodefs.available<10%, imagefs.available<15% both measure it) or a 50 GiB
// imagefs of its own beside a steady nodefs. 6 GiB of images are in use; a pull of 0.5 to 2 GiB
// comes every 20 to 60 s, at 100 MiB/s, and is never used (a CI node's cache of images). The
// pods' own disk use is steady. The Summary API's imageFs.usedBytes is the images' bytes.
func imageGC(dedicated bool) func() *Series {
	return func() *Series {
		name, desc := "synthetic-imagegc-shared-100g", "100 GiB root filesystem shared by nodefs and imagefs"
		capacity := 100 * gib
		if dedicated {
			name, desc, capacity = "synthetic-imagegc-dedicated-50g", "50 GiB imagefs of its own beside a 100 GiB nodefs", 50*gib
		}
		rng := rand.New(rand.NewPCG(10, 47))
		s := &Series{Name: name, Source: "summary", IntervalMs: 1000, DedicatedImageFs: dedicated,
			Description: desc + ": image pulls of 0.5-2 GiB every 20-60 s fill it past 85%, the kubelet's image GC (85%/80%, every 5 min) and its reclaim at imagefs.available<15% free it; 40 minutes",
			Pods:        []Pod{{Name: "web", Grace: 30}, {Name: "batch", Grace: 60}}}
		inUse, other := 6*gib, capacity*55/100 // images in use; everything else on the filesystem (pods' data, logs, the OS)
		if dedicated {
			other = capacity * 40 / 100
		}
		unused := capacity * 20 / 100 // pulled, not in use
		var pulling, nextPull int64 = 0, 20
		for i := int64(0); i <= 40*60; i++ {
			t := time.Duration(i) * time.Second
			if i == nextPull {
				pulling = (512 + rng.Int64N(1537)) * mib
				nextPull = i + 20 + rng.Int64N(41)
			}
			if pulling > 0 {
				step := min(pulling, 100*mib)
				unused += step
				pulling -= step
			}
			used := inUse + unused + other
			// The eviction manager: imagefs.available below 15% at its 10 s pass deletes every
			// unused image; the image GC every 5 minutes frees down to 80% from 85%.
			if i%10 == 0 && capacity-used < capacity*15/100 {
				unused = 0
			}
			if i%300 == 0 && used*100/capacity >= 85 {
				free := used - capacity*80/100
				unused = max(unused-free, 0)
			}
			used = inUse + unused + other
			avail := capacity - used
			r := Reading{AtMs: t.Milliseconds(), ImageFsUsed: inUse + unused, Node: map[kubelet.Signal][2]int64{
				kubelet.ImageFsAvailable: {avail, capacity},
			}, Pods: map[string]Usage{"web": {Memory: gib, Rootfs: 200 * mib, Local: 2 * gib}, "batch": {Memory: gib, Rootfs: 100 * mib, Local: 3 * gib}}}
			if dedicated {
				r.Node[kubelet.NodeFsAvailable] = [2]int64{60 * gib, 100 * gib}
			} else {
				r.Node[kubelet.NodeFsAvailable] = [2]int64{avail, capacity}
			}
			s.Readings = append(s.Readings, r)
		}
		return s
	}
}
