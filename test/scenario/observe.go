package scenario

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Record is what the API server showed of one pod, stamped with when the watcher saw it.
type Record struct {
	Name string
	UID  string
	// DeletedAt is when the pod was first seen with a deletionTimestamp (the eviction or delete
	// request); Grace is its deletionGracePeriodSeconds then, and LastGrace the last value seen
	// non-zero value seen (a later DELETE can shorten it).
	DeletedAt        time.Time
	Grace, LastGrace int64
	// DeletionTimestamp is the end the API server promised, as last seen.
	DeletionTimestamp time.Time
	// GoneAt is when the pod disappeared.
	GoneAt time.Time
}

// Observer watches the pods of one namespace.
type Observer struct {
	mu      sync.Mutex
	records map[string]*Record
	cancel  context.CancelFunc
	done    chan struct{}
}

// Observe starts watching namespace ns. Stop it with Stop. A watch that breaks (an API server
// outage) is re-established after a fresh list; a pod that vanished meanwhile is recorded as
// gone when the list no longer holds it, which is an upper bound.
func Observe(ctx context.Context, c kubernetes.Interface, ns string) (*Observer, error) {
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods in %s: %w", ns, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	o := &Observer{records: map[string]*Record{}, cancel: cancel, done: make(chan struct{})}
	now := time.Now()
	for i := range list.Items {
		o.update(&list.Items[i], now, false)
	}
	go func() {
		defer close(o.done)
		rv := list.ResourceVersion
		for ctx.Err() == nil {
			o.watch(ctx, c, ns, rv)
			// The watch ended: list again until the server answers, then watch from there.
			for ctx.Err() == nil {
				l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err == nil {
					o.relisted(l.Items, time.Now())
					rv = l.ResourceVersion
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	return o, nil
}

func (o *Observer) watch(ctx context.Context, c kubernetes.Interface, ns, rv string) {
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			if pod, isPod := ev.Object.(*v1.Pod); isPod {
				o.update(pod, time.Now(), ev.Type == watch.Deleted)
			}
		}
	}
}

// relisted records a fresh list: updates for the pods in it, gone for the ones missing.
func (o *Observer) relisted(pods []v1.Pod, now time.Time) {
	present := map[string]bool{}
	for i := range pods {
		present[pods[i].Name] = true
		o.update(&pods[i], now, false)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, r := range o.records {
		if !present[name] && r.GoneAt.IsZero() {
			r.GoneAt = now
			if r.DeletedAt.IsZero() {
				r.DeletedAt = now
			}
		}
	}
}

func (o *Observer) update(pod *v1.Pod, now time.Time, deleted bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.records[pod.Name]
	if !ok || r.UID != string(pod.UID) {
		r = &Record{Name: pod.Name, UID: string(pod.UID)}
		o.records[pod.Name] = r
	}
	if pod.DeletionTimestamp != nil {
		if r.DeletedAt.IsZero() {
			r.DeletedAt = now
			if pod.DeletionGracePeriodSeconds != nil {
				r.Grace = *pod.DeletionGracePeriodSeconds
			}
		}
		// The final removal carries grace 0; the last grace a pod was given is the last
		// non-zero one.
		if g := pod.DeletionGracePeriodSeconds; g != nil && *g > 0 {
			r.LastGrace = *g
		}
		r.DeletionTimestamp = pod.DeletionTimestamp.Time
	}
	if deleted && r.GoneAt.IsZero() {
		r.GoneAt = now
		if r.DeletedAt.IsZero() {
			r.DeletedAt = now
		}
	}
}

// Records returns a copy of every record, by pod name.
func (o *Observer) Records() map[string]Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]Record, len(o.records))
	for k, r := range o.records {
		out[k] = *r
	}
	return out
}

// Stop ends the watch.
func (o *Observer) Stop() {
	o.cancel()
	<-o.done
}

// Row is one line of the outcome table.
type Row struct {
	Pod, Toleration string
	Grace           int64
	// Planned is when reprieve's plan had the eviction (zero: left alone).
	Planned time.Time
	// ByDeadline is true when the window, not the pod's toleration, set Planned (plan.Plan); PDB
	// when a PodDisruptionBudget that allows no disruption covers the pod.
	ByDeadline, PDB bool
	// KubeControllerManager is set when kube-controller-manager's taint-eviction controller
	// marked the pod for deletion (its TaintManagerEviction event): under the NoExecute taint
	// it deletes a pod the moment its toleration runs out, past any PodDisruptionBudget.
	KubeControllerManager bool
	Note                  string
	Record                Record
	// End is when every evicted pod must be gone (deadline - safety margin).
	End time.Time
}

// InTime reports whether an evicted pod was gone by the end of the window.
func (r Row) InTime() bool { return !r.Record.GoneAt.IsZero() && !r.Record.GoneAt.After(r.End) }

// PrintTable writes the outcome as a table, times relative to origin (the taint's timeAdded),
// and a legend under it.
func PrintTable(w io.Writer, origin time.Time, rows []Row) error {
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i].Planned, rows[j].Planned
		if a.IsZero() != b.IsZero() {
			return !a.IsZero()
		}
		return a.Before(b)
	})
	rel := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%+.2fs", t.Sub(origin).Seconds())
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tTOLERATION\tGRACE ASKED\tSEND AT\tSENT\tGRACE GIVEN\tGONE AT\tBY D - MARGIN\tWHY")
	for _, r := range rows {
		before, given, planned := "-", "-", r.Note
		if !r.Planned.IsZero() {
			before = "no"
			if r.InTime() {
				before = "yes"
			}
			// A pod whose grace is longer than the window is due before the notice: it is sent
			// at once, with what fits.
			planned = rel(latest(r.Planned, origin))
		}
		if !r.Record.DeletedAt.IsZero() {
			given = fmt.Sprintf("%ds", r.Record.LastGrace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%ds\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Pod, r.Toleration, r.Grace, planned,
			rel(r.Record.DeletedAt), given, rel(r.Record.GoneAt), before, r.why())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprint(w, tableLegend)
	return err
}

// tableLegend says what PrintTable's columns mean.
const tableLegend = `
SEND AT: when reprieve's plan sends the eviction, from T (the taint's timeAdded): the pod's
  tolerationSeconds (upstream NoExecute timing), or earlier when its grace would end past the
  deadline less the margin, and never before the notice. SENT: when the pod's deletion began.
GRACE ASKED: the pod's terminationGracePeriodSeconds; GRACE GIVEN: the grace its deletion got.
BY D - MARGIN: gone by the deadline less the safety margin, as reprieve promises.
WHY: at its toleration; moved earlier for the window; clamped (its whole grace does not fit,
  it gets what does); budget held (a PodDisruptionBudget refused the eviction until the pod's
  last safe moment, then it was forced with its grace); deleted by kube-controller-manager (its
  taint-eviction controller, under the NoExecute taint, deletes a pod when its toleration runs
  out, at once without one, with its full grace and past any PodDisruptionBudget; reprieve then
  only cuts a grace that would end past D - margin; --interruption-eviction=reprieve keeps it
  out); or why reprieve left it alone.
`

// why is the WHY column of r.
func (r Row) why() string {
	switch {
	case r.Planned.IsZero() && r.KubeControllerManager && !r.Record.DeletedAt.IsZero():
		// A pod reprieve leaves alone (a mirror or DaemonSet pod) that does not tolerate
		// the NoExecute taint.
		return "deleted by kube-controller-manager"
	case r.Planned.IsZero():
		return "-"
	case r.Record.DeletedAt.IsZero():
		return "not sent"
	case r.KubeControllerManager && r.Record.LastGrace > 0 && r.Record.LastGrace < r.Record.Grace:
		return fmt.Sprintf("deleted by kube-controller-manager, grace cut by reprieve to %ds", r.Record.LastGrace)
	case r.KubeControllerManager && r.PDB:
		return "deleted by kube-controller-manager, past its budget"
	case r.KubeControllerManager:
		return "deleted by kube-controller-manager"
	case r.PDB:
		return "budget held, then forced"
	case r.Record.LastGrace > 0 && r.Record.LastGrace < r.Grace:
		return fmt.Sprintf("clamped: %ds of %ds fit", r.Record.LastGrace, r.Grace)
	case r.ByDeadline:
		return "moved earlier for the window"
	}
	return "at its toleration"
}

// latest is the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
