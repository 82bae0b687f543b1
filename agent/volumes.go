package agent

import (
	"fmt"
	"time"
)

// VolumeReleaseAuto is --volume-release's default: the bound computed from the kubelet's
// configuration (VolumeReleaseOf).
const VolumeReleaseAuto = "auto"

// volumeUnmountAllowance is what --volume-release=auto allows the kubelet to unmount and
// unstage a volume once its pod's containers have exited, before the status update that
// publishes it: the volume manager's reconciler runs every 100 ms and a CSI NodeUnstage of a
// block device takes well under a second. Measured on the real node with an attaching CSI
// driver (test/realnode TestVolumeReleasedBeforeReclaimOnRealNode, docs/benchmarks.md): 0.3 to
// 0.5 s from the container's end to the volume unstaged, with csi-test's mock driver, which
// has no device to flush; 5 s keeps room for a real disk's unmount and sync.
const volumeUnmountAllowance = 5 * time.Second

// kubeletStatusJitter is the jitter of the kubelet's node status loop:
// wait.JitterUntil(kl.syncNodeStatus, kl.nodeStatusUpdateFrequency, 0.04, true, ...)
// (pkg/kubelet/kubelet.go, v1.37): a period is up to 4% longer than the frequency.
const kubeletStatusJitter = 0.04

// defaultNodeStatusUpdateFrequency is the kubelet's default nodeStatusUpdateFrequency.
const defaultNodeStatusUpdateFrequency = 10 * time.Second

// parseVolumeRelease reads --volume-release: auto (ok false: computed from the kubelet), off
// (0), or a positive duration.
func parseVolumeRelease(s string) (d time.Duration, fixed bool, err error) {
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

// VolumeReleaseOf is how long before the deadline a pod with a volume that needs attaching must
// be gone (plan.Window.VolumeRelease), and where that figure comes from: --volume-release, or
// the unmount allowance plus one status period of the kubelet (its nodeStatusUpdateFrequency
// with 4% jitter), read from its configuration (kr); the kubelet's default 10 s when the
// configuration is unknown, said so in the source.
func VolumeReleaseOf(cfg Config, kr KubeletRead) (time.Duration, string) {
	d, fixed, err := parseVolumeRelease(cfg.VolumeRelease)
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
	return volumeUnmountAllowance + period, fmt.Sprintf("auto: %s unmount allowance + %s status period (%s)", volumeUnmountAllowance, period, from)
}
