package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/agent/kube"
)

// guardConfig is the eviction guard's flags.
type guardConfig struct {
	BindAddress    string
	TLSCertFile    string
	TLSKeyFile     string
	ServiceAccount string
	Kubeconfig     string
	LogFormat      string
	// ClientCAFile and ClientAllowedNames authenticate the API server (guard.ClientAuth).
	ClientCAFile       string
	ClientAllowedNames []string
	// SourceInFlight, InFlight, SourcePodReads, SourceConns and Conns are guard.Limits.
	SourceInFlight, InFlight int
	SourcePodReads           float32
	SourceConns, Conns       int
	// TLSSecret, TLSWebhookConfiguration and TLSHosts have the guard keep its own certificate
	// (guard.SelfCert) instead of reading --tls-cert-file; TLSSyncInterval is how often.
	TLSSecret               string
	TLSWebhookConfiguration string
	TLSHosts                []string
	TLSSyncInterval         time.Duration
	// ShutdownDelay is how long the guard drains on SIGTERM (guard.ServerOptions).
	ShutdownDelay time.Duration
}

func (c *guardConfig) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.BindAddress, "bind-address", ":8443", "host:port of the HTTPS listener (reviews at "+guard.PathValidate+", /healthz, /readyz, /metrics)")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", "", "serving certificate (PEM), reloaded when the file changes")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", "", "serving certificate's private key (PEM), reloaded when the file changes")
	fs.StringVar(&c.TLSSecret, "tls-secret", "", "NAMESPACE/NAME of a Secret (which must exist) where the guard keeps its own CA and serving certificate, made, shared by the replicas and rotated by the guard; with --tls-webhook-configuration and --tls-hosts, instead of --tls-cert-file (docs/eviction-guard.md, \"Certificates\")")
	fs.StringVar(&c.TLSWebhookConfiguration, "tls-webhook-configuration", "", "with --tls-secret, the ValidatingWebhookConfiguration whose caBundle the guard keeps equal to its CA")
	fs.StringSliceVar(&c.TLSHosts, "tls-hosts", nil, "with --tls-secret, the DNS names and IP addresses of the serving certificate (comma-separated)")
	fs.DurationVar(&c.TLSSyncInterval, "tls-sync-interval", time.Minute, "with --tls-secret, how often the guard checks its Secret and caBundle (a re-applied chart, another replica's rotation)")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", 3*time.Second, "on SIGTERM, how long the guard keeps answering, each answer closing its connection and /readyz failing, before it closes the connections left idle: the API server sends a review again on another connection only when nothing of it was written, so closing an idle connection it is reusing refuses that eviction; keep it below the pod's terminationGracePeriodSeconds less 5 s")
	fs.StringVar(&c.ServiceAccount, "agent-service-account", "kube-system:reprieve", "NAMESPACE:NAME of the agent's ServiceAccount, whose evictions the guard binds to their token's node")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", "", "CA bundle (PEM), reloaded when the file changes: reviews must come with a client certificate it verifies, as kube-apiserver presents with an --admission-control-config-file kubeconfig for the webhook; empty: any caller (docs/eviction-guard.md)")
	fs.StringSliceVar(&c.ClientAllowedNames, "client-allowed-names", nil, "with --client-ca-file, the client certificate CommonNames accepted (comma-separated); empty: any the CA signed")
	d := guard.DefaultLimits()
	fs.IntVar(&c.SourceInFlight, "source-reviews-in-flight", d.InFlightPerSource, "reviews one source address may have in flight; past it the guard answers 429 at once")
	fs.IntVar(&c.InFlight, "reviews-in-flight", d.InFlight, "reviews all sources together may have in flight; at least --source-reviews-in-flight")
	fs.Float32Var(&c.SourcePodReads, "source-pod-reads-per-second", d.PodReadsPerSecond, "GETs a second of pods the guard's index has not seen, for one source address's reviews (burst twice that); past it the guard answers 429 at once. Its client may make twice as many in all")
	fs.IntVar(&c.SourceConns, "source-connections", d.ConnsPerSource, "connections one source address may hold open (the API server opens one per review in flight); past it a connection is closed at once")
	fs.IntVar(&c.Conns, "connections", d.Conns, "connections all sources together may hold open, the last quarter kept for sources that hold few; at least --source-connections")
}

// limits are the guard's limits from the flags.
func (c *guardConfig) limits() (guard.Limits, error) {
	l := guard.DefaultLimits()
	l.InFlightPerSource, l.InFlight, l.PodReadsPerSecond = c.SourceInFlight, c.InFlight, c.SourcePodReads
	l.ConnsPerSource, l.Conns = c.SourceConns, c.Conns
	l.PodReadBurst = max(1, int(2*c.SourcePodReads))
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("--source-reviews-in-flight, --reviews-in-flight, --source-pod-reads-per-second, --source-connections, --connections: %w", err)
	}
	return l, nil
}

// username is the agent's ServiceAccount as the API server names it in userInfo.
func (c *guardConfig) username() (string, error) {
	ns, name, ok := strings.Cut(c.ServiceAccount, ":")
	if !ok || ns == "" || name == "" || strings.Contains(name, ":") {
		return "", fmt.Errorf("--agent-service-account %q: want NAMESPACE:NAME", c.ServiceAccount)
	}
	return "system:serviceaccount:" + ns + ":" + name, nil
}

// newGuardCommand is `reprieve eviction-guard`: the validating admission webhook that lets the
// agent's ServiceAccount evict only pods on its token's node (agent/guard, docs/eviction-guard.md).
func newGuardCommand() *cobra.Command {
	var cfg guardConfig
	cmd := &cobra.Command{
		Use:   "eviction-guard",
		Short: "Admission webhook: the agent may evict only pods on its own node",
		Args:  cobra.NoArgs, SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if code := runGuard(cmd.Flags(), &cfg); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	cfg.addFlags(cmd.Flags())
	// Its own usage: the root's lists the agent's flags, which the guard does not take.
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		fmt.Fprintf(c.OutOrStderr(), "Usage: reprieve eviction-guard [flags]\n\nEvery flag also reads $REPRIEVE_GUARD_<FLAG> (dashes as underscores).\n\n%s", c.Flags().FlagUsages())
		return nil
	})
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	cmd.Flags().AddGoFlag(klogFlags.Lookup("v"))
	return cmd
}

// runGuard checks the flags (exit status 2 when they are wrong), then serves until SIGTERM.
func runGuard(fs *pflag.FlagSet, cfg *guardConfig) int {
	if err := config.ApplyEnv(fs, "REPRIEVE_GUARD_", os.LookupEnv); err != nil {
		fmt.Fprintf(os.Stderr, "reprieve eviction-guard: %v\n", err)
		return 2
	}
	user, err := cfg.username()
	if err == nil {
		err = cfg.checkTLS()
	}
	if err == nil && cfg.ShutdownDelay < 0 {
		err = fmt.Errorf("--shutdown-delay %v: want 0 or more", cfg.ShutdownDelay)
	}
	if err == nil && cfg.ClientCAFile == "" && len(cfg.ClientAllowedNames) > 0 {
		err = fmt.Errorf("--client-allowed-names needs --client-ca-file")
	}
	var limits guard.Limits
	if err == nil {
		limits, err = cfg.limits()
	}
	if err == nil {
		err = setupLogging(cfg.LogFormat, verbosity(fs), os.Stderr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "reprieve eviction-guard: %v\n", err)
		return 2
	}
	var certs *guard.CertReloader
	if cfg.TLSSecret == "" {
		certs, err = guard.NewCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile)
	}
	var auth *guard.ClientAuth
	if err == nil && cfg.ClientCAFile != "" {
		auth, err = guard.NewClientAuth(cfg.ClientCAFile, cfg.ClientAllowedNames)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "reprieve eviction-guard: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	if err := serveGuard(ctx, *cfg, user, certs, auth, limits); err != nil {
		logger.Error(err, "The eviction guard failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

// serveGuard wires the client, the metrics and the handler, and serves until ctx ends.
func serveGuard(ctx context.Context, cfg guardConfig, user string, certs *guard.CertReloader, auth *guard.ClientAuth, limits guard.Limits) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the Kubernetes client configuration: %w", err)
	}
	reg := prometheus.NewRegistry()
	if cfg.TLSSecret != "" {
		// Its own client: the pod reads' rate limit below must not hold up a rotation.
		if certs, err = startSelfCert(ctx, cfg, rest.CopyConfig(restCfg), reg); err != nil {
			return err
		}
	}
	// The index's list and watch, and a GET for each pod the index has not seen bound (a pod
	// created a moment ago, or while the watch is down): twice one source's read budget
	// (guard.Limits), so that one source reading all it may leaves the rest to the others, the
	// API server among them.
	restCfg.QPS, restCfg.Burst = 2*limits.PodReadsPerSecond, 2*limits.PodReadBurst
	restCfg.UserAgent = "reprieve-eviction-guard/" + version
	kube.UseProtobuf(restCfg)
	// The guard reads pods only.
	client, err := kube.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := guard.NewMetrics(reg)
	if err != nil {
		return err
	}
	indexMetrics, err := guard.NewIndexMetrics(reg)
	if err != nil {
		return err
	}
	limiter, err := guard.NewLimiter(limits, clock.RealClock{})
	if err != nil {
		return err
	}
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	index := guard.NewPodIndex(indexMetrics)
	// The reckoner counts, off the reclaimed nodes, the pods that outlived their node's deadline
	// (guard.Reckoner): a read of one node's pods per reclaim, a few seconds after it.
	reckonMetrics, err := guard.NewReckonMetrics(reg)
	if err != nil {
		return err
	}
	reckoner := guard.NewReckoner(func(ctx context.Context, node string) ([]v1.Pod, error) {
		l, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return nil, err
		}
		return l.Items, nil
	}, reckonMetrics, clock.RealClock{})
	index.Reckon(reckoner)
	go reckoner.Run(ctx)
	go index.Run(ctx, cache.ToListWatcherWithWatchListSemantics(index.ListWatch(pods.List, pods.Watch), client))
	h := &guard.Handler{Username: user, Metrics: metrics, Limits: limiter, ClientAuth: auth, Pods: index, GetPod: func(ctx context.Context, ns, name string) (*v1.Pod, error) {
		return client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	}}
	if auth == nil {
		klog.FromContext(ctx).Info("Serving reviews from any caller: without --client-ca-file the guard cannot tell the API server's from forged ones, and bounds each source address instead")
	}
	return guard.Serve(ctx, guard.ServerOptions{BindAddress: cfg.BindAddress, Certs: certs, Handler: h, Gatherer: reg,
		MaxConns: limits.Conns, MaxConnsPerSource: limits.ConnsPerSource, Ready: index.IndexReady, ShutdownDelay: cfg.ShutdownDelay})
}

// checkTLS: the guard serves either from files or from the Secret it keeps itself.
func (c *guardConfig) checkTLS() error {
	files := c.TLSCertFile != "" || c.TLSKeyFile != ""
	self := c.TLSSecret != "" || c.TLSWebhookConfiguration != "" || len(c.TLSHosts) > 0
	switch {
	case files && self:
		return fmt.Errorf("--tls-cert-file and --tls-private-key-file, or --tls-secret with --tls-webhook-configuration and --tls-hosts: not both")
	case self:
		if _, _, ok := c.secretName(); !ok || c.TLSWebhookConfiguration == "" || len(c.TLSHosts) == 0 {
			return fmt.Errorf("--tls-secret %q (NAMESPACE/NAME), --tls-webhook-configuration %q and --tls-hosts %q: all three are needed",
				c.TLSSecret, c.TLSWebhookConfiguration, strings.Join(c.TLSHosts, ","))
		}
		if c.TLSSyncInterval < time.Second {
			return fmt.Errorf("--tls-sync-interval %v: want at least 1s", c.TLSSyncInterval)
		}
	case c.TLSCertFile == "" || c.TLSKeyFile == "":
		return fmt.Errorf("--tls-cert-file and --tls-private-key-file are required (or --tls-secret, --tls-webhook-configuration and --tls-hosts)")
	}
	return nil
}

func (c *guardConfig) secretName() (ns, name string, ok bool) {
	ns, name, ok = strings.Cut(c.TLSSecret, "/")
	return ns, name, ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

// startSelfCert syncs the guard's own certificate until a sync succeeds (the guard does not
// listen before it has a pair the webhook's caBundle verifies, so its readiness probe fails
// meanwhile), then keeps it in the background until ctx ends.
func startSelfCert(ctx context.Context, cfg guardConfig, restCfg *rest.Config, reg prometheus.Registerer) (*guard.CertReloader, error) {
	logger := klog.FromContext(ctx)
	ns, name, _ := cfg.secretName()
	restCfg.UserAgent = "reprieve-eviction-guard/" + version
	secrets, hooks, err := guard.NewSelfCertClients(restCfg, ns)
	if err != nil {
		return nil, err
	}
	metrics, err := guard.NewCertMetrics(reg)
	if err != nil {
		return nil, err
	}
	self, err := guard.NewSelfCert(guard.SelfCertOptions{Secrets: secrets, SecretName: name, Webhooks: hooks,
		WebhookName: cfg.TLSWebhookConfiguration, Hosts: cfg.TLSHosts, Clock: clock.RealClock{}, Metrics: metrics})
	if err != nil {
		return nil, err
	}
	retry := max(cfg.TLSSyncInterval/10, time.Second)
	for {
		err := self.Sync(ctx)
		if err == nil {
			break
		}
		metrics.SyncErrors.Inc()
		logger.Error(err, "Making the eviction guard's certificate failed; retrying", "in", retry)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("making the eviction guard's certificate: %w", err)
		case <-time.After(retry):
		}
	}
	go self.Run(ctx, cfg.TLSSyncInterval, clock.RealClock{})
	return guard.NewCertSource(self.Current)
}
