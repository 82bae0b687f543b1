package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// The real node's memory tests measure the host's memory.available against the kubelet's
// thresholds, and so does everything else on the machine: a build beside them (a cold `make
// demo` held 4 GiB and gave it back within seconds) moves the very signal they measure. On
// 2026-12-06 two of them failed that way while a fresh clone's `make demo` built beside `make
// test` (issue 52, test/README): the kubelet's threshold was placed while the build held
// gigabytes, and the build then gave memory back faster than the hog took it; and one reading's
// trend steepened fourfold with the build's allocations. So a memory run first waits for the
// memory outside the pods to hold still, and a run that failed while that memory moved is run
// again, up to maxAttempts in all. Its assertions are the same each time; the last failure is
// reported with the earlier ones.
const (
	// quietFor and quietRange: the machine is quiet when the memory outside the pods has moved
	// by less than quietRange over the last quietFor. A quiet node here (the control plane, the
	// kubelet, containerd and this test) moves it by tens of MiB; a Go build by hundreds in a
	// few seconds (375 MiB within 5 s while `make tools` built on 2026-12-06).
	quietFor   = 5 * time.Second
	quietRange = 128 << 20
	// quietAgainFor is how long the machine must have been quiet before a run that the
	// machine disturbed runs again: a build's allocations come in bursts, and on 2026-12-06
	// (14:11, test/README) a second attempt that found 5 s of quiet after 10 s had the build
	// move 660 MiB during it.
	quietAgainFor = 20 * time.Second
	// maxAttempts bounds the runs of one memory run: a run that failed while disturbed runs
	// again until one is not disturbed or this many have run. Only a disturbed failure runs
	// again, so on a quiet machine a broken agent fails the first attempt.
	maxAttempts = 3
	// firstQuietWait bounds the wait before a run, againQuietWait the one before it runs again:
	// long enough for a build's link steps to pass, short enough for the package's timeout.
	firstQuietWait = 30 * time.Second
	againQuietWait = 3 * time.Minute
	// disturbedRange: a run during which the memory outside the pods moved by more than this has
	// been moved by the machine's other work: the hog's 50 MiB a second crosses the thresholds
	// 600 and 900 MiB below where they were placed, so that a quarter of a gigabyte, taken or
	// given back, moves the crossings by seconds.
	disturbedRange = 256 << 20
	sampleEvery    = 250 * time.Millisecond
)

// outsideSample is the memory outside the pods at a moment, in bytes.
type outsideSample struct {
	at    time.Time
	bytes float64
}

// outsideMemory records, every sampleEvery for the whole package, the machine's working set
// outside the pods cgroup: MemTotal less memory.available, as the kubelet computes it, less the
// pods' working set. The hog's memory is inside the pods cgroup; what moves outside is the
// control plane, the node's daemons, this test, and whatever else runs on the machine.
type outsideMemory struct {
	mu      sync.Mutex
	samples []outsideSample
	err     error // the last failed reading
}

var (
	outsideOnce sync.Once
	outside     *outsideMemory
)

// machineMemory starts the recorder once and returns it.
func machineMemory() *outsideMemory {
	outsideOnce.Do(func() {
		outside = &outsideMemory{}
		go outside.record()
	})
	return outside
}

func (o *outsideMemory) record() {
	for {
		b, err := memoryOutsidePods()
		o.mu.Lock()
		o.err = err
		if err == nil {
			o.samples = append(o.samples, outsideSample{time.Now(), b})
		}
		o.mu.Unlock()
		time.Sleep(sampleEvery)
	}
}

// memoryOutsidePods is MemTotal less memory.available less the pods cgroup's working set, in
// bytes. The two are separate files read one after the other: a hog killed between them (2 GiB
// given back at once) once read as 1.9 GiB outside the pods for one reading. So the pods' working
// set is read before and after the host's, and a reading during which it moved by more than
// consistentWithin is taken again.
func memoryOutsidePods() (float64, error) {
	const consistentWithin = 16 << 20
	var lastMove int64
	for range 5 {
		_, before, err := podsCgroupUsage()
		if err != nil {
			return 0, fmt.Errorf("read the pods cgroup's working set: %w", err)
		}
		avail, err := hostMemoryAvailable()
		if err != nil {
			return 0, fmt.Errorf("read memory.available: %w", err)
		}
		total, after, err := podsCgroupUsage()
		if err != nil {
			return 0, fmt.Errorf("read the pods cgroup's working set: %w", err)
		}
		if lastMove = after - before; lastMove < consistentWithin && -lastMove < consistentWithin {
			return float64(total) - avail - float64(after+before)/2, nil
		}
	}
	return 0, fmt.Errorf("the pods cgroup's working set moved by %d MiB around each of five readings of memory.available", lastMove>>20)
}

// moved is the range (highest less lowest) of the memory outside the pods between from and to,
// and how many readings it rests on.
func (o *outsideMemory) moved(from, to time.Time) (float64, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lo, hi, n := 0.0, 0.0, 0
	for _, s := range o.samples {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		if n == 0 || s.bytes < lo {
			lo = s.bytes
		}
		if n == 0 || s.bytes > hi {
			hi = s.bytes
		}
		n++
	}
	return hi - lo, n
}

// failing says whether the last reading failed, lastErr why.
func (o *outsideMemory) failing() bool { return o.lastErr() != nil }

func (o *outsideMemory) lastErr() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// waitQuiet waits, up to bound, until the memory outside the pods has held within quietRange
// over the last over. It returns how long it waited and whether the machine was quiet; a
// machine that stays busy is not a failure by itself (the run's own assertions decide).
func (o *outsideMemory) waitQuiet(ctx context.Context, bound, over time.Duration) (time.Duration, bool) {
	begin := time.Now()
	for {
		now := time.Now()
		r, n := o.moved(now.Add(-over), now)
		if n >= int(over/sampleEvery)-2 && r < quietRange {
			return now.Sub(begin), true
		}
		if now.Sub(begin) >= bound || ctx.Err() != nil || (n == 0 && o.failing() && now.Sub(begin) > time.Second) {
			return now.Sub(begin), false
		}
		time.Sleep(sampleEvery)
	}
}

// verdict collects a run's failures instead of failing the test at once, so that a run the
// machine disturbed can be run again; everything else (Logf, Fatal, Helper) is the test's.
type verdict struct {
	*testing.T
	failures []string
	// from and to bound the part of the run that the machine's memory can spoil: from the
	// reading the thresholds are placed from to the end of the watch.
	from, to time.Time
}

func (v *verdict) Errorf(format string, args ...any) {
	v.Helper()
	msg := fmt.Sprintf(format, args...)
	v.Logf("failed: %s", msg)
	v.failures = append(v.failures, msg)
}

// waitFor polls cond every 100 ms until it holds, as the package's waitFor does, but a timeout
// is one of the run's failures, not the test's end: it returns false, and the failure names the
// node's taints then (what keeps a DaemonSet's pod off the node, or reprieve's own).
func (v *verdict) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) bool {
	v.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			taints := "unknown"
			if n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
				taints += fmt.Sprintf(" (reading the node: %v)", err)
			} else {
				taints = fmt.Sprint(n.Spec.Taints)
			}
			v.Errorf("timed out after %s waiting for %s; the node's taints then: %s", timeout, what, taints)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// noteRerun appends line to the file $REPRIEVE_REALNODE_RERUNS names, which make test prints
// after the package: go test shows a passing package's logs only with -v, and a run that passed
// the second time must not pass unseen.
func noteRerun(line string) {
	path := os.Getenv("REPRIEVE_REALNODE_RERUNS")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "realnode: recording a rerun in %s: %v\n", path, err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		fmt.Fprintf(os.Stderr, "realnode: recording a rerun in %s: %v\n", path, err)
	}
}

// runQuietly runs one pressure run after waiting for a quiet machine, and again (up to
// maxAttempts in all, each after a longer quiet) while it failed with the memory outside the
// pods moved by more than disturbedRange. Cases whose signal the rest of the machine does not
// move (a loop-mounted nodefs, the pods cgroup's own limit) run once, without the wait.
func runQuietly(ctx context.Context, t *testing.T, c pressureCase, name string, withReprieve bool) ([]pressureEvent, scenario.PressureRun) {
	t.Helper()
	if !c.hostMemory {
		v := &verdict{T: t}
		evs, run := pressureRun(ctx, v, c, name, withReprieve, 1)
		for _, f := range v.failures {
			t.Error(f)
		}
		return evs, run
	}
	mem := machineMemory()
	var earlier []string
	for attempt := 1; ; attempt++ {
		bound, over := firstQuietWait, quietFor
		if attempt > 1 {
			bound, over = againQuietWait, quietAgainFor
		}
		waited, quiet := mem.waitQuiet(ctx, bound, over)
		if mem.failing() {
			t.Logf("%s: the memory outside the pods cannot be read (%v): the run is not guarded against the machine's other work", name, mem.lastErr())
		}
		now := time.Now()
		r, _ := mem.moved(now.Add(-over), now)
		t.Logf("%s, attempt %d: waited %s for a quiet machine (quiet: %v; the memory outside the pods moved %.0f MiB over the last %s, quiet under %d MiB)",
			name, attempt, waited.Round(100*time.Millisecond), quiet, r/(1<<20), over, quietRange>>20)
		v := &verdict{T: t}
		evs, run := pressureRun(ctx, v, c, name, withReprieve, attempt)
		movedBy, n := mem.moved(v.from, v.to)
		t.Logf("%s, attempt %d: the memory outside the pods moved %.0f MiB during the run (%d readings; disturbed over %d MiB)",
			name, attempt, movedBy/(1<<20), n, disturbedRange>>20)
		if len(v.failures) > 0 && movedBy > disturbedRange && attempt < maxAttempts {
			t.Logf("%s: failed while the machine's other work moved its memory by %.0f MiB; running it again. Its failures: %s",
				name, movedBy/(1<<20), strings.Join(v.failures, "; "))
			earlier = append(earlier, fmt.Sprintf("attempt %d (moved %.0f MiB): %s", attempt, movedBy/(1<<20), strings.Join(v.failures, "; ")))
			noteRerun(fmt.Sprintf("%s %s: ran again: the memory outside the pods moved %.0f MiB during its attempt %d, which failed: %s",
				t.Name(), name, movedBy/(1<<20), attempt, strings.Join(v.failures, "; ")))
			continue
		}
		for _, f := range v.failures {
			if earlier != nil {
				f += fmt.Sprintf(" (attempt %d; the memory outside the pods moved %.0f MiB during it; earlier: %s)",
					attempt, movedBy/(1<<20), strings.Join(earlier, "; "))
			}
			t.Error(f)
		}
		return evs, run
	}
}

// noteRerun appends: two memory runs that ran again are two lines for make test to print.
func TestNoteRerunAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reruns.txt")
	t.Setenv("REPRIEVE_REALNODE_RERUNS", path)
	noteRerun("first")
	noteRerun("second")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != "first\nsecond\n" {
		t.Errorf("the reruns file holds %q, want both lines in order", got)
	}
}

// A wait that times out is a failure of the run, which runQuietly can run again, and it names the
// node's taints; one whose condition holds records nothing.
func TestVerdictWaitForNamesTheTaints(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ctx := context.Background()
	const key = "reprieve.test/verdict-wait"
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: key, Effect: v1.TaintEffectPreferNoSchedule})
	if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clearPressureTaint(context.Background(), t, key) })

	v := &verdict{T: t}
	if !v.waitFor(ctx, time.Second, "a condition that holds", func() bool { return true }) || len(v.failures) != 0 {
		t.Errorf("a condition that holds: failures %q, want none", v.failures)
	}
	if v.waitFor(ctx, 0, "a condition that never holds", func() bool { return false }) {
		t.Fatal("a condition that never holds: waitFor returned true")
	}
	if len(v.failures) != 1 || !strings.Contains(v.failures[0], "a condition that never holds") || !strings.Contains(v.failures[0], key) {
		t.Errorf("the run's failures %q, want one that names the wait and the taint %s", v.failures, key)
	}
}
