// Package volumes is what the agent knows of the pods' volumes that attach: how long before the
// deadline such a pod must be gone for the kubelet to release its volume (ReleaseOf), and which
// of the node's volumesInUse are a pod's, read from the API server (NewReader).
package volumes

import (
	"fmt"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// kubeletStatusJitter is the jitter of the kubelet's node status loop:
// wait.JitterUntil(kl.syncNodeStatus, kl.nodeStatusUpdateFrequency, 0.04, true, ...)
// (pkg/kubelet/kubelet.go, v1.37): a period is up to 4% longer than the frequency.
const kubeletStatusJitter = 0.04

// defaultNodeStatusUpdateFrequency is the kubelet's default nodeStatusUpdateFrequency.
const defaultNodeStatusUpdateFrequency = 10 * time.Second

// ReleaseOf is how long before the deadline a pod with a volume that needs attaching must
// be gone (plan.Window.VolumeRelease), and where that figure comes from: --volume-release, or
// the unmount allowance plus one status period of the kubelet (its nodeStatusUpdateFrequency
// with 4% jitter), read from its configuration (kr); the kubelet's default 10 s when the
// configuration is unknown, said so in the source.
func ReleaseOf(cfg config.Config, kr kubelet.ConfigRead) (time.Duration, string) {
	d, fixed, err := config.ParseVolumeRelease(cfg.VolumeRelease)
	if err != nil {
		return 0, "off: " + err.Error()
	}
	if fixed {
		if d == 0 {
			return 0, "off (--volume-release=off)"
		}
		return d, "--volume-release"
	}
	freq, from := defaultNodeStatusUpdateFrequency, "the kubelet's configuration is unknown: its default nodeStatusUpdateFrequency 10s assumed"
	if kc := kr.Config; kr.Known() && kc.NodeStatusUpdateFrequency > 0 {
		freq, from = kc.NodeStatusUpdateFrequency, fmt.Sprintf("nodeStatusUpdateFrequency %s from %s", kc.NodeStatusUpdateFrequency, kc.Path)
	}
	period := freq + time.Duration(kubeletStatusJitter*float64(freq))
	return config.VolumeUnmountAllowance + period, fmt.Sprintf("auto: %s unmount allowance + %s status period (%s)", config.VolumeUnmountAllowance, period, from)
}
