package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// cleanupProbeLabel is the label the confinement check tries to add (server-side dry run): a
// write outside reprieve's keys, which the chart's cleanup policy must refuse.
const cleanupProbeLabel = "cleanup-probe.reprieve.dev/outside-reprieves-keys"

// cleanupOptions are `reprieve cleanup`'s flags.
type cleanupOptions struct {
	node        string
	allNodes    bool
	waitPods    string
	skipPods    string
	waitTimeout time.Duration
	confined    time.Duration
	dryRun      bool
}

// runCleanup is `reprieve cleanup`: it removes from nodes everything reprieve wrote there
// (record.ComputeCleanup), for an uninstall (the chart runs it as a post-delete hook). It exits 2
// on bad flags, 1 when a node could not be cleaned or the agents did not go away in time.
func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer, clientFor func(config.Config) (kube.Interface, error)) int {
	cfg := config.DefaultConfig()
	var o cleanupOptions
	fs := pflag.NewFlagSet("reprieve cleanup", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig file (else $KUBECONFIG, else in-cluster or ~/.kube/config)")
	fs.StringVar(&o.node, "node", "", "the node to clean")
	fs.BoolVar(&o.allNodes, "all-nodes", false, "clean every node (what the chart's uninstall hook does)")
	fs.StringVar(&o.waitPods, "wait-for-pods-gone", "", "NAMESPACE/SELECTOR: first wait until no pod matches (the agent's DaemonSet pods, which could write again)")
	fs.StringVar(&o.skipPods, "skip-nodes-with-pods", "", "SELECTOR: leave alone a node where a pod of any namespace that matches runs (another release's agent, which still owns its marks)")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 2*time.Minute, "how long --wait-for-pods-gone waits; past it the nodes are cleaned anyway and the command fails")
	fs.DurationVar(&o.confined, "require-confined", 0, "first check, for up to this long, that this identity may not write outside reprieve's keys (a server-side dry run the chart's cleanup policy refuses); 0: do not check")
	fs.BoolVar(&o.dryRun, "dry-run", false, "say what would be removed; change nothing")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: reprieve cleanup (--node NAME | --all-nodes) [flags]\n\n"+
			"Removes from nodes everything reprieve wrote there: its taints (pressure, maintenance, rebalance,\n"+
			"interruption), the load-balancer exclusion label it added, its reprieve.io/ annotations and its node\n"+
			"conditions. Run it once the agents are gone (docs/install.md, \"Uninstall\").\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "reprieve cleanup: %v\n", err)
		return 2
	}
	if err := config.ApplyEnv(fs, "REPRIEVE_", os.LookupEnv); err != nil {
		fmt.Fprintf(stderr, "reprieve cleanup: %v\n", err)
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "reprieve cleanup: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected argument %q", fs.Arg(0))
	case (o.node == "") == !o.allNodes:
		return usage("give --node NAME or --all-nodes (one of them)")
	}
	var waitNS string
	var waitSel labels.Selector
	if o.waitPods != "" {
		ns, sel, ok := strings.Cut(o.waitPods, "/")
		s, err := labels.Parse(sel)
		if !ok || ns == "" || sel == "" || err != nil {
			return usage("--wait-for-pods-gone %q: want NAMESPACE/SELECTOR (a label selector)", o.waitPods)
		}
		waitNS, waitSel = ns, s
	}
	var skipSel labels.Selector
	if o.skipPods != "" {
		s, err := labels.Parse(o.skipPods)
		if err != nil {
			return usage("--skip-nodes-with-pods %q: %v", o.skipPods, err)
		}
		skipSel = s
	}
	client, err := clientFor(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "reprieve cleanup: %v\n", err)
		return 1
	}
	code := 0
	if waitSel != nil {
		if err := waitPodsGone(ctx, client, waitNS, waitSel, o.waitTimeout, stdout); err != nil {
			fmt.Fprintf(stderr, "reprieve cleanup: %v; cleaning the nodes anyway, run it again once they are gone\n", err)
			code = 1
		}
	}
	var nodes []string
	if o.allNodes {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			fmt.Fprintf(stderr, "reprieve cleanup: listing the nodes: %v\n", err)
			return 1
		}
		for _, n := range list.Items {
			nodes = append(nodes, n.Name)
		}
	} else {
		nodes = []string{o.node}
	}
	if skipSel != nil {
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: skipSel.String()})
		if err != nil {
			fmt.Fprintf(stderr, "reprieve cleanup: listing the pods %s: %v\n", skipSel, err)
			return 1
		}
		busy := map[string]bool{}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				busy[p.Spec.NodeName] = true
			}
		}
		var free []string
		for _, n := range nodes {
			if busy[n] {
				fmt.Fprintf(stdout, "node %s: left alone, a pod %s runs there\n", n, skipSel)
				continue
			}
			free = append(free, n)
		}
		nodes = free
	}
	if o.confined > 0 && len(nodes) > 0 && !o.dryRun {
		if err := checkConfined(ctx, client, nodes[0], o.confined); err != nil {
			fmt.Fprintf(stderr, "reprieve cleanup: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "this identity may not write outside reprieve's keys (a label outside them was refused)\n")
	}
	cleaned := 0
	for _, name := range nodes {
		did, err := cleanNode(ctx, client, name, o.dryRun, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "reprieve cleanup: node %s: %v\n", name, err)
			code = 1
			continue
		}
		if did {
			cleaned++
		}
	}
	verb := "cleaned"
	if o.dryRun {
		verb = "would clean"
	}
	fmt.Fprintf(stdout, "%s %d of %d node(s)\n", verb, cleaned, len(nodes))
	return code
}

// waitPodsGone waits until no pod of ns matches sel: a terminating agent can still write its
// node (its last taint or condition), and a cleanup before it is gone would be undone.
func waitPodsGone(ctx context.Context, client kube.Interface, ns string, sel labels.Selector, timeout time.Duration, stdout io.Writer) error {
	var left int
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return false, nil // retried until the timeout; the last error is not worth more
		}
		left = len(pods.Items)
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the pods %s in %s to be gone: %d left after %v", sel, ns, left, timeout)
	}
	fmt.Fprintf(stdout, "no pod %s is left in %s\n", sel, ns)
	return nil
}

// checkConfined tries, with a server-side dry run, a write outside reprieve's keys (a label of
// its own on node): the chart's cleanup policy must refuse it (403). A policy just created by
// the same hook takes a moment to be in force in the API server, so this retries until within.
func checkConfined(ctx context.Context, client kube.Interface, node string, within time.Duration) error {
	patch := []byte(`{"metadata":{"labels":{"` + cleanupProbeLabel + `":"x"}}}`)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		_, last = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(last), nil
	})
	if err != nil {
		return fmt.Errorf("this identity may write outside reprieve's keys (a server-side dry run adding the label %s to node %s: %v): "+
			"refusing to clean with it; the chart's cleanup policy is not in force (--require-confined)", cleanupProbeLabel, node, last)
	}
	return nil
}

// cleanNode removes reprieve's marks from one node: the metadata and taints with a merge patch
// carrying the resourceVersion read (a Conflict re-reads and recomputes), the conditions with a
// strategic merge patch of status that deletes them by type. It reports whether there was
// anything to remove.
func cleanNode(ctx context.Context, client kube.Interface, name string, dryRun bool, stdout io.Writer) (bool, error) {
	var c record.Cleanup
	for attempt := 0; ; attempt++ {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading the node: %w", err)
		}
		c = record.ComputeCleanup(node)
		if c.Empty() {
			return false, nil
		}
		if dryRun || (len(c.Removed) == 0 && len(c.Labels) == 0 && len(c.Annotations) == 0) {
			break
		}
		patch, err := cleanupPatch(node.ResourceVersion, c)
		if err != nil {
			return false, err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "reprieve-cleanup"})
		if apierrors.IsConflict(err) && attempt < 5 {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("removing reprieve's taints, label and annotations: %w", err)
		}
		break
	}
	if len(c.Conditions) > 0 && !dryRun {
		patch, err := conditionsPatch(c.Conditions)
		if err != nil {
			return false, err
		}
		if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "reprieve-cleanup"}, "status"); err != nil {
			return false, fmt.Errorf("removing reprieve's node conditions: %w", err)
		}
	}
	var taints []string
	for _, t := range c.Removed {
		taints = append(taints, record.TaintID(t))
	}
	fmt.Fprintf(stdout, "node %s: taints %v, labels %v, annotations %v, conditions %v\n", name, taints, c.Labels, c.Annotations, c.Conditions)
	return true, nil
}

// cleanupPatch is the JSON merge patch (RFC 7386) of the node's metadata and taints. The
// resourceVersion makes it fail with a Conflict if the node changed since read, so that the
// taint list, which the patch replaces whole, is not another writer's older one.
func cleanupPatch(resourceVersion string, c record.Cleanup) ([]byte, error) {
	meta := map[string]any{"resourceVersion": resourceVersion}
	if len(c.Labels) > 0 {
		m := map[string]any{}
		for _, k := range c.Labels {
			m[k] = nil
		}
		meta["labels"] = m
	}
	if len(c.Annotations) > 0 {
		m := map[string]any{}
		for _, k := range c.Annotations {
			m[k] = nil
		}
		meta["annotations"] = m
	}
	p := map[string]any{"metadata": meta}
	if len(c.Removed) > 0 {
		taints := c.Taints
		if taints == nil {
			taints = []v1.Taint{}
		}
		p["spec"] = map[string]any{"taints": taints}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encoding the cleanup patch: %w", err)
	}
	return b, nil
}

// conditionsPatch deletes conditions by type: status.conditions is a list merged by type
// (patchMergeKey in k8s.io/api core/v1 NodeStatus), and "$patch": "delete" removes an element.
func conditionsPatch(types []v1.NodeConditionType) ([]byte, error) {
	var del []map[string]any
	for _, t := range types {
		del = append(del, map[string]any{"type": t, "$patch": "delete"})
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": del}})
	if err != nil {
		return nil, fmt.Errorf("encoding the conditions patch: %w", err)
	}
	return b, nil
}
