package profiles

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// TestFindConfigReadsEachProfile writes each Linux profile's host root and reads it as the agent
// does (kubelet.FindConfig with no path given): the platform's file is found, its drop-ins
// merged, and the thresholds and graceful shutdown are the profile's. With the main file removed
// the configuration is unknown, and every known location is listed as searched.
func TestFindConfigReadsEachProfile(t *testing.T) {
	for _, p := range All() {
		if !p.Linux() {
			continue
		}
		t.Run(p.Name, func(t *testing.T) {
			dir := t.TempDir()
			if err := p.WriteHostRoot(dir); err != nil {
				t.Fatal(err)
			}
			c, err := kubelet.FindConfig(kubelet.Lookup{HostRoot: dir})
			if err != nil {
				t.Fatal(err)
			}
			if !c.Found || c.Path != filepath.Join(dir, p.ConfigPath) {
				t.Errorf("found %v at %s, want %s", c.Found, c.Path, filepath.Join(dir, p.ConfigPath))
			}
			var wantDropIns []string
			for _, d := range p.DropIns {
				wantDropIns = append(wantDropIns, filepath.Join(dir, d))
			}
			if !slices.Equal(c.DropIns, wantDropIns) {
				t.Errorf("drop-ins %v, want %v", c.DropIns, wantDropIns)
			}
			var hard []string
			for _, th := range c.Hard {
				hard = append(hard, th.String())
			}
			if !slices.Equal(hard, p.Hard) {
				t.Errorf("evictionHard %v, want %v", hard, p.Hard)
			}
			if c.ShutdownGracePeriod != p.ShutdownGracePeriod || c.ShutdownGracePeriodCriticalPods != p.ShutdownGracePeriodCriticalPods {
				t.Errorf("graceful shutdown %v (critical %v), want %v (%v)", c.ShutdownGracePeriod, c.ShutdownGracePeriodCriticalPods,
					p.ShutdownGracePeriod, p.ShutdownGracePeriodCriticalPods)
			}

			if err := os.Remove(filepath.Join(dir, p.ConfigPath)); err != nil {
				t.Fatal(err)
			}
			c, err = kubelet.FindConfig(kubelet.Lookup{HostRoot: dir})
			if err != nil {
				t.Fatal(err)
			}
			if c.Found {
				t.Errorf("found %s with the profile's config file removed", c.Path)
			}
			var want []string
			for _, l := range kubelet.Locations {
				want = append(want, filepath.Join(dir, l.Path))
			}
			if !slices.Equal(c.Searched, want) {
				t.Errorf("searched %v, want every known location %v", c.Searched, want)
			}
			if !slices.Contains(c.Searched, filepath.Join(dir, p.ConfigPath)) {
				t.Errorf("searched %v, not the platform's own %s", c.Searched, p.ConfigPath)
			}
		})
	}
}

// TestFindConfigReadsAKSFlagsProfile reads the aks-spot-flags host root as the agent does: the
// flags file alone is the configuration (AKS (kubelet flags)), with its eviction flags. With the
// flags file removed as well it is unknown; with the flags file left and a kubeletconfig.json
// added, the flags override the file's evictionHard.
func TestFindConfigReadsAKSFlagsProfile(t *testing.T) {
	p, err := ByName("aks-spot-flags")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := p.WriteHostRoot(dir); err != nil {
		t.Fatal(err)
	}
	flagsPath := filepath.Join(dir, AKSFlags)
	if st, err := os.Stat(flagsPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("flags file %v %v, want it 0600 as cse_config.sh leaves it", st, err)
	}
	c, err := kubelet.FindConfig(kubelet.Lookup{HostRoot: dir})
	if err != nil {
		t.Fatal(err)
	}
	var hard []string
	for _, th := range c.Hard {
		hard = append(hard, th.String())
	}
	if !c.Found || c.Path != filepath.Join(dir, p.ConfigPath) || c.Platform != "AKS (kubelet flags)" || c.FlagsFile != flagsPath ||
		!slices.Equal(hard, p.Hard) || c.NodeStatusUpdateFrequency != 10*time.Second || c.ShutdownGracePeriod != 0 || c.DropIns != nil {
		t.Errorf("got %+v (evictionHard %v); want the flags file's %v, found as AKS (kubelet flags)", c, hard, p.Hard)
	}
	if want := filepath.Join(dir, AKSConfig); !slices.Contains(c.Searched, want) || c.Searched[len(c.Searched)-1] != flagsPath {
		t.Errorf("searched %v, want AKS's config file tried, then the flags file", c.Searched)
	}

	// Both: the kubelet's flags override the file's values.
	if err := os.WriteFile(filepath.Join(dir, AKSConfig), []byte(`{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "evictionHard": {"memory.available": "100Mi"}, "evictionPressureTransitionPeriod": "1m"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = kubelet.FindConfig(kubelet.Lookup{HostRoot: dir})
	hard = hard[:0]
	for _, th := range c.Hard {
		hard = append(hard, th.String())
	}
	if err != nil || !c.Found || c.Path != filepath.Join(dir, AKSConfig) || !slices.Equal(hard, p.Hard) || c.PressureTransitionPeriod != time.Minute {
		t.Errorf("with a config file too: %+v %v; want the file, its 1m, and the flags' evictionHard %v", c, err, p.Hard)
	}

	for _, f := range []string{AKSConfig, AKSFlags} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	c, err = kubelet.FindConfig(kubelet.Lookup{HostRoot: dir})
	if err != nil || c.Found {
		t.Errorf("found %v at %s (%v) with the flags file removed", c.Found, c.Path, err)
	}
}

// TestNodes checks what every profile's Node carries: its OS label and nodeInfo agree, a
// providerID of its cloud, allocatable below capacity in CPU or memory as the platform reserves,
// and the spot label the chart selects on.
func TestNodes(t *testing.T) {
	spotLabels := map[string]string{
		"karpenter.sh/capacity-type": "spot", "eks.amazonaws.com/capacityType": "SPOT",
		"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-preemptible": "true",
		"kubernetes.azure.com/scalesetpriority": "spot",
	}
	scheme := map[string]string{"aws": "aws:///", "gcp": "gce://", "azure": "azure:///"}
	names := map[string]bool{}
	for _, p := range append(All(), Variants()...) {
		if names[p.Name] {
			t.Errorf("two profiles named %s", p.Name)
		}
		names[p.Name] = true
		n := p.Node("n-" + p.Name)
		if n.Labels["kubernetes.io/os"] != p.OS || n.Status.NodeInfo.OperatingSystem != p.OS {
			t.Errorf("%s: os label %q, nodeInfo %q, want %s", p.Name, n.Labels["kubernetes.io/os"], n.Status.NodeInfo.OperatingSystem, p.OS)
		}
		if n.Labels["kubernetes.io/hostname"] != n.Name {
			t.Errorf("%s: hostname label %q", p.Name, n.Labels["kubernetes.io/hostname"])
		}
		if len(n.Spec.ProviderID) < len(scheme[p.Cloud]) || n.Spec.ProviderID[:len(scheme[p.Cloud])] != scheme[p.Cloud] {
			t.Errorf("%s: providerID %q, want %s...", p.Name, n.Spec.ProviderID, scheme[p.Cloud])
		}
		spot := false
		for k, v := range spotLabels {
			spot = spot || n.Labels[k] == v
		}
		if spot != p.Spot {
			t.Errorf("%s: spot label %v, want %v", p.Name, spot, p.Spot)
		}
		for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, v1.ResourcePods} {
			c, a := n.Status.Capacity[r], n.Status.Allocatable[r]
			if a.Sign() <= 0 || a.Cmp(c) > 0 {
				t.Errorf("%s: %s allocatable %s, capacity %s", p.Name, r, a.String(), c.String())
			}
		}
		if m, c := n.Status.Allocatable[v1.ResourceMemory], n.Status.Capacity[v1.ResourceMemory]; m.Cmp(c) >= 0 {
			t.Errorf("%s: memory allocatable %s not below capacity %s", p.Name, m.String(), c.String())
		}
		if p.Linux() && (p.ConfigPath == "" || len(p.Hard) == 0) {
			t.Errorf("%s: a Linux profile without its expected reading", p.Name)
		}
		if !p.Linux() {
			if err := p.WriteHostRoot(t.TempDir()); err == nil {
				t.Errorf("%s: WriteHostRoot of a %s node succeeded", p.Name, p.OS)
			}
		}
	}
}

// TestReservations pins the platforms' formulas at the profiles' sizes, worked by hand from
// their sources (see the functions).
func TestReservations(t *testing.T) {
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"EKS CPU, 2 cores", eksCPUMillicoresToReserve(2000), 70},
		{"EKS CPU, 4 cores", eksCPUMillicoresToReserve(4000), 80},
		{"EKS CPU, 8 cores", eksCPUMillicoresToReserve(8000), 90},
		{"EKS memory, 29 pods", eksMemoryMebibytesToReserve(29), 574},
		{"EKS memory, 58 pods", eksMemoryMebibytesToReserve(58), 893},
		{"GKE memory, 16 GiB (MiB, floor)", gkeMemoryReserved(16*gi) / mi, 2662},
		{"GKE memory, 4 GiB", gkeMemoryReserved(4 * gi), gi},
		{"AKS memory, 110 pods, 16 GiB", aksMemoryReserved(110, 16*gi), 2250 * mi},
		{"AKS memory, 250 pods, 8 GiB (25%)", aksMemoryReserved(250, 8*gi), 2 * gi},
		{"AKS CPU, 4 cores", aksCPUReserved(4), 140},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
	// Less the user's --eviction-hard memory.available<200Mi, which the kubelet applies over the
	// file's 100Mi (the profile's flags).
	eks := EKSManagedNodeGroup()
	if got := eks.Allocatable.Memory().Value(); got != (8192-574-200)*mi {
		t.Errorf("eks-mng-al2023 allocatable memory %d, want 7418Mi", got)
	}
}
