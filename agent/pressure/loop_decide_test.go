package pressure

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// TestDecideResourceChangesNothing: the pressure loop's decision for one resource reads the
// loop's books and writes none of them (evictForPressure, the actuator, does): a soft threshold
// that has held its grace period evicts the first ranked pod with the kubelet's soft grace, cut
// to what fits before the hard threshold; a pod already in flight for the resource holds the next.
func TestDecideResourceChangesNothing(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	pod := func(name string, grace int64) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
			Spec: v1.PodSpec{TerminationGracePeriodSeconds: &grace}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	big, small := pod("big", 60), pod("small", 60)
	sample := kubelet.Sample{Pods: map[types.UID]kubelet.PodUsage{
		"big": {UID: "big", MemoryWorkingSet: 3 << 30}, "small": {UID: "small", MemoryWorkingSet: 1 << 30}}}
	level := Level{Signal: kubelet.MemoryAvailable, Available: 900 << 20, Hard: 100 << 20, At: now}
	for _, c := range []struct {
		name     string
		inFlight map[types.UID]inFlight
		ttl      time.Duration
		want     string
	}{
		{name: "the first ranked, with the soft grace", inFlight: map[types.UID]inFlight{}, ttl: Never, want: "[big/30s]"},
		{name: "the grace cut to what fits before the hard threshold", inFlight: map[types.UID]inFlight{}, ttl: 20 * time.Second, want: "[big/14s]"},
		{name: "a pod in flight for memory holds the next", inFlight: map[types.UID]inFlight{"gone": {resource: Memory, signal: kubelet.MemoryAvailable}}, ttl: Never, want: "[]"},
		{name: "one in flight for disk does not", inFlight: map[types.UID]inFlight{"gone": {resource: Disk, signal: kubelet.NodeFsAvailable}}, ttl: Never, want: "[big/30s]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lp := NewLoop(LoopOptions{SafetyMargin: 5 * time.Second, TransitionPeriod: time.Minute, TrendWindow: 20 * time.Second,
				Interval: time.Second, KubeletConfig: kubelet.Config{MaxPodGracePeriod: 30 * time.Second}})
			lp.inFlight = c.inFlight
			lp.retry[small.UID] = true
			lp.awaiting[kubelet.MemoryAvailable] = map[types.UID]bool{small.UID: true}
			before := fmt.Sprintf("%v %v %v %v", lp.inFlight, lp.retry, lp.awaiting, lp.blocked)
			d := lp.decideResource(now, Memory, level, c.ttl, []Level{level}, []kubelet.Signal{kubelet.MemoryAvailable},
				[]*v1.Pod{small, big}, sample)
			if d.in != nil {
				t.Errorf("the predictive rule ran for a resource not under pressure: %+v", d.in)
			}
			var got []string
			for _, ev := range d.soft {
				got = append(got, fmt.Sprintf("%s/%s", ev.Pod.Name, ev.Grace))
			}
			if fmt.Sprint(got) != c.want {
				t.Errorf("soft evictions %v, want %s", got, c.want)
			}
			if len(d.soft) > 0 && !reflect.DeepEqual(d.softLevel, level) {
				t.Errorf("soft level %+v, want %+v", d.softLevel, level)
			}
			if after := fmt.Sprintf("%v %v %v %v", lp.inFlight, lp.retry, lp.awaiting, lp.blocked); after != before {
				t.Errorf("the decision changed the loop's books:\n before %s\n after  %s", before, after)
			}
		})
	}
}
