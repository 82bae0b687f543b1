// Command reprieve is the node agent: it turns cloud interruption notices into taints on its own
// node and graceful, deadline-clamped evictions of the node's pods.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/aws"
	"github.com/reprieve-dev/reprieve/providers/azure"
	"github.com/reprieve-dev/reprieve/providers/detect"
	"github.com/reprieve-dev/reprieve/providers/gcp"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the process's exit status: 0 on a clean stop, 1 on a failure while running, 2 on
// bad usage (a flag or variable that does not parse, an invalid configuration).
func run(args []string) int {
	agent.Version = version
	if len(args) > 0 && args[0] == "version" {
		fmt.Printf("reprieve %s (%s)\n", version, runtime.Version())
		return 0
	}
	if len(args) > 0 && args[0] == "doctor" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runDoctor(ctx, args[1:], os.Stdout, os.Stderr, newClient)
	}
	if len(args) > 0 && args[0] == "plan" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runPlan(ctx, args[1:], os.Stdout, os.Stderr, time.Now(), newClient)
	}

	cfg := agent.DefaultConfig()
	fs := agentFlagSet(&cfg)
	fs.Usage = func() { fmt.Fprintf(os.Stderr, "%s\n%s", usageHeader, fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "reprieve: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "reprieve: unknown command %q (want no argument, plan, doctor or version)\n", fs.Arg(0))
		return 2
	}
	if err := agent.ApplyEnv(fs, "REPRIEVE_", os.LookupEnv); err != nil {
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

	if err := start(ctx, cfg); err != nil {
		logger.Error(err, "reprieve failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

// usageHeader opens --help, and docs/flags.md.
const usageHeader = `Usage: reprieve [flags]
       reprieve plan --node NAME --deadline 120s [-o table|json] [flags]
       reprieve doctor [flags]
       reprieve version

Every flag also reads $REPRIEVE_<FLAG> (dashes as underscores).
`

// agentFlagSet is the agent's flags, bound to cfg, with klog's -v.
func agentFlagSet(cfg *agent.Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("reprieve", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlag(klogFlags.Lookup("v"))
	return fs
}

// newClient builds the Kubernetes client: --kubeconfig, else $KUBECONFIG (one file or a list),
// else the in-cluster config.
func newClient(cfg agent.Config) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the Kubernetes client configuration: %w", err)
	}
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	restCfg.UserAgent = "reprieve/" + version
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	return client, nil
}

// start wires the dependencies and runs the agent until ctx ends.
func start(ctx context.Context, cfg agent.Config) error {
	client, err := newClient(cfg)
	if err != nil {
		return err
	}
	noteKarpenter(ctx, client, cfg.NodeName, clock.RealClock{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	provider, err := newProvider(ctx, cfg, client, reg)
	if err != nil {
		return err
	}
	a, err := agent.New(cfg, agent.Deps{Client: client, Provider: provider, Clock: clock.RealClock{}, Registerer: reg, Gatherer: reg})
	if err != nil {
		return fmt.Errorf("creating the agent: %w", err)
	}
	return a.Run(ctx)
}

// newProvider returns the provider the flags name; nil for none (the agent reads its node's
// deadline annotation). With auto, and for Azure's resource name, it reads the node once.
func newProvider(ctx context.Context, cfg agent.Config, client kubernetes.Interface, reg prometheus.Registerer) (providers.Provider, error) {
	logger := klog.FromContext(ctx)
	name := cfg.Provider
	var providerID string
	if name == "auto" || (name == "azure" && cfg.AzureResourceName == "") {
		node, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading node %s to detect its cloud: %w", cfg.NodeName, err)
		}
		providerID = node.Spec.ProviderID
	}
	if name == "auto" {
		d := detect.Detect(providerID, cfg.HostRoot)
		logger.Info("Detected the provider", "provider", d.Provider, "reason", d.Reason)
		name = d.Provider
	}
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
		p, err := gcp.New(gcp.Options{Endpoint: cfg.GCPMetadataEndpoint, HTTPClient: metadataClient})
		if err != nil {
			return nil, fmt.Errorf("creating the GCP provider: %w", err)
		}
		return p, nil
	case azure.Name:
		resource := cfg.AzureResourceName
		if resource == "" && providerID != "" {
			if resource, err = azure.ResourceNameFromProviderID(providerID); err != nil {
				logger.Info("Node providerID gives no Azure resource name; asking IMDS", "providerID", providerID, "err", err.Error())
				resource = ""
			}
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
