package nodeenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// KubeletConfig is the kubelet's configuration file.
type KubeletConfig = kubeletv1beta1.KubeletConfiguration

// kubeletReadyTimeout bounds the wait for the node to turn Ready after the kubelet starts.
const kubeletReadyTimeout = 60 * time.Second

// defaultKubeletConfig is what this machine needs (cgroup v1 without systemd, no swap
// accounting, containerd at the node's socket) and what the tests rely on: the Summary API
// open to anyone on loopback and the node's address (anonymous, AlwaysAllow: the test bed has no
// kubelet client certificates), the kernel's memory-cgroup notifications so that the kubelet
// sees memory.available cross its threshold at once rather than at its next 10 s pass, and
// eviction thresholds that Kubelet may change.
func defaultKubeletConfig(n *Node) KubeletConfig {
	return KubeletConfig{
		TypeMeta:                 metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		FailCgroupV1:             ptr.To(false),
		CgroupDriver:             "cgroupfs",
		ContainerRuntimeEndpoint: "unix://" + n.Socket,
		FailSwapOn:               ptr.To(false),
		Address:                  NodeIP,
		Port:                     int32(n.KubeletPort),
		ReadOnlyPort:             0,
		HealthzPort:              ptr.To[int32](0),
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(true)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:           kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		PodLogsDir:              filepath.Join(n.RootDir, "pod-logs"),
		KernelMemcgNotification: true,
		MaxPods:                 30,
		// The test images are imported, never pulled: garbage collection must leave them.
		ImageGCHighThresholdPercent: ptr.To[int32](100),
		ImageGCLowThresholdPercent:  ptr.To[int32](99),
		EvictionHard: map[string]string{
			"memory.available":  "100Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		EvictionPressureTransitionPeriod: metav1.Duration{Duration: 10 * time.Second},
		SerializeImagePulls:              ptr.To(false),
		ResolverConfig:                   ptr.To(""),
	}
}

// Config returns the kubelet's current configuration.
func (n *Node) Config() KubeletConfig {
	n.mu.Lock()
	defer n.mu.Unlock()
	return *n.config.DeepCopy()
}

// RestartKubelet stops the kubelet, applies change to its configuration, starts it again and
// waits until the node is Ready. Running containers survive, as with a kubelet restart on any
// node.
func (n *Node) RestartKubelet(ctx context.Context, change func(*KubeletConfig)) error {
	n.StopKubelet()
	n.mu.Lock()
	if change != nil {
		change(&n.config)
	}
	n.mu.Unlock()
	return n.startKubelet(ctx)
}

// StopKubelet stops the kubelet if it runs.
func (n *Node) StopKubelet() {
	n.mu.Lock()
	k := n.kubelet
	n.kubelet = nil
	n.mu.Unlock()
	if k != nil {
		_ = k.Stop()
	}
}

func (n *Node) startKubelet(ctx context.Context) error {
	n.mu.Lock()
	cfg := n.config
	n.mu.Unlock()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("writing the kubelet's configuration: %w", err)
	}
	if err := os.WriteFile(n.KubeletConfigPath, b, 0o644); err != nil {
		return err
	}
	var labels []string
	for k, v := range n.opts.Labels {
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	args := []string{
		"--config=" + n.KubeletConfigPath,
		"--kubeconfig=" + n.opts.Env.Kubeconfig,
		"--hostname-override=" + n.Name,
		"--root-dir=" + n.RootDir,
		"--cert-dir=" + filepath.Join(n.RootDir, "pki"),
		"--node-ip=" + NodeIP,
		"--v=2",
	}
	if len(labels) > 0 {
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	p, err := testenv.StartProcess(ctx, "kubelet", filepath.Join(n.LogDir, "kubelet.log"), filepath.Join(n.toolsBin, KubeletBin), args, nil)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	return n.WaitReady(ctx, kubeletReadyTimeout)
}

// KubeletLog returns the path of the kubelet's log.
func (n *Node) KubeletLog() string { return filepath.Join(n.LogDir, "kubelet.log") }

// SummaryURL is the kubelet's Summary API.
func (n *Node) SummaryURL() string {
	return fmt.Sprintf("https://%s:%d/stats/summary", NodeIP, n.KubeletPort)
}
