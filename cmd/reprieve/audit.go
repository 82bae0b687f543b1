package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/whatif"
	"github.com/reprieve-dev/reprieve/kubelet"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// cloudWindows are the reclaim windows `reprieve audit` imagines without --window: AWS's
// two-minute spot notice, GCP Spot and preemptible VMs' 30 s, Azure's 30 s Preempt event.
var cloudWindows = []struct {
	cloud  string
	window time.Duration
}{{"aws", 120 * time.Second}, {"gcp", 30 * time.Second}, {"azure", 30 * time.Second}}

// AuditReport is what `reprieve audit -o json` prints (docs/workloads.md documents it; fields
// are only ever added).
type AuditReport struct {
	// NodeSelectors are the label selectors of the nodes audited; a node matching any counts.
	NodeSelectors []string `json:"nodeSelectors"`
	// Namespace limits the workloads to one namespace; empty means every namespace.
	Namespace string `json:"namespace,omitempty"`
	// Nodes are the names of the matching nodes, sorted.
	Nodes               []string      `json:"nodes"`
	SafetyMarginSeconds float64       `json:"safetyMarginSeconds"`
	Windows             []AuditWindow `json:"windows"`
	// Workloads are those with at least one pod on a matching node, sorted by namespace, kind
	// and name.
	Workloads []WorkloadAudit `json:"workloads"`
	// VolumePlugins are the CSI node plugin pods on matching nodes that do not tolerate the
	// interruption taint forever: kube-controller-manager's taint eviction deletes them at the
	// notice, and the volumes of the pods evicted after them are never unstaged, so their
	// detach waits six minutes (issue 40). reprieve itself never evicts them.
	VolumePlugins []AuditPod `json:"volumePlugins,omitempty"`
}

// AuditPod names one pod of a finding.
type AuditPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
}

// AuditWindow is one imagined notice: a reclaim window and the clouds that give it (none when
// --window sets it).
type AuditWindow struct {
	Seconds float64  `json:"seconds"`
	Clouds  []string `json:"clouds,omitempty"`
}

// WorkloadAudit is one workload's line: its owner at the top of the owner chain (a Deployment
// rather than its ReplicaSet, a CronJob rather than its Job; Pod for a pod without an owner).
type WorkloadAudit struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	// Pods counts the workload's running pods on every node, PodsOnSpot those on matching nodes;
	// AllOnSpot is set when they are the same: one interruption wave can take them all.
	Pods       int  `json:"pods"`
	PodsOnSpot int  `json:"podsOnSpot"`
	AllOnSpot  bool `json:"allOnSpot"`
	// Outcomes has one entry per window, in the order of AuditReport.Windows.
	Outcomes []AuditOutcome `json:"outcomes"`
}

// AuditOutcome counts what the agent would do with the workload's pods on matching nodes for
// a notice with one window, as `reprieve plan` computes it for one node.
type AuditOutcome struct {
	WindowSeconds float64 `json:"windowSeconds"`
	// FullGrace pods are evicted with their whole terminationGracePeriodSeconds.
	FullGrace int `json:"fullGrace"`
	// CutShort pods are evicted with less; MaxCutSeconds is the largest cut among them.
	CutShort      int     `json:"cutShort"`
	MaxCutSeconds float64 `json:"maxCutSeconds,omitempty"`
	// PDBForced pods are covered by a PodDisruptionBudget that allows no disruption (or by
	// more than one budget): the Eviction API refuses them, and the agent deletes them before
	// the deadline past the budget.
	PDBForced int `json:"pdbForced"`
	// DiesWithMachine pods tolerate the interruption taint forever: nothing evicts them.
	DiesWithMachine int `json:"diesWithMachine"`
	// VolumeAtRisk pods have a volume that needs attaching and cannot be gone --volume-release
	// before the deadline: the replacement waits six minutes for the volume's detach.
	VolumeAtRisk int `json:"volumeAtRisk,omitempty"`
}

// runAudit implements `reprieve audit`: the cluster-wide counterpart of `reprieve plan`. For
// every pod on the nodes that match the selectors it runs the agent's own planner for a notice
// arriving now with each cloud's window, and sums the outcome per workload. It only reads, with
// the operator's credentials.
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer, now time.Time, clientFor func(config.Config) (kube.Interface, error)) int {
	cfg := config.DefaultConfig()
	fs := pflag.NewFlagSet("reprieve audit", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig file (else $KUBECONFIG, else ~/.kube/config)")
	selectors := fs.StringArray("node-selector", slices.Clone(nodefacts.SpotPoolSelectors), "a label selector of the nodes to audit; repeat it for nodes that match any of several")
	namespace := fs.StringP("namespace", "n", "", "audit the workloads of this namespace only (default every namespace)")
	window := fs.Duration("window", 0, "one reclaim window to imagine (default each cloud's: aws 120s, gcp 30s, azure 30s)")
	fs.StringVar(&cfg.InterruptionTaint, "interruption-taint", cfg.InterruptionTaint, "the agent's --interruption-taint")
	fs.StringVar(&cfg.InterruptionEviction, "interruption-eviction", cfg.InterruptionEviction, "the agent's --interruption-eviction")
	fs.DurationVar(&cfg.SafetyMargin, "safety-margin", cfg.SafetyMargin, "the agent's --safety-margin")
	fs.BoolVar(&cfg.EvictDaemonSetPods, "evict-daemonset-pods", cfg.EvictDaemonSetPods, "the agent's --evict-daemonset-pods")
	output := fs.StringP("output", "o", "table", "table or json")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: reprieve audit [--node-selector SELECTOR]... [-n NAMESPACE] [--window 120s] [-o table|json]\n\n"+
			"What a spot notice would do to each workload on the selected nodes, computed with the agent's planner.\nIt only reads.\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "reprieve audit: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "reprieve audit: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	// As every other command: $REPRIEVE_<FLAG> for a flag not given.
	if err := config.ApplyEnv(fs, "REPRIEVE_", os.LookupEnv); err != nil {
		fmt.Fprintf(stderr, "reprieve audit: %v\n", err)
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "reprieve audit: "+format+"\n", a...)
		return 2
	}
	if *output != "table" && *output != "json" {
		return usage("-o %q: want table or json", *output)
	}
	if _, err := config.ParseTaint(cfg.InterruptionTaint); err != nil {
		return usage("--interruption-taint %q: %v", cfg.InterruptionTaint, err)
	}
	if cfg.SafetyMargin < 0 {
		return usage("--safety-margin %v: want zero or more", cfg.SafetyMargin)
	}
	if *window < 0 || (*window > 0 && *window <= cfg.SafetyMargin) {
		return usage("--window %v: want longer than the safety margin %v", *window, cfg.SafetyMargin)
	}
	if len(*selectors) == 0 {
		return usage("--node-selector: want at least one")
	}
	for _, s := range *selectors {
		if _, err := labels.Parse(s); err != nil {
			return usage("--node-selector %q: %v", s, err)
		}
	}
	windows := auditWindows(*window)

	client, err := clientFor(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "reprieve audit: %v\n", err)
		return 1
	}
	in, err := readAudit(ctx, client, *selectors, *namespace)
	if err != nil {
		fmt.Fprintf(stderr, "reprieve audit: %v\n", err)
		return 1
	}
	report := buildAudit(cfg, in, windows, now)
	report.NodeSelectors, report.Namespace = *selectors, *namespace
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(report)
	} else {
		err = writeAuditTable(stdout, report)
	}
	if err != nil {
		fmt.Fprintf(stderr, "reprieve audit: writing the report: %v\n", err)
		return 1
	}
	return 0
}

// auditWindows is window alone when set, else the clouds' windows, one entry per length.
func auditWindows(window time.Duration) []AuditWindow {
	if window > 0 {
		return []AuditWindow{{Seconds: window.Seconds()}}
	}
	var out []AuditWindow
	for _, cw := range cloudWindows {
		i := slices.IndexFunc(out, func(w AuditWindow) bool { return w.Seconds == cw.window.Seconds() })
		if i < 0 {
			out = append(out, AuditWindow{Seconds: cw.window.Seconds()})
			i = len(out) - 1
		}
		out[i].Clouds = append(out[i].Clouds, cw.cloud)
	}
	return out
}

// auditInput is what the audit reads from the API server.
type auditInput struct {
	// Nodes are the nodes matching a selector, by name.
	Nodes map[string]*v1.Node
	// Pods are the pods of the namespaces that have a pod on such a node, on every node, so
	// that a workload's other replicas count too.
	Pods []*v1.Pod
	PDBs []policyv1.PodDisruptionBudget
	// Owners maps a ReplicaSet's or Job's UID to its own controller (a Deployment, a CronJob).
	Owners map[types.UID]metav1.OwnerReference
}

// readAudit lists the matching nodes (one list per selector: label selectors cannot say "or"),
// the pods, and the PodDisruptionBudgets, ReplicaSets and Jobs of the namespaces with a pod on
// those nodes. Pods come from one paginated list of every pod (or the namespace's) rather than
// one list per node with a spec.nodeName field selector: a single scan costs the API server
// less than one request per spot node on a large cluster, and the audit needs the pods on other
// nodes anyway, to tell whether all of a workload's replicas are on spot.
func readAudit(ctx context.Context, c kube.Interface, selectors []string, namespace string) (auditInput, error) {
	in := auditInput{Nodes: map[string]*v1.Node{}, Owners: map[types.UID]metav1.OwnerReference{}}
	for _, sel := range selectors {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return in, fmt.Errorf("listing the nodes matching %s: %w", sel, err)
		}
		for i := range nodes.Items {
			in.Nodes[nodes.Items[i].Name] = &nodes.Items[i]
		}
	}
	if len(in.Nodes) == 0 {
		return in, nil
	}
	var all []*v1.Pod
	opts := metav1.ListOptions{Limit: 500}
	for {
		pods, err := c.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return in, fmt.Errorf("listing pods: %w", err)
		}
		for i := range pods.Items {
			all = append(all, &pods.Items[i])
		}
		if pods.Continue == "" {
			break
		}
		opts.Continue = pods.Continue
	}
	namespaces := map[string]bool{}
	for _, p := range all {
		if in.Nodes[p.Spec.NodeName] != nil {
			namespaces[p.Namespace] = true
		}
	}
	for _, p := range all {
		if namespaces[p.Namespace] {
			in.Pods = append(in.Pods, p)
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(namespaces)) {
		pdbs, err := c.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return in, fmt.Errorf("listing the PodDisruptionBudgets of namespace %s: %w", ns, err)
		}
		in.PDBs = append(in.PDBs, pdbs.Items...)
		// One list per namespace and kind, and only where a pod names such an owner, rather
		// than one GET per pod.
		var needRS, needJobs bool
		for _, p := range in.Pods {
			if ref := metav1.GetControllerOf(p); p.Namespace == ns && ref != nil {
				needRS = needRS || ref.Kind == "ReplicaSet"
				needJobs = needJobs || ref.Kind == "Job"
			}
		}
		if needRS {
			rss, err := c.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return in, fmt.Errorf("listing the ReplicaSets of namespace %s: %w", ns, err)
			}
			addOwners(in.Owners, rss.Items, func(rs *appsv1.ReplicaSet) metav1.Object { return rs })
		}
		if needJobs {
			jobs, err := c.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return in, fmt.Errorf("listing the Jobs of namespace %s: %w", ns, err)
			}
			addOwners(in.Owners, jobs.Items, func(j *batchv1.Job) metav1.Object { return j })
		}
	}
	return in, nil
}

// addOwners records the controller of each object that has one.
func addOwners[T any](owners map[types.UID]metav1.OwnerReference, items []T, meta func(*T) metav1.Object) {
	for i := range items {
		m := meta(&items[i])
		if ref := metav1.GetControllerOf(m); ref != nil {
			owners[m.GetUID()] = *ref
		}
	}
}

// workloadKey names a workload.
type workloadKey struct{ namespace, kind, name string }

// workloadOf is pod's workload: its controller, or that controller's own (ReplicaSet to
// Deployment, Job to CronJob); the pod itself when it has none.
func workloadOf(pod *v1.Pod, owners map[types.UID]metav1.OwnerReference) workloadKey {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return workloadKey{pod.Namespace, "Pod", pod.Name}
	}
	if up, ok := owners[ref.UID]; ok && (ref.Kind == "ReplicaSet" || ref.Kind == "Job") {
		return workloadKey{pod.Namespace, up.Kind, up.Name}
	}
	return workloadKey{pod.Namespace, ref.Kind, ref.Name}
}

// buildAudit plans every node for a notice arriving at now with each window, with the agent's
// planner (whatif.Plan, what `reprieve plan` runs), and sums the pods' outcomes per
// workload. It is pure.
func buildAudit(cfg config.Config, in auditInput, windows []AuditWindow, now time.Time) AuditReport {
	// Whole seconds, as the agent stamps the taint, so that a report does not depend on when
	// in the second it ran.
	now = now.Truncate(time.Second)
	report := AuditReport{Nodes: []string{}, SafetyMarginSeconds: cfg.SafetyMargin.Seconds(), Windows: windows, Workloads: []WorkloadAudit{}}
	byNode := map[string][]*v1.Pod{}
	byName := map[types.NamespacedName]*v1.Pod{}
	workloads := map[workloadKey]*WorkloadAudit{}
	for _, p := range in.Pods {
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		byName[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
		if in.Nodes[p.Spec.NodeName] != nil {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	for name := range in.Nodes {
		report.Nodes = append(report.Nodes, name)
	}
	slices.Sort(report.Nodes)
	// The volume release's status period, from the kubelet's configuration under --host-root,
	// read once as the agent reads it.
	kr := kubelet.Find(cfg.KubeletLookup())
	for wi, w := range windows {
		for _, name := range report.Nodes {
			np := whatif.Plan(cfg, whatif.Input{Node: in.Nodes[name], Pods: byNode[name], PDBs: in.PDBs,
				NoticeTime: now, Now: now, Deadline: now.Add(time.Duration(w.Seconds * float64(time.Second))), Kubelet: kr})
			for _, pp := range np.Pods {
				// DaemonSet and mirror pods stay by design, as with kubectl drain; finished
				// pods and the agent itself have nothing to lose.
				if pp.Action == "skip" && pp.SkipReason != string(plan.SkipTolerateForever) {
					continue
				}
				key := workloadOf(byName[types.NamespacedName{Namespace: pp.Namespace, Name: pp.Name}], in.Owners)
				wl := workloads[key]
				if wl == nil {
					wl = &WorkloadAudit{Namespace: key.namespace, Kind: key.kind, Name: key.name, Outcomes: make([]AuditOutcome, len(windows))}
					for i := range windows {
						wl.Outcomes[i].WindowSeconds = windows[i].Seconds
					}
					workloads[key] = wl
				}
				if wi == 0 {
					wl.PodsOnSpot++
				}
				o := &wl.Outcomes[wi]
				if pp.VolumeAtRisk {
					o.VolumeAtRisk++
				}
				switch {
				case pp.Action == "skip":
					o.DiesWithMachine++
				case pp.PDB != nil && pp.PDB.Blocks:
					o.PDBForced++
				case pp.GraceSeconds < pp.PodGraceSeconds:
					o.CutShort++
					o.MaxCutSeconds = max(o.MaxCutSeconds, pp.PodGraceSeconds-pp.GraceSeconds)
				default:
					o.FullGrace++
				}
			}
		}
	}
	for _, p := range byName {
		if wl := workloads[workloadOf(p, in.Owners)]; wl != nil {
			wl.Pods++
		}
	}
	for _, wl := range workloads {
		wl.AllOnSpot = wl.Pods == wl.PodsOnSpot
		report.Workloads = append(report.Workloads, *wl)
	}
	// With --interruption-eviction=reprieve the taint goes on NoSchedule: nothing deletes the
	// plugins.
	if it, err := config.ParseTaint(cfg.InterruptionTaint); err == nil && plan.Eviction(cfg.InterruptionEviction) != plan.EvictionReprieve {
		for _, name := range report.Nodes {
			for _, p := range byNode[name] {
				if plan.IsVolumePlugin(p) && !plan.ToleratesForever(p.Spec.Tolerations, it, cfg.TolerationComparisonOperators) {
					report.VolumePlugins = append(report.VolumePlugins, AuditPod{Namespace: p.Namespace, Name: p.Name, Node: name})
				}
			}
		}
		slices.SortFunc(report.VolumePlugins, func(a, b AuditPod) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
	}
	slices.SortFunc(report.Workloads, func(a, b WorkloadAudit) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
	})
	return report
}

// writeAuditTable prints report for people: one row per workload and window.
func writeAuditTable(w io.Writer, r AuditReport) error {
	scope := "every namespace"
	if r.Namespace != "" {
		scope = "namespace " + r.Namespace
	}
	fmt.Fprintf(w, "%d nodes match %s; %s; safety margin %gs\n\n", len(r.Nodes), strings.Join(r.NodeSelectors, " or "), scope, r.SafetyMarginSeconds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tWINDOW\tON SPOT\tFULL GRACE\tCUT SHORT\tFORCED PAST PDB\tDIES WITH MACHINE")
	for _, wl := range r.Workloads {
		onSpot := fmt.Sprintf("%d/%d", wl.PodsOnSpot, wl.Pods)
		if wl.AllOnSpot {
			onSpot += " all"
		}
		for i, o := range wl.Outcomes {
			window := fmt.Sprintf("%gs", o.WindowSeconds)
			if clouds := r.Windows[i].Clouds; len(clouds) > 0 {
				window += " " + strings.Join(clouds, ",")
			}
			cut := fmt.Sprint(o.CutShort)
			if o.CutShort > 0 {
				cut += fmt.Sprintf(" (by up to %gs)", o.MaxCutSeconds)
			}
			fmt.Fprintf(tw, "%s/%s/%s\t%s\t%s\t%d\t%s\t%d\t%d\n", wl.Namespace, wl.Kind, wl.Name, window, onSpot, o.FullGrace, cut, o.PDBForced, o.DiesWithMachine)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Workloads) == 0 {
		if _, err := fmt.Fprintln(w, "(no workload has a pod on these nodes)"); err != nil {
			return err
		}
	}
	if len(r.VolumePlugins) > 0 {
		fmt.Fprintf(w, "\nCSI node plugins that do not tolerate the interruption taint forever: kube-controller-manager deletes them at the\n"+
			"notice, and the volumes of the pods evicted after them are not released (their detach waits six minutes).\n"+
			"Give them a toleration of the interruption taint without tolerationSeconds (or operator: Exists):\n")
		for _, p := range r.VolumePlugins {
			if _, err := fmt.Fprintf(w, "  %s/%s on %s\n", p.Namespace, p.Name, p.Node); err != nil {
				return err
			}
		}
	}
	return nil
}
