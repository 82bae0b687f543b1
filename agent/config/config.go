// Package config is the agent's configuration: the flags and their environment variables,
// their defaults, and the validation that names each problem by its flag. It reads no file but
// the webhook's Secret files (NotifyConfig) and keeps no state.
package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// Config is everything the agent is told on its command line.
type Config struct {
	Kubeconfig string
	NodeName   string
	// PodName and PodNamespace identify reprieve's own pod (downward API), never evicted.
	PodName, PodNamespace string

	Provider        string
	AWSIMDSEndpoint string
	PollInterval    time.Duration
	// MetadataStaleAfter is how long every metadata source may go without a good answer before
	// the agent says it cannot see (not ready, an event, a metric); see docs/operations.md.
	MetadataStaleAfter time.Duration
	// MaintenanceLead is how long before a scheduled event's start the interruption taint goes
	// on; before that the node only gets MaintenanceTaint.
	MaintenanceLead time.Duration

	InterruptionTaint string
	// InterruptionEviction says who deletes the pods of an interruption (plan.Eviction):
	// reprieve (the default: the taint is written NoSchedule) or kube-controller-manager
	// (NoExecute); the plan reads it as NoExecute either way.
	InterruptionEviction string
	RebalanceTaint       string
	MaintenanceTaint     string
	SafetyMargin         time.Duration
	// VolumeRelease is how long before the deadline a pod with a volume that needs attaching
	// must be gone (plan.Window.VolumeRelease): "auto" (from the kubelet's
	// nodeStatusUpdateFrequency, volumes.ReleaseOf), "off", or a duration.
	VolumeRelease string

	// ApproveEvents lets a cloud that supports it (Azure) start its event early once the node
	// is drained.
	ApproveEvents bool

	// GCP and Azure endpoints and options, and the host root that --provider auto reads DMI
	// data under.
	GCPMetadataEndpoint string
	// GCPMaintenanceNotice is how long after TERMINATE_ON_HOST_MAINTENANCE first appears a GCP
	// VM is stopped, when instance/upcoming-maintenance gives no window. Zero (the default)
	// decides from the VM: GCPGPUMaintenanceNotice for a GPU VM, GCPVMMaintenanceNotice for any
	// other and for one that cannot be told.
	GCPMaintenanceNotice time.Duration
	// GCPGPUMaintenanceNotice and GCPVMMaintenanceNotice are GCE's notices of a GPU VM (one
	// hour) and of any other (60 s); tests shrink them.
	GCPGPUMaintenanceNotice, GCPVMMaintenanceNotice time.Duration
	// GCPPreemptionNotice is the VM's extended preemption notice
	// (scheduling.preemptionNoticeDuration), which the metadata server does not serve; zero is
	// none.
	GCPPreemptionNotice   time.Duration
	AzureIMDSEndpoint     string
	AzureResourceName     string
	AzureFreezeInterrupts bool
	HostRoot              string

	// Local pressure (see docs/pressure.md): where the signals come from, the kubelet's
	// thresholds, reprieve's own, and the taint and eviction behaviour. KubeletConfig and
	// KubeletConfigDir are the kubelet's configuration file and drop-in directory under
	// HostRoot; empty searches the known locations (kubelet.Locations), with their drop-ins.
	PressureSource           string
	KubeletConfig            string
	KubeletConfigDir         string
	KubeletRootDir           string
	ImageFsDir               string
	KubeletSummaryURL        string
	KubeletCAFile            string
	KubeletTokenFile         string
	KubeletInsecureTLS       bool
	PressureThresholds       string
	PressureHeadroom         string
	PressureMinimumReclaim   string
	PressureTransitionPeriod time.Duration
	PressureInterval         time.Duration
	PressureTrendWindow      time.Duration
	PressureTaintEffect      string

	EvictDaemonSetPods bool
	// PodNotice writes the early warning on each pod a notice concerns: the
	// reprieve.io/Interruption condition and the evict-at and reclaim-deadline annotations.
	PodNotice bool
	// NodeConditions keeps the reprieve.io/Interruption condition on the node's status beside the
	// interruption taint; LifecycleConditions also KEP-5683's MaintenancePlanned,
	// DrainInProgress and Drained (agent/record/condition.go).
	NodeConditions, LifecycleConditions bool
	// NoticeBindAddress serves the node-local notice endpoint (noticeapi.go); empty: off.
	NoticeBindAddress string
	// TolerationComparisonOperators matches the cluster's TaintTolerationComparisonOperators
	// feature gate (alpha in 1.35, off by default): Lt/Gt tolerations match only when it is on.
	TolerationComparisonOperators bool
	EvictionWorkers               int
	KubeAPIQPS                    float32
	KubeAPIBurst                  int

	MetricsBindAddress string
	// NodeWriteRefusals is how many node writes refused in a row (403: RBAC, or the admission
	// policy when the token has no node claim) turn the agent NotReady; 0 never does.
	NodeWriteRefusals int
	DryRun            bool
	// LogFormat is text (klog's own) or json (one JSON object per line, through log/slog).
	LogFormat string
	// StopGrace is how long the agent may keep working after SIGTERM to finish an interruption's
	// window; a window that ends later is left to the next agent.
	StopGrace time.Duration

	// Webhook notifications (off without a URL).
	WebhookURL      string
	WebhookTemplate string
	WebhookHeaders  []string
	// WebhookAllowHTTP accepts an http:// webhook URL (the default is https only).
	WebhookAllowHTTP bool
	// WebhookURLFile and WebhookHeadersFile read the URL and headers from files (a mounted
	// Secret), so that they appear in no manifest, flag or log.
	WebhookURLFile     string
	WebhookHeadersFile string
	WebhookTimeout     time.Duration
	WebhookMaxAttempts int
}

// Pressure sources accepted by --pressure-source.
const (
	PressureSourceHost    = "host"
	PressureSourceSummary = "summary"
	PressureSourceOff     = "off"
)

var pressureSources = []string{PressureSourceHost, PressureSourceSummary, PressureSourceOff}

// Provider names accepted by --provider.
var providerNames = []string{"aws", "gcp", "azure", "auto", "none"}

// DefaultConfig returns the defaults that the flags show.
func DefaultConfig() Config {
	return Config{
		Provider:  "auto",
		LogFormat: "text",
		StopGrace: 140 * time.Second,
		// GCE "Handling GPU host maintenance events".
		GCPGPUMaintenanceNotice: time.Hour,
		GCPVMMaintenanceNotice:  time.Minute,
		AWSIMDSEndpoint:         "http://169.254.169.254",
		AzureIMDSEndpoint:       "http://169.254.169.254",
		HostRoot:                "/",
		PollInterval:            time.Second,
		MetadataStaleAfter:      2 * time.Minute,
		MaintenanceLead:         10 * time.Minute,
		InterruptionTaint:       "cloud=spot:NoExecute",
		InterruptionEviction:    string(plan.EvictionReprieve),
		RebalanceTaint:          "reprieve.io/rebalance-recommended=true:PreferNoSchedule",
		MaintenanceTaint:        "reprieve.io/scheduled-maintenance=true:NoSchedule",
		SafetyMargin:            5 * time.Second,
		VolumeRelease:           VolumeReleaseAuto,
		EvictionWorkers:         64,
		PodNotice:               true,
		NodeConditions:          true,

		PressureSource:           PressureSourceHost,
		KubeletRootDir:           "/var/lib/kubelet",
		ImageFsDir:               "/var/lib/containerd",
		KubeletCAFile:            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
		KubeletTokenFile:         "/var/run/secrets/kubernetes.io/serviceaccount/token",
		PressureHeadroom:         "5%",
		PressureTransitionPeriod: time.Minute,
		PressureInterval:         time.Second,
		PressureTrendWindow:      20 * time.Second,
		PressureTaintEffect:      string(v1.TaintEffectNoSchedule),
		// 110 pods (the default max per node) must all be evicted within a second of their
		// planned time: the burst covers them; the idle agent makes no requests but watches.
		KubeAPIQPS:   50,
		KubeAPIBurst: 300,
		// With the host network (AWS) this port is the node's. Not 8080 or 8081 (kube-state-metrics,
		// webhooks, other agents' probes), not 9100-9999 (the Prometheus exporters' range, fully
		// allocated; node_exporter's 9100 is on most nodes), not 10248-10259 (the kubelet,
		// kube-proxy and control plane): a port taken by another host-network pod keeps the
		// agent Pending on that node.
		MetricsBindAddress: DefaultMetricsBindAddress,
		NodeWriteRefusals:  3,
		WebhookTimeout:     notify.DefaultTimeout,
		WebhookMaxAttempts: notify.DefaultMaxAttempts,
	}
}

// DefaultMetricsBindAddress is where /metrics, /healthz and /readyz are served by default.
const DefaultMetricsBindAddress = ":10271"

// AddFlags registers every flag on fs, with c's current values as defaults.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "Path to a kubeconfig file (else $KUBECONFIG, else the in-cluster config).")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "Name of the node this agent runs on (else $NODE_NAME). Required.")
	fs.StringVar(&c.PodName, "pod-name", c.PodName, "Name of reprieve's own pod, never evicted (else $POD_NAME).")
	fs.StringVar(&c.PodNamespace, "pod-namespace", c.PodNamespace, "Namespace of reprieve's own pod (else $POD_NAMESPACE).")
	fs.StringVar(&c.Provider, "provider", c.Provider, "Cloud to watch: "+strings.Join(providerNames, "|")+". 'none' takes the deadline from the node annotation "+record.AnnotationReclaimDeadline+".")
	fs.StringVar(&c.AWSIMDSEndpoint, "aws-imds-endpoint", c.AWSIMDSEndpoint, "Base URL of the EC2 instance metadata service.")
	fs.StringVar(&c.GCPMetadataEndpoint, "gcp-metadata-endpoint", c.GCPMetadataEndpoint, "GCP metadata server, host:port (else $GCE_METADATA_HOST, else metadata.google.internal).")
	fs.DurationVar(&c.GCPMaintenanceNotice, "gcp-maintenance-notice", c.GCPMaintenanceNotice, "GCP: how long after maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE the VM stops, when instance/upcoming-maintenance gives no window. 0: decide from the VM, an hour for a GPU VM (machine family, node accelerators, gke-accelerator label), else 60 s (GCE, Handling GPU host maintenance events).")
	fs.DurationVar(&c.GCPGPUMaintenanceNotice, "gcp-gpu-maintenance-notice", c.GCPGPUMaintenanceNotice, "GCP: the maintenance notice of a VM with GPUs (GCE gives one hour: \"Handling GPU host maintenance events\"); change it only to test.")
	fs.DurationVar(&c.GCPVMMaintenanceNotice, "gcp-vm-maintenance-notice", c.GCPVMMaintenanceNotice, "GCP: the maintenance notice of a VM without GPUs, or one that cannot be told (GCE gives 60 s); change it only to test.")
	fs.DurationVar(&c.GCPPreemptionNotice, "gcp-preemption-notice", c.GCPPreemptionNotice, "GCP: the Spot VM's extended preemption notice (scheduling.preemptionNoticeDuration): preempted=TRUE comes this long before the soft-off, the power-off 30 s after it. 0: none. The metadata server does not serve it.")
	fs.StringVar(&c.AzureIMDSEndpoint, "azure-imds-endpoint", c.AzureIMDSEndpoint, "Base URL of Azure's instance metadata service (Scheduled Events).")
	fs.StringVar(&c.AzureResourceName, "azure-resource-name", c.AzureResourceName, "This machine's name in Scheduled Events' Resources (else from the node's providerID, else IMDS compute.name).")
	fs.BoolVar(&c.AzureFreezeInterrupts, "azure-freeze-interrupts", c.AzureFreezeInterrupts, "Treat an Azure Freeze like a Reboot (evict) instead of a soft notice.")
	fs.BoolVar(&c.ApproveEvents, "azure-approve-events", c.ApproveEvents, "Once the node is drained for an Azure event, approve it (StartRequests) so it starts sooner.")
	fs.StringVar(&c.HostRoot, "host-root", c.HostRoot, "Where the host's filesystem is mounted (DMI data for --provider auto).")
	fs.DurationVar(&c.PollInterval, "poll-interval", c.PollInterval, "How often to poll the metadata service.")
	fs.DurationVar(&c.MetadataStaleAfter, "metadata-stale-after", c.MetadataStaleAfter, "The agent is Ready only while every metadata source has given a good answer within this long (and once each has answered since start); past it the agent reports that it cannot see: not ready, a MetadataUnanswered event, reprieve_metadata_sources_stale.")
	fs.DurationVar(&c.MaintenanceLead, "maintenance-lead", c.MaintenanceLead, "How long before a scheduled maintenance event the interruption taint goes on; before that the node only gets --maintenance-taint.")
	fs.StringVar(&c.InterruptionTaint, "interruption-taint", c.InterruptionTaint, "Taint for a pending interruption, key=value:NoExecute.")
	fs.StringVar(&c.InterruptionEviction, "interruption-eviction", c.InterruptionEviction, "Who deletes the pods of an interruption. reprieve: the interruption taint goes on NoSchedule, which kube-controller-manager's taint-eviction controller ignores, and reprieve alone evicts each pod, through the Eviction API, when the NoExecute taint would have made it due (from the pod's tolerations of it): budgets hold until the pod's last safe moment, then it is deleted with what fits of its grace, and DaemonSet pods run to the end. kube-controller-manager: the taint goes on NoExecute, and that controller deletes each pod when its toleration runs out (a pod without one at once, DaemonSet pods included), with its full grace and past its PodDisruptionBudget; reprieve evicts earlier only what the deadline needs. It still acts while reprieve is down.")
	fs.StringVar(&c.RebalanceTaint, "rebalance-taint", c.RebalanceTaint, "Soft taint for a rebalance recommendation, key=value:Effect; its key must be in reprieve.io/.")
	fs.StringVar(&c.MaintenanceTaint, "maintenance-taint", c.MaintenanceTaint, "Taint for scheduled maintenance further away than --maintenance-lead, key=value:Effect; its key must be in reprieve.io/.")
	fs.DurationVar(&c.SafetyMargin, "safety-margin", c.SafetyMargin, "Every evicted pod must have finished terminating this long before the reclaim deadline.")
	fs.StringVar(&c.VolumeRelease, "volume-release", c.VolumeRelease, "How long before the reclaim deadline a pod with a volume that needs attaching (a claim, a generic ephemeral volume, an in-tree disk) must be gone, so that the kubelet unmounts it and publishes volumesInUse without it before the machine goes and its detach does not wait six minutes: auto (an unmount allowance of "+VolumeUnmountAllowance.String()+" plus the kubelet's nodeStatusUpdateFrequency with its 4% jitter, from --kubelet-config; 10s when unknown), off, or a duration.")
	fs.StringVar(&c.PressureSource, "pressure-source", c.PressureSource, "Where to read memory, disk and PID pressure: host (files under --host-root, as the kubelet computes them), summary (the kubelet's Summary API, RBAC nodes/stats; adds per-pod usage for ranking) or off.")
	fs.StringVar(&c.KubeletConfig, "kubelet-config", c.KubeletConfig, "The kubelet's config file, under --host-root, for its eviction thresholds and graceful node shutdown. Empty: the first found of "+KubeletLocations()+". When no file is found (or the one given is missing) they are unknown: reprieve assumes the kubelet's defaults and says so (doctor, the KubeletConfigUnknown event, reprieve_kubelet_config_known 0).")
	fs.StringVar(&c.KubeletConfigDir, "kubelet-config-dir", c.KubeletConfigDir, "The kubelet's drop-in directory (its --config-dir), under --host-root: the *.conf files in it are merged over the config file in lexical order, as the kubelet does. Empty: the known one of the file found (EKS AL2023's config.json.d, if present), else none.")
	fs.StringVar(&c.KubeletRootDir, "kubelet-root-dir", c.KubeletRootDir, "The kubelet's root directory, under --host-root: its filesystem is nodefs.")
	fs.StringVar(&c.ImageFsDir, "imagefs-dir", c.ImageFsDir, "The container runtime's image store, under --host-root: its filesystem is imagefs (nodefs when absent).")
	fs.StringVar(&c.KubeletSummaryURL, "kubelet-summary-url", c.KubeletSummaryURL, "The kubelet's Summary API for --pressure-source=summary, and for the PID limit with host (default https://<node InternalIP>:<kubelet port>/stats/summary).")
	fs.StringVar(&c.KubeletCAFile, "kubelet-ca-file", c.KubeletCAFile, "CA bundle that signs the kubelet's serving certificate, for its Summary API (--pressure-source=summary, and the PID limit with host).")
	fs.StringVar(&c.KubeletTokenFile, "kubelet-token-file", c.KubeletTokenFile, "Bearer token for the kubelet's Summary API (re-read as it rotates); none when the file does not exist.")
	fs.BoolVar(&c.KubeletInsecureTLS, "kubelet-insecure-tls", c.KubeletInsecureTLS, "Do not verify the kubelet's serving certificate (self-signed kubelet certificates).")
	fs.StringVar(&c.PressureThresholds, "pressure-thresholds", c.PressureThresholds, "reprieve's pressure thresholds in the kubelet's syntax, e.g. 'memory.available<500Mi,nodefs.available<15%'; only these signals are watched. Default: the kubelet's hard thresholds plus --pressure-headroom.")
	fs.StringVar(&c.PressureHeadroom, "pressure-headroom", c.PressureHeadroom, "Share of capacity added to each kubelet hard threshold to give reprieve's, when --pressure-thresholds is empty.")
	fs.StringVar(&c.PressureMinimumReclaim, "pressure-minimum-reclaim", c.PressureMinimumReclaim, "How far above its threshold a signal must come back before the pressure ends, e.g. 'memory.available=200Mi,nodefs.available=1%' (default: the kubelet's evictionMinimumReclaim).")
	fs.DurationVar(&c.PressureTransitionPeriod, "pressure-transition-period", c.PressureTransitionPeriod, "How long a signal must stay above threshold plus minimum reclaim before its pressure taint goes.")
	fs.DurationVar(&c.PressureInterval, "pressure-interval", c.PressureInterval, "How often to read the pressure signals.")
	fs.DurationVar(&c.PressureTrendWindow, "pressure-trend-window", c.PressureTrendWindow, "How far back readings count in a signal's trend (the predictive rule).")
	fs.StringVar(&c.PressureTaintEffect, "pressure-taint-effect", c.PressureTaintEffect, "Effect of the pressure taints reprieve.io/{memory,disk,pid}-pressure: NoSchedule or PreferNoSchedule.")
	fs.BoolVar(&c.EvictDaemonSetPods, "evict-daemonset-pods", c.EvictDaemonSetPods, "Evict DaemonSet pods too (kubectl drain does not).")
	fs.BoolVar(&c.PodNotice, "pod-notice", c.PodNotice, "At a notice, mark every pod it concerns (planned for eviction, or tolerating it forever) with the condition reprieve.io/Interruption and the annotations reprieve.io/evict-at and reprieve.io/reclaim-deadline, through pods/status; withdrawn with the notice.")
	fs.BoolVar(&c.NodeConditions, "node-conditions", c.NodeConditions, "Set the node condition reprieve.io/Interruption beside the interruption taint (True with the notice's reason, deadline and source; False once withdrawn), through nodes/status.")
	fs.BoolVar(&c.LifecycleConditions, "lifecycle-conditions", c.LifecycleConditions, "Also set Kubernetes' node lifecycle conditions MaintenancePlanned, DrainInProgress and Drained (KEP-5683, alpha in 1.37 behind the NodeLifecycleConditions feature gate; turn it on where the cluster runs with the gate). Needs --node-conditions.")
	fs.StringVar(&c.NoticeBindAddress, "notice-bind-address", c.NoticeBindAddress, "Serve GET /v1/pods/{namespace}/{name}/notice here (e.g. :10272) for pods of this node to read their own notice without API credentials (?wait=true waits for a change); empty: off.")
	fs.BoolVar(&c.TolerationComparisonOperators, "toleration-comparison-operators", c.TolerationComparisonOperators, "Match Lt/Gt tolerations, as with the cluster's TaintTolerationComparisonOperators feature gate.")
	fs.IntVar(&c.EvictionWorkers, "eviction-workers", c.EvictionWorkers, "How many evictions may be in flight at once.")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "Sustained requests per second to the API server.")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "Burst of requests to the API server (evictions due at the same instant).")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "Address to serve /metrics, /healthz and /readyz on; empty or 0 to disable.")
	fs.BoolVar(&c.DryRun, "dry-run", c.DryRun, "Log what would be done; change nothing on the cluster.")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "Log format: text (klog's) or json (one JSON object per line).")
	fs.DurationVar(&c.StopGrace, "stop-grace", c.StopGrace, "On SIGTERM during an interruption, keep carrying out the plan until the window's end if it ends within this long (keep it under the pod's terminationGracePeriodSeconds); a later window is left to the next agent.")
	fs.StringVar(&c.WebhookURL, "webhook-url", c.WebhookURL, "POST a message here when a notice arrives and when it has been handled (off when empty).")
	fs.StringVar(&c.WebhookTemplate, "webhook-template", c.WebhookTemplate, "Go template for the webhook body (default: Slack's {\"text\": ...}).")
	fs.StringArrayVar(&c.WebhookHeaders, "webhook-header", c.WebhookHeaders, "Header for webhook requests, 'Name: value'; repeatable.")
	fs.IntVar(&c.NodeWriteRefusals, "node-write-refusals", c.NodeWriteRefusals, "Consecutive refused writes of the agent's own node (403 from RBAC or the admission policy; a server-side dry run checks at start and every 10 minutes) after which /readyz fails, as the node is unprotected; 0 never fails it.")
	fs.BoolVar(&c.WebhookAllowHTTP, "webhook-allow-http", c.WebhookAllowHTTP, "Accept an http:// webhook URL; without it only https:// is (the message and headers would cross the network in the clear). Redirects are never followed.")
	fs.StringVar(&c.WebhookURLFile, "webhook-url-file", c.WebhookURLFile, "Read the webhook URL from this file (a mounted Secret) instead of --webhook-url; it is never logged.")
	fs.StringVar(&c.WebhookHeadersFile, "webhook-headers-file", c.WebhookHeadersFile, "Read more webhook headers from this file (a mounted Secret), one 'Name: value' per line; never logged.")
	fs.DurationVar(&c.WebhookTimeout, "webhook-timeout", c.WebhookTimeout, "Timeout of one webhook attempt.")
	fs.IntVar(&c.WebhookMaxAttempts, "webhook-max-attempts", c.WebhookMaxAttempts, "Attempts per webhook message (429, 5xx and connection errors are retried with backoff).")
}

// NotifyConfig is the webhook configuration the flags describe; ok is false when webhooks are off.
// The files are read once, at start: a rotated Secret takes effect when the agent restarts.
func (c *Config) NotifyConfig() (cfg notify.Config, ok bool, err error) {
	url := c.WebhookURL
	if c.WebhookURLFile != "" {
		if url != "" {
			return cfg, true, errors.New("give --webhook-url or --webhook-url-file, not both")
		}
		b, err := os.ReadFile(c.WebhookURLFile)
		if err != nil {
			return cfg, true, fmt.Errorf("--webhook-url-file: %w", err)
		}
		if url = strings.TrimSpace(string(b)); url == "" {
			return cfg, true, fmt.Errorf("--webhook-url-file %s: empty", c.WebhookURLFile)
		}
	}
	if url == "" {
		if c.WebhookHeadersFile != "" {
			return cfg, true, errors.New("--webhook-headers-file without a webhook URL")
		}
		return cfg, false, nil
	}
	headers := slices.Clone(c.WebhookHeaders)
	if c.WebhookHeadersFile != "" {
		b, err := os.ReadFile(c.WebhookHeadersFile)
		if err != nil {
			return cfg, true, fmt.Errorf("--webhook-headers-file: %w", err)
		}
		for line := range strings.Lines(string(b)) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				headers = append(headers, line)
			}
		}
	}
	cfg = notify.DefaultConfig()
	cfg.URL, cfg.Template, cfg.Timeout, cfg.MaxAttempts = url, c.WebhookTemplate, c.WebhookTimeout, c.WebhookMaxAttempts
	cfg.AllowHTTP = c.WebhookAllowHTTP
	if cfg.Headers, err = notify.ParseHeaders(headers); err != nil {
		return cfg, true, err
	}
	return cfg, true, cfg.Validate()
}

// ApplyEnv gives every flag that was not set on the command line the value of the environment
// variable prefix + FLAG_IN_CAPS (dashes become underscores), for example REPRIEVE_NODE_NAME.
// A value that does not parse is an error naming both the variable and the flag.
func ApplyEnv(fs *pflag.FlagSet, prefix string, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q for flag --%s (from $%s): %w", v, f.Name, name, err))
		}
	})
	return errors.Join(errs...)
}

// ApplyFallbacks fills unset values from the conventional variables of the downward API:
// NODE_NAME, POD_NAME, POD_NAMESPACE. ($KUBECONFIG, which may list several files, is read by
// client-go's loading rules when --kubeconfig is not given.)
func (c *Config) ApplyFallbacks(lookup func(string) (string, bool)) {
	fill := func(dst *string, name string) {
		if *dst == "" {
			if v, ok := lookup(name); ok {
				*dst = v
			}
		}
	}
	fill(&c.NodeName, "NODE_NAME")
	fill(&c.PodName, "POD_NAME")
	fill(&c.PodNamespace, "POD_NAMESPACE")
}

// Validate reports every problem with the configuration at once. It changes nothing and reads
// no file but the webhook's (NotifyConfig).
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	known := false
	for _, p := range providerNames {
		known = known || c.Provider == p
	}
	if !known {
		errs = append(errs, fmt.Errorf("--provider %q: must be one of %s", c.Provider, strings.Join(providerNames, ", ")))
	}
	if c.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("--stop-grace %s: must not be negative", c.StopGrace))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"gcp-maintenance-notice", c.GCPMaintenanceNotice}, {"gcp-preemption-notice", c.GCPPreemptionNotice}} {
		if f.d < 0 || f.d > 24*time.Hour {
			errs = append(errs, fmt.Errorf("--%s %s: must be between 0 (unset) and 24h", f.name, f.d))
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"gcp-gpu-maintenance-notice", c.GCPGPUMaintenanceNotice}, {"gcp-vm-maintenance-notice", c.GCPVMMaintenanceNotice}} {
		if f.d <= 0 || f.d > 24*time.Hour {
			errs = append(errs, fmt.Errorf("--%s %s: must be positive and at most 24h", f.name, f.d))
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: must be text or json", c.LogFormat))
	}
	if c.MetadataStaleAfter < 30*time.Second {
		errs = append(errs, fmt.Errorf("--metadata-stale-after %s: must be at least 30s (a GCP hanging GET may take 15 s to answer)", c.MetadataStaleAfter))
	}
	if c.PollInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--poll-interval %s: must be at least 100ms (IMDS throttles faster clients)", c.PollInterval))
	}
	if c.MaintenanceLead < 0 {
		errs = append(errs, fmt.Errorf("--maintenance-lead %s: must not be negative", c.MaintenanceLead))
	}
	if c.SafetyMargin < 0 {
		errs = append(errs, fmt.Errorf("--safety-margin %s: must not be negative", c.SafetyMargin))
	}
	if _, _, err := ParseVolumeRelease(c.VolumeRelease); err != nil {
		errs = append(errs, err)
	}
	if t, err := ParseTaint(c.InterruptionTaint); err != nil {
		errs = append(errs, fmt.Errorf("--interruption-taint: %w", err))
	} else if t.Effect != v1.TaintEffectNoExecute {
		// The eviction schedule is the upstream NoExecute schedule: with another effect no pod
		// would be due and kube-controller-manager would not act either. The NoSchedule taint
		// that keeps kube-controller-manager out is --interruption-eviction=reprieve's.
		errs = append(errs, fmt.Errorf("--interruption-taint %q: effect must be NoExecute (for a NoSchedule taint that keeps kube-controller-manager's taint eviction out, set --interruption-eviction=reprieve)", c.InterruptionTaint))
	}
	if !slices.Contains(plan.Evictions, plan.Eviction(c.InterruptionEviction)) {
		errs = append(errs, fmt.Errorf("--interruption-eviction %q: must be kube-controller-manager or reprieve", c.InterruptionEviction))
	}
	for _, f := range []struct{ name, value string }{{"rebalance-taint", c.RebalanceTaint}, {"maintenance-taint", c.MaintenanceTaint}} {
		t, err := ParseTaint(f.value)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.name, err))
			continue
		}
		if !strings.HasPrefix(t.Key, "reprieve.io/") {
			errs = append(errs, fmt.Errorf("--%s %q: key must be in the reprieve.io/ domain, which only reprieve writes", f.name, f.value))
		}
		if t.Effect == v1.TaintEffectNoExecute {
			errs = append(errs, fmt.Errorf("--%s %q: a soft notice must not evict; use NoSchedule or PreferNoSchedule", f.name, f.value))
		}
	}
	errs = append(errs, c.validatePressure()...)
	if c.LifecycleConditions && !c.NodeConditions {
		errs = append(errs, errors.New("--lifecycle-conditions needs --node-conditions: both are written through nodes/status, which --node-conditions=false leaves alone"))
	}
	if c.NodeWriteRefusals < 0 {
		errs = append(errs, fmt.Errorf("--node-write-refusals %d: must be 0 (never NotReady) or more", c.NodeWriteRefusals))
	}
	if c.EvictionWorkers < 1 {
		errs = append(errs, fmt.Errorf("--eviction-workers %d: must be at least 1", c.EvictionWorkers))
	}
	if _, _, err := c.NotifyConfig(); err != nil {
		errs = append(errs, fmt.Errorf("--webhook-*: %w", err))
	}
	if c.KubeAPIQPS <= 0 || c.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps %v, --kube-api-burst %d: must be positive", c.KubeAPIQPS, c.KubeAPIBurst))
	}
	return errors.Join(errs...)
}

// ParseTaint parses a taint in kubectl's syntax, key[=value]:Effect, and validates its parts as
// the API server would.
func ParseTaint(s string) (v1.Taint, error) {
	var t v1.Taint
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return t, fmt.Errorf("taint %q: want key[=value]:Effect", s)
	}
	key, value, _ := strings.Cut(kv, "=")
	t.Key, t.Value, t.Effect = key, value, v1.TaintEffect(effect)
	var errs []error
	for _, msg := range validation.IsQualifiedName(key) {
		errs = append(errs, fmt.Errorf("taint %q: key: %s", s, msg))
	}
	if value != "" {
		for _, msg := range validation.IsValidLabelValue(value) {
			errs = append(errs, fmt.Errorf("taint %q: value: %s", s, msg))
		}
	}
	switch t.Effect {
	case v1.TaintEffectNoExecute, v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule:
	default:
		errs = append(errs, fmt.Errorf("taint %q: effect %q must be NoSchedule, PreferNoSchedule or NoExecute", s, effect))
	}
	return t, errors.Join(errs...)
}

// PressureThresholdsOf parses the pressure flags: reprieve's explicit thresholds, the headroom
// as a fraction and the minimum reclaims (nil when not given).
func (c *Config) PressureThresholdsOf() (explicit []kubelet.Threshold, headroom float64, reclaim map[kubelet.Signal]kubelet.Threshold, err error) {
	var errs []error
	if explicit, err = kubelet.ParseThresholds(c.PressureThresholds); err != nil {
		errs = append(errs, fmt.Errorf("--pressure-thresholds: %w", err))
	}
	if headroom, err = parsePercent(c.PressureHeadroom); err != nil {
		errs = append(errs, fmt.Errorf("--pressure-headroom: %w", err))
	}
	if c.PressureMinimumReclaim != "" {
		if reclaim, err = kubelet.ParseMinimumReclaim(c.PressureMinimumReclaim); err != nil {
			errs = append(errs, fmt.Errorf("--pressure-minimum-reclaim: %w", err))
		}
	}
	return explicit, headroom, reclaim, errors.Join(errs...)
}

// parsePercent parses "5%" (or "0.05") into a fraction in [0, 1).
func parsePercent(s string) (float64, error) {
	v, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want a percentage such as 5%%", s)
	}
	if pct {
		f /= 100
	}
	if f < 0 || f >= 1 || math.IsNaN(f) {
		return 0, fmt.Errorf("%q: must be at least 0%% and below 100%%", s)
	}
	return f, nil
}

func (c *Config) validatePressure() []error {
	var errs []error
	if !slices.Contains(pressureSources, c.PressureSource) {
		errs = append(errs, fmt.Errorf("--pressure-source %q: must be one of %s", c.PressureSource, strings.Join(pressureSources, ", ")))
	}
	if c.PressureSource == PressureSourceOff {
		return errs
	}
	if _, _, _, err := c.PressureThresholdsOf(); err != nil {
		errs = append(errs, err)
	}
	switch v1.TaintEffect(c.PressureTaintEffect) {
	case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule:
	default:
		errs = append(errs, fmt.Errorf("--pressure-taint-effect %q: must be NoSchedule or PreferNoSchedule (pressure evictions are ranked and graceful, never by taint)", c.PressureTaintEffect))
	}
	if c.PressureInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--pressure-interval %s: must be at least 100ms", c.PressureInterval))
	}
	if c.PressureTrendWindow < 3*c.PressureInterval {
		errs = append(errs, fmt.Errorf("--pressure-trend-window %s: must hold at least 3 readings (3 x --pressure-interval %s)", c.PressureTrendWindow, c.PressureInterval))
	}
	if c.PressureTransitionPeriod < 0 {
		errs = append(errs, fmt.Errorf("--pressure-transition-period %s: must not be negative", c.PressureTransitionPeriod))
	}
	if c.KubeletSummaryURL != "" {
		if u, err := url.Parse(c.KubeletSummaryURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--kubelet-summary-url %q: want an http(s) URL", c.KubeletSummaryURL))
		}
	}
	return errs
}

// VolumeReleaseAuto is --volume-release's default: the bound computed from the kubelet's
// configuration (volumes.ReleaseOf).
const VolumeReleaseAuto = "auto"

// ParseVolumeRelease reads --volume-release: auto (ok false: computed from the kubelet), off
// (0), or a positive duration.
func ParseVolumeRelease(s string) (d time.Duration, fixed bool, err error) {
	switch s {
	case VolumeReleaseAuto, "":
		return 0, false, nil
	case "off":
		return 0, true, nil
	}
	d, err = time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("--volume-release %q: want auto, off or a positive duration such as 20s", s)
	}
	return d, true, nil
}

// KubeletLocations lists the known locations of the kubelet's configuration, for the flag's help.
func KubeletLocations() string {
	var s []string
	for _, l := range kubelet.Locations {
		s = append(s, l.Path+" ("+l.Platform+")")
	}
	return strings.Join(s, ", ")
}

// TaintSet parses c's taints; Validate has checked that they parse.
func (c *Config) TaintSet() plan.TaintSet {
	var ts plan.TaintSet
	ts.Interruption, _ = ParseTaint(c.InterruptionTaint)
	if plan.Eviction(c.InterruptionEviction) == plan.EvictionReprieve {
		// Written NoSchedule, so that kube-controller-manager's taint eviction leaves the
		// pods to reprieve; the plan reads it as NoExecute (plan.EvictingTaints).
		ts.Interruption.Effect = v1.TaintEffectNoSchedule
	}
	ts.Rebalance, _ = ParseTaint(c.RebalanceTaint)
	ts.Maintenance, _ = ParseTaint(c.MaintenanceTaint)
	return ts
}

// PodFilter is the pods c leaves alone whatever the taints.
func (c *Config) PodFilter() plan.PodFilter {
	return plan.PodFilter{EvictDaemonSetPods: c.EvictDaemonSetPods, SelfNamespace: c.PodNamespace, SelfName: c.PodName}
}

// VolumeUnmountAllowance is what --volume-release=auto allows the kubelet to unmount and
// unstage a volume once its pod's containers have exited, before the status update that
// publishes it: the volume manager's reconciler runs every 100 ms and a CSI NodeUnstage of a
// block device takes well under a second. Measured on the real node with an attaching CSI
// driver (test/realnode TestVolumeReleasedBeforeReclaimOnRealNode, docs/benchmarks.md): 0.3 to
// 0.5 s from the container's end to the volume unstaged, with csi-test's mock driver, which
// has no device to flush; 5 s keeps room for a real disk's unmount and sync.
const VolumeUnmountAllowance = 5 * time.Second

// KubeletLookup is where the flags say the kubelet's configuration is: --kubelet-config and
// --kubelet-config-dir under --host-root, or the known locations (kubelet.FindConfig).
func (c *Config) KubeletLookup() kubelet.Lookup {
	return kubelet.Lookup{HostRoot: c.HostRoot, Path: c.KubeletConfig, DropInDir: c.KubeletConfigDir}
}
