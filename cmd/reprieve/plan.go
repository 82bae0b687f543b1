package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/agent/whatif"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// runPlan implements `reprieve plan`: what the agent would do on a node if a notice with the
// given deadline arrived, computed with the agent's own planner from the node and its pods as
// the API server has them. It changes nothing. It takes the agent's flags too (taints, margin,
// lead, ...), so that the plan is the DaemonSet's: pass the same ones.
func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer, now time.Time, clientFor func(config.Config) (kube.Interface, error)) int {
	sc := newSubcommand("plan", "--node NAME [--deadline 120s | --deadline 2026-12-01T10:00:00Z] [--notice-time TIME] [-o table|json] [agent flags]", stderr)
	fs := sc.fs
	deadlineFlag := fs.String("deadline", "", "the imagined notice's reclaim deadline: a duration after --notice-time (120s) or an RFC 3339 time; empty plans against the node's taints as they are")
	noticeFlag := fs.String("notice-time", "", "when the imagined notice arrives, RFC 3339 (default now)")
	output := fs.StringP("output", "o", "table", "table or json")
	if code, ok := sc.parse(args); !ok {
		return code
	}
	cfg := sc.cfg
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "reprieve plan: -o %q: want table or json\n", *output)
		return 2
	}
	in := whatif.Input{Now: now}
	if *noticeFlag != "" {
		t, err := time.Parse(time.RFC3339, *noticeFlag)
		if err != nil {
			fmt.Fprintf(stderr, "reprieve plan: --notice-time %q: want RFC 3339 (2026-12-01T10:00:00Z)\n", *noticeFlag)
			return 2
		}
		in.NoticeTime = t
	}
	if *deadlineFlag != "" {
		d, err := parseDeadline(*deadlineFlag, in.NoticeTime, now)
		if err != nil {
			fmt.Fprintf(stderr, "reprieve plan: --deadline %q: %v\n", *deadlineFlag, err)
			return 2
		}
		in.Deadline = d
	}

	client, err := clientFor(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "reprieve plan: %v\n", err)
		return 1
	}
	if err := readWhatIf(ctx, client, cfg.NodeName, &in); err != nil {
		fmt.Fprintf(stderr, "reprieve plan: %v\n", err)
		return 1
	}
	// One read of the kubelet's configuration for the plan's volume release and the rules.
	in.Kubelet = kubelet.Find(cfg.KubeletLookup())
	plan := whatif.Plan(cfg, in)
	readVolumes(ctx, client, in, &plan)
	rules := kubeletRulesOf(in.Kubelet.Config, in.Kubelet.Err)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		// NodePlan's fields, and beside them what was known of the kubelet's rules.
		if err := enc.Encode(struct {
			whatif.NodePlan
			Kubelet kubeletRules `json:"kubelet"`
		}{plan, rules}); err != nil {
			fmt.Fprintf(stderr, "reprieve plan: writing the plan: %v\n", err)
			return 1
		}
		return 0
	}
	if err := writePlanTable(stdout, plan); err != nil {
		fmt.Fprintf(stderr, "reprieve plan: writing the plan: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout)
	for _, r := range rules.Rules {
		fmt.Fprintln(stdout, r)
	}
	return 0
}

// kubeletRules is what plan knew of the kubelet's own rules beside reprieve's: its graceful node
// shutdown and its eviction thresholds, from its configuration file (read as the agent reads it,
// under --host-root: on a workstation there is usually none). Rules says, one line each, what
// each is or that it is unknown.
type kubeletRules struct {
	// ConfigFound is whether the kubelet's configuration was found and read; ConfigPath is the
	// file, Searched every path tried, Error why a file found could not be read.
	ConfigFound bool     `json:"configFound"`
	ConfigPath  string   `json:"configPath,omitempty"`
	Searched    []string `json:"searched,omitempty"`
	Error       string   `json:"error,omitempty"`
	Rules       []string `json:"rules"`
}

func kubeletRulesOf(kc kubelet.Config, err error) kubeletRules {
	k := kubeletRules{ConfigFound: err == nil && kc.Found, ConfigPath: kc.Path, Searched: kc.Searched}
	hard := make([]string, len(kc.Hard))
	for i, t := range kc.Hard {
		hard[i] = t.String()
	}
	switch {
	case err != nil:
		k.Error = err.Error()
		k.Rules = []string{
			fmt.Sprintf("the kubelet's graceful node shutdown: unknown (its configuration could not be read: %v)", err),
			"the kubelet's eviction thresholds: unknown, the defaults assumed",
		}
	case !kc.Found:
		where := "no kubelet config found at " + strings.Join(kc.Searched, ", ")
		k.Rules = []string{
			"the kubelet's graceful node shutdown: unknown (" + where + "; run plan on the node, or with --host-root at its filesystem, or set --kubelet-config)",
			"the kubelet's eviction thresholds: unknown, the defaults assumed (evictionHard " + strings.Join(hard, ",") + ")",
		}
	default:
		shutdown := "off"
		if kc.ShutdownGracePeriod > 0 {
			shutdown = fmt.Sprintf("shutdownGracePeriod %s, %s of it for critical pods", kc.ShutdownGracePeriod, kc.ShutdownGracePeriodCriticalPods)
		}
		if len(hard) == 0 {
			hard = []string{"none"}
		}
		k.Rules = []string{
			"the kubelet's graceful node shutdown: " + shutdown + " (" + kc.Path + ")",
			"the kubelet's eviction thresholds: evictionHard " + strings.Join(hard, ",") + " (" + kc.Path + ")",
		}
	}
	return k
}

// parseDeadline reads a duration after the notice time (now when unset) or an RFC 3339 time.
func parseDeadline(s string, notice, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("want a positive duration")
		}
		if notice.IsZero() {
			notice = now
		}
		return notice.Add(d).Truncate(time.Second), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, errors.New("want a duration (120s) or an RFC 3339 time (2026-12-01T10:00:00Z)")
	}
	return t, nil
}

// readWhatIf reads the node, its pods (the agent's own field selector) and the
// PodDisruptionBudgets of their namespaces.
func readWhatIf(ctx context.Context, c kube.Interface, node string, in *whatif.Input) error {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading node %s: %w", node, err)
	}
	in.Node = n
	pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	namespaces := map[string]bool{}
	for i := range pods.Items {
		if pods.Items[i].Spec.NodeName != node {
			continue // a server (or a fake) that ignored the field selector
		}
		in.Pods = append(in.Pods, &pods.Items[i])
		namespaces[pods.Items[i].Namespace] = true
	}
	for ns := range namespaces {
		pdbs, err := c.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing the PodDisruptionBudgets of namespace %s: %w", ns, err)
		}
		in.PDBs = append(in.PDBs, pdbs.Items...)
	}
	return nil
}

// readVolumes reads, for each pod planned with the volume rule, its volumes as the agent does
// in a window (a GET of each claim and of its volume), and notes where the node's status has
// each now: during a window, which are released and which are still in use.
func readVolumes(ctx context.Context, c kube.Interface, in whatif.Input, plan *whatif.NodePlan) {
	pods := map[string]*v1.Pod{}
	for _, p := range in.Pods {
		pods[p.Namespace+"/"+p.Name] = p
	}
	for i := range plan.Pods {
		pp := &plan.Pods[i]
		pod := pods[pp.Namespace+"/"+pp.Name]
		if pp.VolumeReleaseBy == nil || pod == nil {
			continue
		}
		vols, err := volumes.ReadPod(ctx, c, pod)
		whatif.NoteVolumes(pp, in.Node, vols, err)
	}
}

// writePlanTable prints plan for people: times relative to the notice, T+12s.
func writePlanTable(w io.Writer, plan whatif.NodePlan) error {
	rel := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return fmt.Sprintf("T%+.1fs", t.Sub(plan.NoticeTime).Seconds())
	}
	fmt.Fprintf(w, "Node %s, notice at %s", plan.Node, plan.NoticeTime.UTC().Format(time.RFC3339))
	switch {
	case plan.Deadline != nil:
		fmt.Fprintf(w, ", deadline %s (%s), pods gone by %s (%s, margin %gs)\n", plan.Deadline.UTC().Format(time.RFC3339), rel(plan.Deadline),
			plan.WindowEnd.UTC().Format(time.RFC3339), rel(plan.WindowEnd), plan.SafetyMarginSeconds)
	case plan.FarAhead:
		fmt.Fprintf(w, ": the deadline is further away than --maintenance-lead; new pods are kept off the node, nothing is evicted yet\n")
	default:
		fmt.Fprintf(w, ", no deadline\n")
	}
	if plan.InterruptionEviction == "reprieve" {
		fmt.Fprintf(w, "Interruption eviction: reprieve (the node gets %s, which kube-controller-manager ignores; budgets hold until each pod's LATEST)\n", plan.InterruptionTaint)
	} else {
		fmt.Fprintf(w, "Interruption eviction: kube-controller-manager (the node gets %s; its taint-eviction controller deletes each pod at DUE, past its budget)\n", plan.InterruptionTaint)
	}
	fmt.Fprintf(w, "NoExecute taints: %s\n\n", strings.Join(append([]string{}, plan.NoExecuteTaints...), ", "))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tACTION\tEVICT AT\tGRACE\tDUE\tLATEST\tDECIDED BY\tPDB")
	for _, p := range plan.Pods {
		name := p.Namespace + "/" + p.Name
		if p.Action == "skip" {
			fmt.Fprintf(tw, "%s\tskip: %s\t-\t-\t-\t-\t-\t-\n", name, p.SkipReason)
			continue
		}
		decided := p.Taint + " tolerated " + p.Toleration
		if p.Toleration == "none" {
			decided = p.Taint + ", not tolerated"
		}
		if p.ByDeadline {
			decided = "the deadline (" + decided + ")"
		}
		pdb := "-"
		if p.PDB != nil {
			pdb = p.PDB.Name
			if len(p.PDB.Covering) > 1 {
				pdb = strings.Join(p.PDB.Covering, "+")
			}
			if p.PDB.Blocks {
				pdb += " blocks: " + p.PDB.Then
			}
		}
		grace := fmt.Sprintf("%gs", p.GraceSeconds)
		if p.GraceSeconds < p.PodGraceSeconds {
			grace += fmt.Sprintf(" (of %gs)", p.PodGraceSeconds)
		}
		fmt.Fprintf(tw, "%s\tevict\t%s\t%s\t%s\t%s\t%s\t%s\n", name, rel(p.SendAt), grace, rel(p.Due), rel(p.Latest), decided, pdb)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The pods whose volumes must be released before the machine goes, and where each is now.
	first := true
	for _, p := range plan.Pods {
		if p.VolumeReleaseBy == nil {
			continue
		}
		if first {
			fmt.Fprintf(w, "\nVolumes that must be released before the deadline (the node's volumesInUse now):\n")
			first = false
		}
		risk := ""
		if p.VolumeAtRisk {
			risk = ", AT RISK: even the least grace ends after that"
		}
		fmt.Fprintf(w, "  %s/%s: gone by %s for the kubelet to release its volumes%s\n", p.Namespace, p.Name, rel(p.VolumeReleaseBy), risk)
		for _, v := range p.Volumes {
			fmt.Fprintf(w, "    %s: %s\n", v.Name, v.State)
		}
		for _, d := range p.NoAttach {
			fmt.Fprintf(w, "    %s: attaches to no node\n", d)
		}
		if p.VolumesUnknown != "" {
			fmt.Fprintf(w, "    volumes unknown: %s\n", p.VolumesUnknown)
		}
	}
	return nil
}

// subcommand is the agent's flag set plus --node, for plan and doctor: they take the flags the
// DaemonSet passes (and read its REPRIEVE_* variables in its pod), so that they see what the
// agent would. Their --help lists only their own flags, and names the agent's in one line.
type subcommand struct {
	name   string
	cfg    config.Config
	fs     *pflag.FlagSet
	node   *string
	stderr io.Writer
	// agentFlags are the names of the agent's flags in fs; the rest are the command's own.
	agentFlags map[string]bool
}

func newSubcommand(name, usage string, stderr io.Writer) *subcommand {
	sc := &subcommand{name: name, cfg: config.DefaultConfig(), fs: pflag.NewFlagSet("reprieve "+name, pflag.ContinueOnError), stderr: stderr,
		agentFlags: map[string]bool{}}
	sc.fs.SetOutput(stderr)
	sc.cfg.AddFlags(sc.fs)
	hideTestFlags(sc.fs)
	sc.fs.VisitAll(func(f *pflag.Flag) { sc.agentFlags[f.Name] = true })
	sc.node = sc.fs.String("node", "", "the node (else --node-name, else $NODE_NAME)")
	sc.fs.Usage = func() { sc.usage(usage) }
	return sc
}

// usage writes the command's --help: its own flags, then one line for the agent's.
func (sc *subcommand) usage(usage string) {
	own := pflag.NewFlagSet("reprieve "+sc.name, pflag.ContinueOnError)
	sc.fs.VisitAll(func(f *pflag.Flag) {
		if !sc.agentFlags[f.Name] {
			own.AddFlag(f)
		}
	})
	fmt.Fprintf(sc.stderr, "Usage: reprieve %s %s\n\nFlags:\n%s\n"+
		"Also accepts every agent flag (reprieve --help) and its $REPRIEVE_<FLAG>: pass the flags the DaemonSet\n"+
		"passes, or run it in the agent's pod (kubectl exec ds/reprieve -- /reprieve %s), to see its settings.\n",
		sc.name, usage, own.FlagUsages(), sc.name)
}

// errNodeRequired is what plan and doctor say without a node: their flag is --node, where the
// agent's Validate names the agent's --node-name.
var errNodeRequired = errors.New("--node (or $NODE_NAME) is required")

// parse reads args, the REPRIEVE_ variables and the fallbacks, and validates the configuration.
// When it returns false, the command ends with code (0 for --help, 2 for bad input).
func (sc *subcommand) parse(args []string) (code int, ok bool) {
	prefix := "reprieve " + sc.name + ": "
	if err := sc.fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(sc.stderr, "%s%v\n", prefix, err)
		return 2, false
	}
	if sc.fs.NArg() > 0 {
		fmt.Fprintf(sc.stderr, "%sunexpected argument %q\n", prefix, sc.fs.Arg(0))
		return 2, false
	}
	if err := config.ApplyEnv(sc.fs, "REPRIEVE_", os.LookupEnv); err != nil {
		fmt.Fprintf(sc.stderr, "%s%v\n", prefix, err)
		return 2, false
	}
	if *sc.node != "" {
		sc.cfg.NodeName = *sc.node
	}
	sc.cfg.ApplyFallbacks(os.LookupEnv)
	// Without a node, Validate the rest with a stand-in name, and report the missing node as
	// this command's flag: every problem at once, each named as the user can fix it.
	noNode := sc.cfg.NodeName == ""
	if noNode {
		sc.cfg.NodeName = "-"
	}
	err := sc.cfg.Validate()
	if noNode {
		sc.cfg.NodeName = ""
		err = errors.Join(errNodeRequired, err)
	}
	if err != nil {
		fmt.Fprintf(sc.stderr, "%sinvalid configuration:\n%v\n", prefix, err)
		return 2, false
	}
	return 0, true
}
