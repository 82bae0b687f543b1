package plan

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// runtimeStop is what the container runtime may take past a stop's own timeout (the SIGKILL and
// the runtime's bookkeeping): the model below adds it to every container's stop.
const runtimeStop = 10 * time.Millisecond

// kubeletStop is the latest the kubelet may take, from when it handles a delete with grace
// asked (whole seconds, at least 2: the grace reprieve asks), to when the last container of pod
// has stopped, as killContainersWithSyncResult, killContainer and executePreStopHook
// (pkg/kubelet/kuberuntime/kuberuntime_container.go, v1.37.2) and terminationOrdering.waitForTurn
// (kuberuntime_termination_order.go) stop it:
//
//   - every container is killed at once, on its own goroutine, with the same grace;
//   - a preStop hook runs within that grace (at most all of it), and the whole seconds it took,
//     rounded down, come off the grace;
//   - a native sidecar (a restartable init container) then waits for its turn: for every regular
//     container and for the next sidecar in spec order to have stopped, at most what is left of
//     its grace; the whole seconds it waited, rounded down, come off the grace;
//   - what is left below minimumGracePeriodInSeconds (2) is raised to 2 s, and the container may
//     use all of it (it ignores SIGTERM), plus the runtime's own stop (runtimeStop).
//
// The hooks may take any time up to the grace: the latest end over whole seconds and points
// just past and just before them, where rounding down gains or loses the most.
func kubeletStop(pod *v1.Pod, asked time.Duration) time.Duration {
	g := int64(asked / time.Second)
	var hooked []*time.Duration // one per container with a preStop hook: the time it takes
	type stage struct {
		hook *time.Duration
	}
	regular := make([]stage, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			regular[i].hook = new(time.Duration)
			hooked = append(hooked, regular[i].hook)
		}
	}
	var sidecars []stage // in spec order
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways {
			continue // a regular init container has ended before the pod ran
		}
		s := stage{}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			s.hook = new(time.Duration)
			hooked = append(hooked, s.hook)
		}
		sidecars = append(sidecars, s)
	}
	var candidates []time.Duration
	for k := int64(0); k <= g; k++ {
		for _, d := range []time.Duration{0, 5 * time.Millisecond, 500 * time.Millisecond, 995 * time.Millisecond} {
			if at := time.Duration(k)*time.Second + d; at <= asked {
				candidates = append(candidates, at)
			}
		}
	}
	secs := func(d time.Duration) int64 { return int64(d.Seconds()) } // int64(x.Seconds()): rounded down
	stopped := func(start time.Duration, grace int64) time.Duration {
		return start + time.Duration(max(grace, 2))*time.Second + runtimeStop
	}
	worst := time.Duration(0)
	var try func(i int)
	try = func(i int) {
		if i < len(hooked) {
			for _, c := range candidates {
				*hooked[i] = c
				try(i + 1)
			}
			return
		}
		var mains time.Duration // when the last regular container has stopped
		for _, r := range regular {
			start, grace := time.Duration(0), g
			if r.hook != nil {
				start, grace = *r.hook, g-secs(*r.hook)
			}
			mains = max(mains, stopped(start, grace))
		}
		end := mains
		next := mains // the later sidecars wait for the regular containers and the next sidecar
		for k := len(sidecars) - 1; k >= 0; k-- {
			start, grace := time.Duration(0), g
			if h := sidecars[k].hook; h != nil {
				start, grace = *h, g-secs(*h)
			}
			if grace > 0 {
				wait := min(max(next-start, 0), time.Duration(grace)*time.Second)
				start += wait
				grace -= secs(wait)
			}
			s := stopped(start, grace)
			next = max(mains, s)
			end = max(end, s)
		}
		worst = max(worst, end)
	}
	try(0)
	return worst
}

// TestTailMirrorsTheKubelet (issue 50, case 3): Tail is the kubelet's reaction
// (KubeletReaction, every pod's) and how long past its grace the kubelet may take to stop a pod
// once it kills it (kubeletStop): 2 s where a regular container has a preStop hook or the pod
// has native sidecars, however many (every sidecar's wait is capped by the same grace, counted
// from the same start), 3 s where a sidecar has a preStop hook of its own (the hook's and the
// wait's seconds are each rounded down). It is never shorter than what the kubelet may take, and
// never longer by a whole second but for a sidecar's own hook with nothing past the grace to wait
// for, where the rounding gains only the runtime's own stop.
func TestTailMirrorsTheKubelet(t *testing.T) {
	hook := &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "600"}}}}
	always := v1.ContainerRestartPolicyAlways
	app := v1.Container{Name: "app"}
	hooked := v1.Container{Name: "app-hooked", Lifecycle: hook}
	sidecar := func(name string, withHook bool) v1.Container {
		c := v1.Container{Name: name, RestartPolicy: &always}
		if withHook {
			c.Lifecycle = hook
		}
		return c
	}
	setup := v1.Container{Name: "setup"} // a regular init container: it ended before the pod ran
	for _, c := range []struct {
		name  string
		main  []v1.Container
		init  []v1.Container
		want  time.Duration
		loose bool // the bound is a whole second above the kubelet's worst
	}{
		{name: "no hook, no sidecar", main: []v1.Container{app}, init: []v1.Container{setup}, want: 0},
		{name: "a preStop hook", main: []v1.Container{app, hooked}, want: 2 * time.Second},
		{name: "a native sidecar", main: []v1.Container{app}, init: []v1.Container{setup, sidecar("proxy", false)}, want: 2 * time.Second},
		{name: "a preStop hook and a native sidecar (Istio)", main: []v1.Container{hooked}, init: []v1.Container{sidecar("istio-proxy", false)}, want: 2 * time.Second},
		{name: "a preStop hook and three native sidecars", main: []v1.Container{hooked, app},
			init: []v1.Container{sidecar("a", false), sidecar("b", false), sidecar("c", false)}, want: 2 * time.Second},
		{name: "a sidecar with its own preStop hook, after a hooked container", main: []v1.Container{hooked},
			init: []v1.Container{sidecar("proxy", true)}, want: 3 * time.Second},
		{name: "a sidecar with its own preStop hook, before another sidecar", main: []v1.Container{app},
			init: []v1.Container{sidecar("proxy", true), sidecar("log", false)}, want: 3 * time.Second},
		{name: "the only sidecar has its own preStop hook", main: []v1.Container{app},
			init: []v1.Container{sidecar("proxy", true)}, want: 3 * time.Second, loose: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := pod()
			p.Spec.Containers, p.Spec.InitContainers = c.main, c.init
			tail := Tail(p)
			if tail != KubeletReaction+c.want {
				t.Errorf("Tail = %v, want %v and the kubelet's reaction %v", tail, c.want, KubeletReaction)
			}
			got := tail - KubeletReaction // what the model counts from the kill
			for _, grace := range []time.Duration{MinGrace, 3 * time.Second, 5 * time.Second, 10 * time.Second} {
				past := kubeletStop(p, grace) - grace
				// The runtime's own stop, twice (a sidecar's wait may end with its prerequisite's),
				// is the plan's allowance, not the tail's.
				if past > got+2*runtimeStop {
					t.Errorf("grace %v: the kubelet may take %v past it, beyond the tail %v", grace, past, got)
				}
				if !c.loose && got > 0 && past <= got-time.Second {
					t.Errorf("grace %v: the kubelet takes at most %v past it; the tail %v costs the pod a second", grace, past, got)
				}
			}
		})
	}
}

// TestKubeletStopModel pins the model against the sums worked out by hand from killContainer.
func TestKubeletStopModel(t *testing.T) {
	hook := &v1.Lifecycle{PreStop: &v1.LifecycleHandler{}}
	always := v1.ContainerRestartPolicyAlways
	p := pod()
	p.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: hook}}
	p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: &always, Lifecycle: hook}}
	// The app's hook takes 9.995 s of 10: 9 s come off, the app gets the 2 s floor and ends at
	// 11.995 s. The proxy's hook takes 0.995 s: 0 s come off; it waits for the app until its
	// 10 s are up, at 10.995 s: 10 s come off, it gets the 2 s floor and ends at 12.995 s (each
	// stop plus the runtime's own).
	got := kubeletStop(p, 10*time.Second)
	if want := 12995*time.Millisecond + runtimeStop; got != want {
		t.Errorf("kubeletStop = %v, want %v", got, want)
	}
}
