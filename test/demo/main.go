// Command demo shows reprieve handling a spot interruption end to end on a laptop: it starts a
// local control plane (etcd, kube-apiserver, kube-controller-manager with the taint-eviction,
// node-lifecycle and disruption controllers that every managed cluster runs, and kwok),
// amazon-ec2-metadata-mock posting a spot notice with a short reclaim window, and the reprieve
// binary, then prints what happened to every pod. Run it with `make demo`, which runs reprieve's
// default mode (budgets kept, DaemonSet pods left running); `make demo
// DEMO_ARGS=-interruption-eviction=kube-controller-manager` shows the NoExecute mode, in which
// kube-controller-manager deletes what does not tolerate the taint at once, past its budget.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

func main() {
	provider := flag.String("provider", "aws", "simulated cloud: aws (amazon-ec2-metadata-mock), gcp or azure (the test tree's servers)")
	window := flag.Duration("window", 40*time.Second, "time from the notice to the reclaim deadline (GCP's is always 30s)")
	margin := flag.Duration("safety-margin", 5*time.Second, "reprieve's --safety-margin")
	scen := flag.String("scenario", envOr("REPRIEVE_DEMO_SCENARIO", "preemption"),
		"preemption, or gpu-maintenance (with -provider=gcp: host maintenance of a GPU VM, whose window starts -window after the notice, 90s unless set; $REPRIEVE_DEMO_SCENARIO)")
	eviction := flag.String("interruption-eviction", string(plan.EvictionReprieve),
		"reprieve's --interruption-eviction: reprieve (its default: the NoSchedule taint, reprieve alone evicts, budgets kept) or kube-controller-manager (the NoExecute taint, which its taint-eviction controller acts on)")
	flag.Parse()
	if !slices.Contains(plan.Evictions, plan.Eviction(*eviction)) {
		fmt.Fprintf(os.Stderr, "demo: -interruption-eviction %q: want reprieve or kube-controller-manager\n", *eviction)
		os.Exit(2)
	}
	clouds := map[string]scenario.Cloud{"aws": scenario.AWS{}, "gcp": scenario.GCP{}, "azure": scenario.Azure{}}
	cloud, ok := clouds[*provider]
	if !ok {
		fmt.Fprintf(os.Stderr, "demo: -provider %q: want aws, gcp or azure\n", *provider)
		os.Exit(2)
	}
	var extra []string
	switch *scen {
	case "preemption":
	case "gpu-maintenance":
		if *provider != "gcp" {
			fmt.Fprintf(os.Stderr, "demo: -scenario gpu-maintenance needs -provider gcp, not %q\n", *provider)
			os.Exit(2)
		}
		windowSet := false
		flag.Visit(func(f *flag.Flag) { windowSet = windowSet || f.Name == "window" })
		if !windowSet {
			*window = 90 * time.Second
		}
		// A lead shorter than the window shows both steps: the NoSchedule maintenance taint at
		// the notice, the interruption at window start - lead.
		cloud, extra = scenario.GCPMaintenance{}, []string{"--maintenance-lead=" + (*window * 2 / 3).String()}
	default:
		fmt.Fprintf(os.Stderr, "demo: -scenario %q: want preemption or gpu-maintenance\n", *scen)
		os.Exit(2)
	}
	if err := run(*provider, *scen, cloud, *window, *margin, plan.Eviction(*eviction), extra); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// envOr returns the environment variable name, or def when it is empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(provider, scen string, cloud scenario.Cloud, window, margin time.Duration, eviction plan.Eviction, extra []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	logDir, err := os.MkdirTemp("", "reprieve-demo-")
	if err != nil {
		return err
	}
	step := func(format string, args ...any) {
		fmt.Printf("%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	// The build runs before the demo's clock: on a cold Go cache it alone takes minutes.
	step("building reprieve")
	bin, err := scenario.BuildReprieve(ctx, logDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, window+2*time.Minute)
	defer cancel()
	// kube-controller-manager as in every managed cluster: its taint-eviction controller acts on
	// the NoExecute taint (it needs the node-lifecycle controller's pod index), and the
	// disruption controller keeps the budget's status.
	step("starting etcd, kube-apiserver, kube-controller-manager and kwok on 127.0.0.1 (logs in %s)", logDir)
	env, err := testenv.Start(ctx, testenv.Options{LogDir: logDir, ControllerManager: true, Controllers: testenv.DefaultControllers})
	if err != nil {
		return err
	}
	defer env.Stop()

	pods := scenario.Mixed()
	what := map[string]string{
		"aws":   fmt.Sprintf("amazon-ec2-metadata-mock will post a spot notice in 3s with a %s window", window),
		"gcp":   "the GCP metadata server will set preempted=TRUE in 3s (30s window)",
		"azure": fmt.Sprintf("the Scheduled Events server will post a Preempt in 3s with NotBefore %s later", window),
	}[provider]
	if scen == "gpu-maintenance" {
		what = fmt.Sprintf("in 3s the GCP metadata server will announce host maintenance of a GPU VM: upcoming-maintenance with window-start-time %s later "+
			"and maintenance-event TERMINATE_ON_HOST_MAINTENANCE; reprieve (%s) keeps new pods off at once and interrupts at the window's start - lead",
			window, strings.Join(extra, " "))
	}
	step("creating node demo-node with %d pods; reprieve runs with --interruption-eviction=%s; %s", len(pods), eviction, what)
	res, err := scenario.RunSpot(ctx, scenario.SpotOptions{
		Env: env, ReprieveBin: bin, Namespace: "demo", Node: "demo-node", Pods: pods, Cloud: cloud,
		NoticeDelay: 3 * time.Second, Window: window, SafetyMargin: margin, LogDir: logDir, ExtraArgs: extra, Eviction: eviction,
	})
	if err != nil {
		return err
	}
	taint := "cloud=spot:NoExecute"
	if eviction == plan.EvictionReprieve {
		taint = "cloud=spot:NoSchedule"
	}
	step("done; times are relative to the taint's timeAdded (T)")
	fmt.Printf("\n%s notice posted at T%+.2fs, node tainted %s at T%+.2fs; reclaim deadline T%+.0fs; every evicted pod must be gone by T%+.0fs (deadline - %s margin)\n\n",
		provider, res.NoticePostedAt.Sub(res.TimeAdded).Seconds(), taint, res.TaintSeenAt.Sub(res.TimeAdded).Seconds(), res.Deadline.Sub(res.TimeAdded).Seconds(), res.Window.End().Sub(res.TimeAdded).Seconds(), margin)
	if err := scenario.PrintTable(os.Stdout, res.TimeAdded, res.Rows); err != nil {
		return err
	}
	if eviction == plan.EvictionReprieve {
		fmt.Println("\nkube-controller-manager ran beside reprieve and deleted nothing: its taint-eviction controller acts\n" +
			"on NoExecute taints only. Every pod left at reprieve's plan, each budget-blocked pod was kept until its\n" +
			"last safe moment, then forced, and the DaemonSet pod was left running, as a drain leaves it\n" +
			"(docs/install.md#budgets). The NoExecute mode, in which kube-controller-manager deletes what does not\n" +
			"tolerate the taint at once: make demo DEMO_ARGS=-interruption-eviction=kube-controller-manager.")
	} else {
		fmt.Println("\nkube-controller-manager ran beside reprieve, as in every managed cluster: its taint-eviction controller\n" +
			"deleted each pod that does not tolerate the NoExecute taint at once, with its full grace and past any\n" +
			"PodDisruptionBudget, and reprieve cut the graces that would end past the deadline. reprieve's default mode\n" +
			"keeps budgets until each pod's last safe moment: make demo (docs/install.md#budgets).")
	}
	planned, inTime := 0, 0
	for _, r := range res.Rows {
		if !r.Planned.IsZero() {
			planned++
			if r.InTime() {
				inTime++
			}
		}
	}
	fmt.Printf("\n%d of %d scheduled pods gone before the deadline; reprieve log: %s/reprieve-demo-node.log\n", inTime, planned, logDir)
	if inTime != planned {
		return fmt.Errorf("%d pods were still there at the deadline", planned-inTime)
	}
	return nil
}
