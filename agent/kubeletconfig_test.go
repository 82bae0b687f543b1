package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// writeKubeletConfig writes a kubelet configuration file at the host path p under root.
func writeKubeletConfig(t *testing.T, root, p, body string) {
	t.Helper()
	path := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestKubeletConfigReadOnce: the agent reads the kubelet's configuration once, in New, and
// hands that read as a value to the interruption plan's shutdown cut and the pressure
// thresholds, so that both come from the same file as it was; Validate reads nothing and
// changes nothing; a new read (another process, doctor) sees the file as it is now, and
// another path is another read.
func TestKubeletConfigReadOnce(t *testing.T) {
	root := t.TempDir()
	const gke = "/home/kubernetes/kubelet-config.yaml"
	writeKubeletConfig(t, root, gke, "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\nevictionHard:\n  memory.available: 200Mi\n")
	cfg := config.DefaultConfig()
	cfg.NodeName, cfg.HostRoot = "n1", root
	unvalidated := cfg
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, unvalidated) {
		t.Errorf("Validate changed the configuration: %+v, was %+v", cfg, unvalidated)
	}
	h := newHarness(t, func(c *config.Config) { c.HostRoot = root }, testNode())
	if got := shutdownCut(h.a.kubelet); got != 15*time.Second {
		t.Fatalf("shutdownCut = %v, want 30s - 15s", got)
	}
	// The file changes after the first read: the same run keeps what it read.
	writeKubeletConfig(t, root, gke, "evictionHard:\n  memory.available: 900Mi\n")
	_, kc, kcErr, err := PressureThresholds(h.a.cfg, h.a.kubelet)
	if err != nil || kcErr != nil || !kc.Found || kc.Platform != "GKE" || kc.ShutdownGracePeriod != 30*time.Second ||
		len(kc.Hard) != 1 || kc.Hard[0].String() != "memory.available<200Mi" {
		t.Errorf("second use: %+v %v %v, want the first read (GKE, 30s, 200Mi)", kc, kcErr, err)
	}
	if kr := kubelet.Find(unvalidated.KubeletLookup()); kr.Err != nil || kr.Config.ShutdownGracePeriod != 0 || kr.Config.Hard[0].String() != "memory.available<900Mi" {
		t.Errorf("a new read: %+v %v, want the new file", kr.Config, kr.Err)
	}
	elsewhere := cfg
	elsewhere.KubeletConfig = "/elsewhere.yaml"
	kr := kubelet.Find(elsewhere.KubeletLookup())
	if kr.Err != nil || kr.Config.Found || kr.Config.Path != filepath.Join(root, "/elsewhere.yaml") {
		t.Errorf("another path: %+v %v, want it read (unknown: missing)", kr.Config, kr.Err)
	}
	if got := shutdownCut(kr); got != 0 {
		t.Errorf("shutdownCut with the config unknown = %v, want 0", got)
	}
}

// TestKubeletConfigReported: the agent says whether it found the kubelet's configuration, with
// pressure handling off too (the shutdown grace is still read): reprieve_kubelet_config_known,
// and with pressure on a KubeletConfigUnknown event on the node at the loop's start.
func TestKubeletConfigReported(t *testing.T) {
	const gke = "/home/kubernetes/kubelet-config.yaml"
	tests := []struct {
		name      string
		file      string // under the host root; "" none
		explicit  string
		pressure  bool
		known     float64
		path      string // the metric's label, under the host root
		wantEvent bool
		cut       time.Duration
	}{
		{name: "found, pressure off", file: gke, known: 1, path: gke, cut: 15 * time.Second},
		{name: "not found, pressure off", known: 0, path: ""},
		{name: "found, pressure on", file: gke, pressure: true, known: 1, path: gke, cut: 15 * time.Second},
		{name: "not found, pressure on", pressure: true, known: 0, path: "", wantEvent: true},
		{name: "explicit path missing", file: gke, explicit: "/etc/kubelet.yaml", pressure: true, known: 0, path: "/etc/kubelet.yaml", wantEvent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.file != "" {
				writeKubeletConfig(t, root, tt.file, "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\n")
			}
			h := newHarness(t, func(c *config.Config) {
				if tt.pressure {
					pressureConfig(t)(c)
				}
				c.HostRoot, c.KubeletConfig = root, tt.explicit
			}, testNode())
			label := ""
			if tt.path != "" {
				label = filepath.Join(root, tt.path)
			}
			if got := testutil.ToFloat64(h.a.metrics.KubeletConfigKnown.WithLabelValues(label)); got != tt.known {
				t.Errorf("reprieve_kubelet_config_known{path=%q} = %v, want %v", label, got, tt.known)
			}
			if n := testutil.CollectAndCount(h.a.metrics.KubeletConfigKnown); n != 1 {
				t.Errorf("%d series of reprieve_kubelet_config_known, want 1", n)
			}
			if got := shutdownCut(h.a.kubelet); got != tt.cut {
				t.Errorf("shutdownCut = %v, want %v", got, tt.cut)
			}
			if tt.pressure {
				h.src.memory(4096)
				if err := h.a.startPressure(h.ctx); err != nil {
					t.Fatal(err)
				}
			}
			var unknown []string
			for _, e := range h.drainEvents() {
				if strings.Contains(e, pressure.ReasonKubeletConfigUnknown) {
					unknown = append(unknown, e)
				}
			}
			if !tt.wantEvent {
				if len(unknown) != 0 {
					t.Errorf("events %v, want no %s", unknown, pressure.ReasonKubeletConfigUnknown)
				}
				return
			}
			want := filepath.Join(root, "/var/lib/kubelet/config.yaml")
			if tt.explicit != "" {
				want = filepath.Join(root, tt.explicit)
			}
			if len(unknown) != 1 || !strings.HasPrefix(unknown[0], "Warning "+pressure.ReasonKubeletConfigUnknown) ||
				!strings.Contains(unknown[0], want) || !strings.Contains(unknown[0], "memory.available<100Mi") {
				t.Errorf("events %v, want one Warning %s naming %s and the defaults assumed", unknown, pressure.ReasonKubeletConfigUnknown, want)
			}
		})
	}
}
