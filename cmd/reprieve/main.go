// Command reprieve is the node agent: it turns cloud interruption notices into taints on its own
// node and graceful, deadline-clamped evictions of the node's pods.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
	"github.com/reprieve-dev/reprieve/agent/residency"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/aws"
	"github.com/reprieve-dev/reprieve/providers/azure"
	"github.com/reprieve-dev/reprieve/providers/gcp"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

// exitCode is an error that carries the process's exit status out of a cobra command.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// run returns the process's exit status: 0 on a clean stop, 1 on a failure while running, 2 on
// bad usage (a flag or variable that does not parse, an invalid configuration).
func run(args []string) int {
	agent.Version = version
	root := newRootCommand()
	root.SetArgs(args)
	err := root.Execute()
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	default:
		// cobra's own usage errors: an unknown command or flag.
		fmt.Fprintf(os.Stderr, "reprieve: %v\n", err)
		return 2
	}
}

// newRootCommand is the reprieve command and its subcommands (spf13/cobra): per-command help,
// --version, and shell completion (`reprieve completion bash`). The agent's flags stay a pflag
// set of config.Config's, so that `plan` and `doctor` parse the same flags the same way.
func newRootCommand() *cobra.Command {
	cfg := config.DefaultConfig()
	fs := agentFlagSet(&cfg)
	root := &cobra.Command{
		Use:           "reprieve",
		Short:         "Node agent: drains spot and preemptible nodes before the cloud reclaims them",
		Version:       version,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if code := runAgent(fs, &cfg); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	root.SetVersionTemplate("reprieve {{.Version}} (" + runtime.Version() + ")\n")
	root.Flags().AddFlagSet(fs)
	root.SetUsageFunc(func(cmd *cobra.Command) error {
		if cmd != root {
			// version, completion: their own usage, not the agent's flags.
			return commandUsage(cmd)
		}
		fmt.Fprintf(cmd.OutOrStderr(), "%s\n%s", usageHeader, fs.FlagUsages())
		return nil
	})
	root.SetHelpFunc(func(cmd *cobra.Command, _ []string) {
		if cmd != root {
			fmt.Fprint(cmd.OutOrStdout(), cmd.UsageString())
			return
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s", usageHeader, fs.FlagUsages())
	})
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		fmt.Fprintf(os.Stderr, "reprieve: %v\n", err)
		return exitCode(2)
	})
	// plan, doctor and audit parse their own flags (plan and doctor: the agent's plus theirs),
	// with their own --help, which `reprieve help plan` shows too.
	type runFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	sub := func(name, short string, runSub runFunc) *cobra.Command {
		cmd := &cobra.Command{
			Use: name, Short: short, DisableFlagParsing: true, SilenceUsage: true, SilenceErrors: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				if code := runSub(ctx, args, cmd.OutOrStdout(), cmd.ErrOrStderr()); code != 0 {
					return exitCode(code)
				}
				return nil
			},
		}
		cmd.SetHelpFunc(func(cmd *cobra.Command, _ []string) {
			runSub(context.Background(), []string{"--help"}, cmd.OutOrStdout(), cmd.ErrOrStderr())
		})
		return cmd
	}
	root.AddCommand(
		newGuardCommand(),
		sub("cleanup", "Remove from nodes everything reprieve wrote there (the chart's uninstall hook)", func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return runCleanup(ctx, args, stdout, stderr, newClient)
		}),
		sub("plan", "What the agent would do for a notice, changing nothing", func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return runPlan(ctx, args, stdout, stderr, time.Now(), newClient)
		}),
		sub("doctor", "Check permissions, the node and the metadata service", func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return runDoctor(ctx, args, stdout, stderr, newClient)
		}),
		sub("audit", "What a spot notice would do to each workload on spot nodes, changing nothing", func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return runAudit(ctx, args, stdout, stderr, time.Now(), newClient)
		}),
		func() *cobra.Command {
			// The chart's init container on AKS (docs/install.md): not a command for users.
			cmd := sub("copy-kubelet-files", "Copy the kubelet's root-only configuration files for the agent (the chart's init container)", func(_ context.Context, args []string, stdout, stderr io.Writer) int {
				return runCopyKubeletFiles(args, stdout, stderr)
			})
			cmd.Hidden = true
			return cmd
		}(),
		&cobra.Command{
			Use: "version", Short: "Print the version", Args: cobra.NoArgs,
			Run: func(*cobra.Command, []string) { fmt.Printf("reprieve %s (%s)\n", version, runtime.Version()) },
		},
	)
	return root
}

// runAgent runs the agent with the flags fs has parsed into cfg, and returns the exit status.
func runAgent(fs *pflag.FlagSet, cfg *config.Config) int {
	setGCPercent(os.LookupEnv)
	if err := config.ApplyEnv(fs, "REPRIEVE_", os.LookupEnv); err != nil {
		fmt.Fprintf(os.Stderr, "reprieve: %v\n", err)
		return 2
	}
	cfg.ApplyFallbacks(os.LookupEnv)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "reprieve: invalid configuration:\n%v\n", err)
		return 2
	}
	if err := setupLogging(cfg.LogFormat, verbosity(fs), os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "reprieve: %v\n", err)
		return 2
	}
	if cfg.Kubeconfig != "" {
		// Bad input, not a runtime failure: say so before anything touches the cluster.
		if _, err := clientcmd.LoadFromFile(cfg.Kubeconfig); err != nil {
			fmt.Fprintf(os.Stderr, "reprieve: --kubeconfig %q: %v\n", cfg.Kubeconfig, err)
			return 2
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal asks the agent to stop (during an interruption it finishes the window
	// first); a second one ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	if err := start(ctx, *cfg); err != nil {
		logger.Error(err, "reprieve failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

// agentGCPercent is the agent's GOGC unless $GOGC sets one: the heap may grow to half again its
// live size between collections, not twice it. On a node of 250 pods that holds 1 MiB less idle
// and 1.5-2.3 MiB less during the interruption, for more collections of a small heap
// (docs/benchmarks.md, "Footprint: the executable's pages and the heap").
const agentGCPercent = 50

// setGCPercent sets the collector's target to agentGCPercent unless the environment gives GOGC,
// which the runtime has read already and which stays the operator's to choose.
func setGCPercent(lookupEnv func(string) (string, bool)) {
	if _, ok := lookupEnv("GOGC"); !ok {
		debug.SetGCPercent(agentGCPercent)
	}
}

// usageHeader opens --help, and docs/flags.md. It names every command, the ones the chart runs
// first: the agent (its DaemonSet), eviction-guard (its guard Deployment) and cleanup (its
// uninstall hook); doctor and plan run
// in the agent's pod (NOTES.txt).
const usageHeader = `Usage: reprieve [flags]
       reprieve eviction-guard [flags]
       reprieve cleanup (--node NAME | --all-nodes) [flags]
       reprieve plan --node NAME [--deadline 120s] [-o table|json] [flags]
       reprieve doctor [--node NAME] [flags]
       reprieve audit [--node-selector SELECTOR]... [-n NAMESPACE] [--window 120s] [-o table|json]
       reprieve version | --version
       reprieve completion bash|zsh|fish|powershell

Commands:
  (no command)    the node agent, which the chart's DaemonSet runs; its flags are below
  eviction-guard  the admission webhook that lets the agent evict only pods on its own node;
                  the chart's guard Deployment runs it
  cleanup         remove from nodes everything reprieve wrote there; the chart's uninstall
                  hook runs it
  plan            what the agent would do for a notice, changing nothing
  doctor          check permissions, the node and the metadata service
                  (kubectl exec ds/reprieve -- /reprieve doctor)
  audit           what a spot notice would do to each workload on spot nodes, changing nothing
  version         print the version
  completion      a shell completion script

reprieve COMMAND --help lists a command's own flags. plan and doctor accept the agent's flags too.

Every agent flag also reads $REPRIEVE_<FLAG> (dashes as underscores); eviction-guard's read
$REPRIEVE_GUARD_<FLAG>.
`

// testOnlyFlags are agent flags that only tests change (they shorten GCE's maintenance notices):
// hidden from --help and docs/flags.md, still parsed and read from $REPRIEVE_<FLAG>.
// test/README.md names them.
var testOnlyFlags = []string{"gcp-gpu-maintenance-notice", "gcp-vm-maintenance-notice"}

// hideTestFlags hides testOnlyFlags from fs's usage.
func hideTestFlags(fs *pflag.FlagSet) {
	for _, name := range testOnlyFlags {
		if err := fs.MarkHidden(name); err != nil {
			panic(fmt.Sprintf("hiding --%s: %v", name, err))
		}
	}
}

// agentFlagSet is the agent's flags, bound to cfg, with klog's -v.
func agentFlagSet(cfg *config.Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("reprieve", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	hideTestFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlag(klogFlags.Lookup("v"))
	return fs
}

// commandUsage is the usage of a command with no usage of its own (version, completion): its
// use line, its subcommands and its own flags.
func commandUsage(cmd *cobra.Command) error {
	w := cmd.OutOrStderr()
	fmt.Fprintf(w, "Usage: %s\n", cmd.UseLine())
	if cmd.Long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.Long))
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nCommands:\n")
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-12s %s\n", c.Name(), c.Short)
			}
		}
	}
	if cmd.HasAvailableLocalFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", cmd.LocalFlags().FlagUsages())
	}
	return nil
}

// newClient builds the Kubernetes client: --kubeconfig, else $KUBECONFIG (one file or a list),
// else the in-cluster config.
func newClient(cfg config.Config) (kube.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the Kubernetes client configuration: %w", err)
	}
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	restCfg.UserAgent = "reprieve/" + version
	kube.UseProtobuf(restCfg)
	client, err := kube.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	return client, nil
}

// start wires the dependencies and runs the agent until ctx ends. Nothing here needs the API
// server to answer, so that an agent started while it is down waits (its /healthz answers, its
// /readyz says why not) instead of exiting into CrashLoopBackOff: the informers wait for it, the
// provider comes from the flags or the host's DMI (the node only when DMI names no cloud, read
// with retries), and the check for other interruption handlers runs in the background.
func start(ctx context.Context, cfg config.Config) error {
	client, err := newClient(cfg)
	if err != nil {
		return err
	}
	clk := clock.RealClock{}
	// What the node shows of accelerators refines GCP's maintenance notice once the node is
	// read; until then the provider goes by the machine type alone.
	accel := &nodefacts.AcceleratorHolder{}
	go func() {
		if node, err := getNode(ctx, client, cfg.NodeName, clk, "check for Karpenter and accelerators", nil); err == nil {
			accel.Set(node)
			if gpu, why, _ := accel.Get(); gpu {
				klog.FromContext(ctx).Info("The node shows an accelerator", "node", klog.KObj(node), "seen", why)
			} else {
				klog.FromContext(ctx).Info("The node shows no accelerator", "node", klog.KObj(node))
			}
			noteOverlaps(ctx, client, node, nodePods(ctx, client, cfg.NodeName), clk)
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	choice, err := chooseProvider(ctx, cfg, client, clk, func(why string) (func(), error) {
		return serveWhileWaiting(ctx, cfg.MetricsBindAddress, reg, why)
	})
	if err != nil && ctx.Err() != nil {
		// Stopped (SIGTERM) while waiting for the API server: a clean stop, as Run's.
		klog.FromContext(ctx).Info("Stopped before the provider was known", "err", err.Error())
		return nil
	}
	if err != nil {
		return err
	}
	choice.nodeAccelerator = accel.Get
	provider, err := newProvider(ctx, cfg, choice, reg)
	if err != nil {
		return err
	}
	a, err := agent.New(cfg, agent.Deps{Client: client, Provider: provider, Clock: clk, Registerer: reg, Gatherer: reg})
	if err != nil {
		return fmt.Errorf("creating the agent: %w", err)
	}
	if runtime.GOOS == "linux" {
		go residency.Run(ctx, clk, releaseFirst, releaseEvery, residency.Release)
	}
	return a.Run(ctx)
}

// releaseFirst is how long after the agent is built it first gives back the pages of its
// executable that start-up mapped (agent/residency): well past the first sync and poll of an
// agent whose API server answers (Ready in about 0.2 s on a node of 250 pods). releaseEvery is
// how often it does again, for what an interruption or a pressure episode mapped.
const (
	releaseFirst = 30 * time.Second
	releaseEvery = 10 * time.Minute
)

// newProvider returns the provider chosen (chooseProvider); nil for none (the agent reads its
// node's deadline annotation). Azure's resource name is --azure-resource-name, else the one the
// node's providerID gives when chooseProvider read it, else the provider asks IMDS compute.name
// at its first poll: the same name (providers/azure), with no API server needed.
func newProvider(ctx context.Context, cfg config.Config, choice providerChoice, reg prometheus.Registerer) (providers.Provider, error) {
	logger := klog.FromContext(ctx)
	name := choice.name
	if name == "none" {
		return nil, nil
	}
	rm, err := providers.NewRequestMetrics(reg, name)
	if err != nil {
		return nil, fmt.Errorf("registering metadata metrics: %w", err)
	}
	// Metadata services are link-local: never reach them through a proxy the environment
	// configures for everything else.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	metadataClient := &http.Client{Transport: rm.Wrap(transport)}
	switch name {
	case aws.Name:
		p, err := aws.New(aws.Options{Endpoint: cfg.AWSIMDSEndpoint, HTTPClient: metadataClient})
		if err != nil {
			return nil, fmt.Errorf("creating the AWS provider: %w", err)
		}
		return p, nil
	case gcp.Name:
		// No client timeout: hanging GETs wait up to a minute (the provider bounds each one).
		p, err := gcp.New(gcp.Options{Endpoint: cfg.GCPMetadataEndpoint, HTTPClient: metadataClient,
			MaintenanceNotice: cfg.GCPMaintenanceNotice, GPUMaintenanceNotice: cfg.GCPGPUMaintenanceNotice,
			VMMaintenanceNotice: cfg.GCPVMMaintenanceNotice, PreemptionNotice: cfg.GCPPreemptionNotice,
			NodeAccelerator: choice.nodeAccelerator})
		if err != nil {
			return nil, fmt.Errorf("creating the GCP provider: %w", err)
		}
		// The machine type is read with the first answer; the provider logs the windows then.
		if cfg.GCPMaintenanceNotice > 0 {
			logger.Info("GCP maintenance notice set by --gcp-maintenance-notice", "window", cfg.GCPMaintenanceNotice)
		}
		if cfg.GCPPreemptionNotice > 0 {
			logger.Info("GCP extended preemption notice set by --gcp-preemption-notice: the deadline is preempted=TRUE plus it and 30 s", "notice", cfg.GCPPreemptionNotice)
		}
		return p, nil
	case azure.Name:
		resource := cfg.AzureResourceName
		if resource == "" && choice.providerID != "" {
			if resource, err = azure.ResourceNameFromProviderID(choice.providerID); err != nil {
				logger.Info("Node providerID gives no Azure resource name; asking IMDS compute.name", "providerID", choice.providerID, "err", err.Error())
				resource = ""
			}
		}
		if resource == "" {
			logger.Info("No --azure-resource-name: asking IMDS compute.name at the first poll")
		}
		p, err := azure.New(azure.Options{Endpoint: cfg.AzureIMDSEndpoint, ResourceName: resource,
			FreezeInterrupts: cfg.AzureFreezeInterrupts, HTTPClient: metadataClient})
		if err != nil {
			return nil, fmt.Errorf("creating the Azure provider: %w", err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("--provider %s: unknown provider", name)
}
