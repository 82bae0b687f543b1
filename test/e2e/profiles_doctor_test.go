package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/test/profiles"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestDoctorReadsPlatformProfiles runs `reprieve doctor` (the real binary, against the real API
// server and a node of the profile) on the host root of each Linux platform profile
// (test/profiles), with --pressure-source=host and no --kubelet-config, as the chart runs it:
// doctor prints the platform's file, its drop-ins, its hard thresholds and its graceful node
// shutdown, and the agent exports reprieve_kubelet_config_known 1 for that file. With the file
// removed, doctor fails with "kubelet configuration not found" naming the platform's path among
// those tried, and the agent records the KubeletConfigUnknown Warning event on its node and
// exports reprieve_kubelet_config_known 0.
//
// The host root holds the profile's files, the empty kubelet root and image store, and links
// to this machine's /proc and /sys, which the host pressure source reads.
func TestDoctorReadsPlatformProfiles(t *testing.T) {
	t.Parallel()
	// The parallel subtests run after this function returns: cancel when they are done.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	for _, p := range profiles.All() {
		if !p.Linux() {
			continue
		}
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			doctorOnProfile(ctx, t, p)
		})
	}
}

// profileHostRoot writes p's host root in a temporary folder: its files, the kubelet's root
// and the image store as empty folders, /proc and /sys linked to this machine's.
func profileHostRoot(t *testing.T, p profiles.Profile) string {
	t.Helper()
	dir := t.TempDir()
	if err := p.WriteHostRoot(dir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"var/lib/kubelet", "var/lib/containerd"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"proc", "sys"} {
		if err := os.Symlink("/"+l, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func doctorOnProfile(ctx context.Context, t *testing.T, p profiles.Profile) {
	node := "doctor-" + p.Name
	createProfileNode(ctx, t, node, p, nil)
	dir := profileHostRoot(t, p)
	hostFlags := []string{"--provider=none", "--pressure-source=host", "--host-root=" + dir,
		"--kubelet-root-dir=/var/lib/kubelet", "--imagefs-dir=/var/lib/containerd"}
	doctor := func() (int, string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, reprieveBin, append([]string{"doctor", "--kubeconfig=" + agentKubeconfig, "--node=" + node}, hostFlags...)...)
		cmd.Env = append(os.Environ(), "NODE_NAME=")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &exit):
			return exit.ExitCode(), string(out)
		}
		t.Fatalf("running reprieve doctor: %v", err)
		return 0, ""
	}
	configPath := filepath.Join(dir, p.ConfigPath)

	// Found: the platform's file, its drop-ins, thresholds and graceful shutdown.
	code, out := doctor()
	shutdown := "off"
	if p.ShutdownGracePeriod > 0 {
		shutdown = fmt.Sprintf("%s (%s of it for critical pods)", p.ShutdownGracePeriod, p.ShutdownGracePeriodCriticalPods)
	}
	line := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "kubelet config") {
			line = l
		}
	}
	wants := []string{"ok    kubelet config " + configPath + " (", "evictionHard " + strings.Join(p.Hard, ","), "; graceful node shutdown " + shutdown}
	for _, d := range p.DropIns {
		wants = append(wants, " with the drop-ins "+filepath.Join(dir, d))
	}
	for _, want := range wants {
		if !strings.Contains(line, want) {
			t.Errorf("doctor's kubelet config line %q lacks %q:\n%s", line, want, out)
		}
	}
	if len(p.DropIns) == 0 && strings.Contains(line, "drop-ins") {
		t.Errorf("doctor names drop-ins the profile has none of: %q", line)
	}
	if code != 0 || strings.Contains(out, "FAIL") {
		t.Errorf("doctor exit %d with the profile's configuration found; want 0 and no failure:\n%s", code, out)
	}
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append([]string{"--kubeconfig=" + agentKubeconfig}, hostFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`reprieve_kubelet_config_known{path=%q} 1`, configPath)
	var metrics string
	waitFor(ctx, t, want, func() bool {
		metrics, _ = scenario.Scrape(addr)
		return strings.Contains(metrics, want)
	})
	_ = rp.Stop()

	// Removed: unknown, in doctor, the event and the metric.
	if err := os.Remove(configPath); err != nil {
		t.Fatal(err)
	}
	code, out = doctor()
	if code != 1 {
		t.Errorf("doctor exit %d with the configuration removed, want 1:\n%s", code, out)
	}
	fail := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "FAIL  kubelet configuration not found") {
			fail = l
		}
	}
	for _, want := range []string{"(tried ", configPath, "eviction thresholds and graceful node shutdown are unknown"} {
		if !strings.Contains(fail, want) {
			t.Errorf("doctor's failure %q lacks %q:\n%s", fail, want, out)
		}
	}
	if n := strings.Count(out, "FAIL"); n != 1 {
		t.Errorf("%d failures, want only the unknown configuration:\n%s", n, out)
	}

	// A second agent on a node of its own, so that its event and log are its own.
	unknown := node + "-unknown"
	createProfileNode(ctx, t, unknown, p, nil)
	rp, addr, err = scenario.StartReprieve(ctx, reprieveBin, logDir, unknown, append([]string{"--kubeconfig=" + agentKubeconfig}, hostFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	// No file found: the path label is empty (kubelet.FindConfig names a path only when given one).
	want = `reprieve_kubelet_config_known{path=""} 0`
	waitFor(ctx, t, want, func() bool {
		metrics, _ = scenario.Scrape(addr)
		return strings.Contains(metrics, want)
	})
	if n := strings.Count(metrics, "reprieve_kubelet_config_known{"); n != 1 {
		t.Errorf("%d reprieve_kubelet_config_known series, want one at 0:\n%s", n, metrics)
	}
	var ev v1.Event
	waitFor(ctx, t, "the "+pressure.ReasonKubeletConfigUnknown+" event", func() bool {
		evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + unknown + ",reason=" + pressure.ReasonKubeletConfigUnknown})
		if err != nil || len(evs.Items) == 0 {
			return false
		}
		ev = evs.Items[0]
		return true
	})
	if ev.Type != v1.EventTypeWarning || !strings.Contains(ev.Message, configPath) || !strings.Contains(ev.Message, "unknown") {
		t.Errorf("event %s %q; want a Warning naming %s and saying unknown", ev.Type, ev.Message, configPath)
	}
	t.Logf("%s: doctor %q; with it removed, doctor's FAIL, the %s %s event and the metric at 0", p.Name, strings.TrimSpace(line), ev.Type, ev.Reason)
}
