package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// interruptionTaint is the agent's default interruption taint, cloud=spot:NoExecute.
func interruptionTaint() (v1.Taint, error) {
	t, err := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err != nil {
		return v1.Taint{}, fmt.Errorf("parsing the default interruption taint: %w", err)
	}
	return t, nil
}

// tokenOf returns the bearer token of a kubeconfig's current user.
func tokenOf(path string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok || cfg.AuthInfos[ctx.AuthInfo] == nil || cfg.AuthInfos[ctx.AuthInfo].Token == "" {
		return "", fmt.Errorf("reading %s: no token for the current context", path)
	}
	return cfg.AuthInfos[ctx.AuthInfo].Token, nil
}

// nodeWithPods creates namespace ns, node and pods on it (running), and starts watching ns.
func (b *bench) nodeWithPods(ctx context.Context, ns, node string, pods []scenario.Pod) (*scenario.Observer, error) {
	if err := b.env.CreateNamespace(ctx, ns); err != nil {
		return nil, err
	}
	if _, err := b.env.CreateNode(ctx, node, nil); err != nil {
		return nil, err
	}
	taint, err := interruptionTaint()
	if err != nil {
		return nil, err
	}
	if len(pods) > 0 {
		if err := scenario.Create(ctx, b.env.Client, ns, node, taint, pods); err != nil {
			return nil, err
		}
	}
	return scenario.Observe(ctx, b.env.Client, ns)
}

// startAgent starts the reprieve binary for node with the shipped RBAC and extra args; log
// verbosity is the chart's default (0), not the tests' -v=2, so that CPU figures are a
// deployment's.
func (b *bench) startAgent(ctx context.Context, node string, args ...string) (*testenv.Process, string, error) {
	return b.startAgentWith(ctx, b.kubeconfig, node, args...)
}

func (b *bench) startAgentWith(ctx context.Context, kubeconfig, node string, args ...string) (*testenv.Process, string, error) {
	all := append([]string{"--kubeconfig=" + kubeconfig, "-v=0"}, args...)
	p, addr, err := scenario.StartReprieve(ctx, b.bin, b.logDir, node, all...)
	if err != nil {
		return nil, "", fmt.Errorf("starting reprieve for %s: %w", node, err)
	}
	return p, addr, nil
}

// setTaint gives node exactly the interruption taint with timeAdded at, as a taint-only
// handler would.
func setTaint(ctx context.Context, c kubernetes.Interface, node string, at time.Time) error {
	taint, err := interruptionTaint()
	if err != nil {
		return err
	}
	taint.TimeAdded = &metav1.Time{Time: at}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": []v1.Taint{taint}}})
	if err != nil {
		return fmt.Errorf("encoding the taint patch: %w", err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("tainting %s: %w", node, err)
	}
	return nil
}

// setDeadline sets (or, with a zero time, removes) the reclaim-deadline annotation that
// --provider none reads.
func setDeadline(ctx context.Context, c kubernetes.Interface, node string, d time.Time) error {
	var v any
	if !d.IsZero() {
		v = d.UTC().Format(time.RFC3339)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationReclaimDeadline: v}}})
	if err != nil {
		return fmt.Errorf("encoding the deadline patch: %w", err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting the deadline of %s: %w", node, err)
	}
	return nil
}

// taintChange is the interruption taint appearing on a node, or going, as a watch saw it.
type taintChange struct {
	At        time.Time
	Present   bool
	TimeAdded time.Time
}

// taintWatch reports every change of a node's interruption taint, stamped when the watch
// delivered it.
type taintWatch struct {
	C      chan taintChange
	cancel context.CancelFunc
	done   chan struct{}
}

func watchTaint(ctx context.Context, c kubernetes.Interface, node string) (*taintWatch, error) {
	taint, err := interruptionTaint()
	if err != nil {
		return nil, err
	}
	sel := fields.OneTermEqualSelector("metadata.name", node).String()
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing node %s: %w", node, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &taintWatch{C: make(chan taintChange, 64), cancel: cancel, done: make(chan struct{})}
	present := false
	for i := range list.Items {
		_, present = findTaint(&list.Items[i], taint)
	}
	go func() {
		defer close(w.done)
		rv := list.ResourceVersion
		for ctx.Err() == nil {
			wi, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range wi.ResultChan() {
				n, ok := ev.Object.(*v1.Node)
				if !ok || ev.Type == watch.Error {
					break
				}
				rv = n.ResourceVersion
				t, has := findTaint(n, taint)
				if has != present {
					present = has
					ch := taintChange{At: time.Now(), Present: has}
					if has && t.TimeAdded != nil {
						ch.TimeAdded = t.TimeAdded.Time
					}
					select {
					case w.C <- ch:
					default:
					}
				}
			}
			wi.Stop()
		}
	}()
	return w, nil
}

// Next waits up to timeout for a change to present.
func (w *taintWatch) Next(ctx context.Context, present bool, timeout time.Duration) (taintChange, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case ch := <-w.C:
			if ch.Present == present {
				return ch, nil
			}
		case <-timer.C:
			return taintChange{}, fmt.Errorf("the taint did not become present=%v within %s", present, timeout)
		case <-ctx.Done():
			return taintChange{}, ctx.Err()
		}
	}
}

// Drain discards changes already delivered.
func (w *taintWatch) Drain() {
	for {
		select {
		case <-w.C:
		default:
			return
		}
	}
}

// Stop ends the watch.
func (w *taintWatch) Stop() {
	w.cancel()
	<-w.done
}

func findTaint(n *v1.Node, want v1.Taint) (v1.Taint, bool) {
	for _, t := range n.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			return t, true
		}
	}
	return v1.Taint{}, false
}

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// deleteAll removes every pod of ns at once (grace 0), and its PodDisruptionBudgets, so that a
// finished measurement leaves nothing for kwok and the API server to carry. The bench runs no
// namespace controller, so nothing else would remove them. A PodDisruptionBudget left behind
// costs a later measurement: every eviction lists the budgets of its pod's namespace through
// the API server's own loopback client (system:apiserver, APF's exempt level), and APF
// estimates that list from the resource's cluster-wide count and average size. After the pool's
// restart of kube-apiserver the size of budgets nothing has written since is unknown
// (apiserver_resource_size_estimate_bytes -1), so APF takes each to be 1.5 MB and every such
// list to need 10 seats: 50 budgets left by the compliance and footprint sections made
// exempt's demand 31 to 41 seats at the pool's notice, and APF lent workload-high's seat to
// it (12 seats: 433/608 in time, against 608/608 without them; docs/benchmarks.md).
func deleteAll(ctx context.Context, c kubernetes.Interface, ns string) error {
	zero := int64(0)
	if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("deleting the pods of %s: %w", ns, err)
	}
	if err := c.PolicyV1().PodDisruptionBudgets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("deleting the PodDisruptionBudgets of %s: %w", ns, err)
	}
	return nil
}

// stopAll stops processes in parallel.
func stopAll(ps []*testenv.Process) {
	var wg sync.WaitGroup
	for _, p := range ps {
		if p != nil {
			wg.Go(func() { _ = p.Stop() })
		}
	}
	wg.Wait()
}

// noBudgetsLeft fails when an earlier section left a PodDisruptionBudget behind. The pool has
// none, and one left elsewhere would change what it measures: every eviction lists its
// namespace's budgets as the API server's exempt loopback client, at a cost APF estimates from
// every budget in the cluster, up to 10 seats when their size is unknown, as after the pool's
// restart (deleteAll).
func noBudgetsLeft(ctx context.Context, c kubernetes.Interface) error {
	list, err := c.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing PodDisruptionBudgets left by earlier sections: %w", err)
	}
	if n := len(list.Items); n > 0 {
		return fmt.Errorf("%d PodDisruptionBudgets left by earlier sections (the first %s/%s): each would make every eviction's loopback list cost up to 10 exempt seats",
			n, list.Items[0].Namespace, list.Items[0].Name)
	}
	return nil
}
