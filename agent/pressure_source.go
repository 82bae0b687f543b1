package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// PressureThresholds is what the levels are computed from: reprieve's thresholds from the flags
// and the kubelet's from its configuration (kr). A flag that does not parse is err; a kubelet
// configuration that could not be read or parsed is kubeletErr (the thresholds then hold the
// kubelet's defaults), which turns only the pressure handling off. A configuration not found is
// no error: kc.Found is false, the thresholds hold the kubelet's defaults, and the caller says
// that they are assumed.
func PressureThresholds(cfg config.Config, kr kubelet.ConfigRead) (t pressure.Thresholds, kc kubelet.Config, kubeletErr, err error) {
	explicit, headroom, reclaim, err := cfg.PressureThresholdsOf()
	if err != nil {
		return t, kc, nil, err
	}
	kc = kr.Config
	if kr.Err != nil {
		kubeletErr = fmt.Errorf("reading the kubelet's eviction thresholds: %w", kr.Err)
		def := kubelet.DefaultConfig()
		kc.Hard, kc.EnforcePodsAllocatable = def.Hard, def.EnforcePodsAllocatable
		kc.ImageGCHighThresholdPercent, kc.ImageGCLowThresholdPercent = def.ImageGCHighThresholdPercent, def.ImageGCLowThresholdPercent
	}
	return pressure.ThresholdsFrom(kc, explicit, headroom, reclaim), kc, kubeletErr, nil
}

// reportKubeletConfig says what the agent read of the kubelet's configuration (kr): the metric
// reprieve_kubelet_config_known, and a log line; an unknown one as an error with the paths tried
// and the fix. New calls it once. The pressure loop's start records the node's
// KubeletConfigUnknown event.
func reportKubeletConfig(m *metrics.Metrics, kr kubelet.ConfigRead) {
	kc, err := kr.Config, kr.Err
	known := 0.0
	if kr.Known() {
		known = 1
	}
	m.KubeletConfigKnown.Reset()
	m.KubeletConfigKnown.WithLabelValues(kc.Path).Set(known)
	logger := klog.Background()
	switch {
	case err != nil:
		logger.Error(err, "The kubelet's configuration could not be read: its eviction thresholds and graceful node shutdown are unknown",
			"fix", KubeletConfigFix)
	case !kc.Found:
		logger.Error(nil, "The kubelet's configuration was not found: its eviction thresholds and graceful node shutdown are unknown; the kubelet's defaults are assumed",
			"searched", kc.Searched, "fix", KubeletConfigFix)
	default:
		logger.Info("Read the kubelet's configuration", "path", kc.Path, "platform", kc.Platform, "dropIns", kc.DropIns,
			"shutdownGracePeriod", kc.ShutdownGracePeriod, "shutdownGracePeriodCriticalPods", kc.ShutdownGracePeriodCriticalPods)
	}
}

// KubeletConfigFix is what to do when the kubelet's configuration is not found.
const KubeletConfigFix = "set --kubelet-config (the chart's pressure.kubeletConfig) to the kubelet's --config file, " +
	"and --kubelet-config-dir to its --config-dir if it has one, and mount that path under --host-root"

// NewPressureSource builds the source --pressure-source names. For the Summary API without
// --kubelet-summary-url, node gives the kubelet's address. It also returns what it reads from.
//
// Outside the host's PID namespace (in a pod), the host source takes the PID limit from the
// kubelet's Summary API when node (or --kubelet-summary-url) gives its address: since Linux 6.14 kernel.pid_max is a setting of each
// PID namespace, so the agent, in its pod's namespace, reads its namespace's pid_max through the
// host's /proc/sys/kernel/pid_max, not the host's that the kubelet evicts by. Until the kubelet
// answers with its limit (RBAC nodes/stats, its port and certificate as for
// --pressure-source=summary), pid_max and threads-max are read as before, and the reason is
// logged once.
func NewPressureSource(cfg config.Config, node *v1.Node) (kubelet.Source, string, error) {
	if cfg.PressureSource == config.PressureSourceHost {
		// PodUsage: each pod's working set and process count from the pods' cgroups, read-only
		// from the /sys/fs/cgroup the chart mounts, so that pods rank as the kubelet ranks them.
		h := &kubelet.HostSource{Root: cfg.HostRoot, KubeletRootDir: cfg.KubeletRootDir, ImageFsDir: cfg.ImageFsDir, PodUsage: true}
		from := cfg.HostRoot
		if inHostPIDNamespace() {
			return h, from, nil
		}
		if sum, url, err := summarySource(cfg, node); err == nil {
			k := &kubelet.KubeletMaxPID{Source: sum, OnError: func(err error) {
				klog.Background().Info("pid.available uses pid_max and threads-max as this PID namespace reads them, which on Linux 6.14 and later are not the host's: the kubelet's own limit could not be read",
					"err", err, "fix", "grant get on nodes/stats and check that the kubelet's port is reachable and its certificate verifies (--kubelet-ca-file, --kubelet-insecure-tls)")
			}}
			h.MaxPID = k.MaxPID
			from += " (the PID limit from " + url + ")"
		}
		return h, from, nil
	}
	src, url, err := summarySource(cfg, node)
	if err != nil {
		return nil, "", err
	}
	return src, url, nil
}

// inHostPIDNamespace says whether the agent runs in the host's (initial) PID namespace, where
// pid_max is the host's; a variable for the tests, which run there. The initial namespace's
// inode number is a constant of the kernel (PROC_PID_INIT_INO, include/linux/proc_ns.h).
var inHostPIDNamespace = func() bool {
	l, err := os.Readlink("/proc/self/ns/pid")
	return err == nil && l == "pid:[4026531836]"
}

// summarySource is the client of the kubelet's Summary API at --kubelet-summary-url or the
// node's address.
func summarySource(cfg config.Config, node *v1.Node) (*kubelet.SummarySource, string, error) {
	url := cfg.KubeletSummaryURL
	if url == "" {
		if node == nil {
			return nil, "", errors.New("finding the kubelet's Summary API: node not found; set --kubelet-summary-url")
		}
		var err error
		if url, err = SummaryURL(node); err != nil {
			return nil, "", err
		}
	}
	token := cfg.KubeletTokenFile
	if _, err := os.Stat(token); err != nil {
		token = ""
	}
	ca := cfg.KubeletCAFile
	if _, err := os.Stat(ca); err != nil || cfg.KubeletInsecureTLS {
		// Outside a pod (or with a plain-HTTP test server) there is no in-cluster CA: the
		// system's roots verify the kubelet then.
		ca = ""
	}
	src, err := kubelet.NewSummarySource(url, ca, token, cfg.KubeletInsecureTLS)
	if err != nil {
		return nil, "", fmt.Errorf("setting up the kubelet's Summary API client: %w", err)
	}
	return src, url, nil
}

// SummaryURL is the kubelet's Summary API on the node's InternalIP and kubelet port.
func SummaryURL(node *v1.Node) (string, error) {
	port := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	if port == 0 {
		port = 10250
	}
	for _, addr := range node.Status.Addresses {
		if addr.Type == v1.NodeInternalIP {
			return "https://" + net.JoinHostPort(addr.Address, strconv.Itoa(port)) + "/stats/summary", nil
		}
	}
	return "", fmt.Errorf("finding the kubelet's Summary API: node %s has no InternalIP; set --kubelet-summary-url", node.Name)
}
