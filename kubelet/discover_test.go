package kubelet

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeHostFile writes content at the host path p under root.
func writeHostFile(t *testing.T, root, p, content string) {
	t.Helper()
	path := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, content)
}

// under gives each host path under root.
func under(root string, paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Join(root, p)
	}
	return out
}

// locationPaths are the Locations' paths up to and including the one of platform.
func locationPaths(t *testing.T, platform string) []string {
	t.Helper()
	var out []string
	for _, loc := range Locations {
		out = append(out, loc.Path)
		if loc.Platform == platform {
			return out
		}
	}
	t.Fatalf("no location for %q", platform)
	return nil
}

// TestFindConfigPlatforms puts each platform's file where its bootstrap writes it, in the format
// it writes, and finds it under the host root.
func TestFindConfigPlatforms(t *testing.T) {
	tests := []struct {
		platform, path, content, hard string
	}{
		{
			platform: "EKS AL2023 (nodeadm)", path: "/etc/kubernetes/kubelet/config.json",
			content: `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"5%"}}`,
			hard:    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%",
		},
		{
			platform: "EKS AL2", path: "/etc/kubernetes/kubelet/kubelet-config.json",
			content: `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"memory.available":"200Mi"}}`,
			hard:    "memory.available<200Mi",
		},
		{
			platform: "Bottlerocket", path: "/etc/kubernetes/kubelet/config",
			content: hdr + "evictionHard:\n  memory.available: 300Mi\n  nodefs.available: 10%\n",
			hard:    "memory.available<300Mi,nodefs.available<10%",
		},
		{
			platform: "GKE", path: "/home/kubernetes/kubelet-config.yaml",
			content: hdr + "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\n  nodefs.inodesFree: 5%\n  pid.available: 10%\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\n",
			hard:    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,pid.available<10%",
		},
		{
			platform: "AKS", path: "/etc/default/kubeletconfig.json",
			content: `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"memory.available":"750Mi","nodefs.available":"10%","nodefs.inodesFree":"5%","pid.available":"2000"}}`,
			hard:    "memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%,pid.available<2k",
		},
		{
			platform: "kubeadm", path: "/var/lib/kubelet/config.yaml",
			content: hdr + "cgroupDriver: systemd\n",
			hard:    defaultHardString,
		},
	}
	for _, tt := range tests {
		t.Run(tt.platform, func(t *testing.T) {
			root := t.TempDir()
			writeHostFile(t, root, tt.path, tt.content)
			c, err := FindConfig(Lookup{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if !c.Found || c.Platform != tt.platform || c.Path != filepath.Join(root, tt.path) {
				t.Errorf("Found %v Platform %q Path %q, want true, %q, %q", c.Found, c.Platform, c.Path, tt.platform, filepath.Join(root, tt.path))
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %s, want %s", got, tt.hard)
			}
			if want := under(root, locationPaths(t, tt.platform)...); !slices.Equal(c.Searched, want) {
				t.Errorf("Searched = %v, want %v", c.Searched, want)
			}
			if c.DropInDir != "" || c.DropIns != nil {
				t.Errorf("drop-ins %q %v, want none", c.DropInDir, c.DropIns)
			}
		})
	}
}

// TestFindConfigOrder: with files of two platforms on the node, the earlier location wins.
func TestFindConfigOrder(t *testing.T) {
	root := t.TempDir()
	writeHostFile(t, root, DefaultConfigPath, hdr+"evictionHard:\n  memory.available: 1Gi\n")
	writeHostFile(t, root, "/home/kubernetes/kubelet-config.yaml", hdr+"evictionHard:\n  memory.available: 2Gi\n")
	c, err := FindConfig(Lookup{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if c.Platform != "GKE" || thresholdStrings(c.Hard) != "memory.available<2Gi" {
		t.Errorf("Platform %q Hard %s, want GKE's file before kubeadm's", c.Platform, thresholdStrings(c.Hard))
	}
}

// TestFindConfigNone: nothing at any location is unknown, not an error, with every path tried
// and the kubelet's defaults for a caller that goes on.
func TestFindConfigNone(t *testing.T) {
	root := t.TempDir()
	c, err := FindConfig(Lookup{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, loc := range Locations {
		want = append(want, filepath.Join(root, loc.Path))
	}
	if c.Found || c.Path != "" || !slices.Equal(c.Searched, want) {
		t.Errorf("Found %v Path %q Searched %v, want false, none, %v", c.Found, c.Path, c.Searched, want)
	}
	if got := thresholdStrings(c.Hard); got != defaultHardString || c.NodeStatusUpdateFrequency != 10*time.Second ||
		c.PressureTransitionPeriod != 5*time.Minute || c.ShutdownGracePeriod != 0 {
		t.Errorf("got %+v, want the kubelet's defaults", c)
	}
}

// TestFindConfigExplicit: an explicit path wins; its absence is reported as unknown with the path,
// never replaced by a file found elsewhere.
func TestFindConfigExplicit(t *testing.T) {
	root := t.TempDir()
	writeHostFile(t, root, DefaultConfigPath, hdr+"evictionHard:\n  memory.available: 1Gi\n")
	writeHostFile(t, root, "/srv/kubelet.yaml", hdr+"evictionHard:\n  memory.available: 3Gi\n")

	c, err := FindConfig(Lookup{HostRoot: root, Path: "/etc/kubelet/missing.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(root, "/etc/kubelet/missing.yaml")
	if c.Found || c.Path != missing || !slices.Equal(c.Searched, []string{missing}) {
		t.Errorf("Found %v Path %q Searched %v, want unknown, naming %s only", c.Found, c.Path, c.Searched, missing)
	}
	if got := thresholdStrings(c.Hard); got != defaultHardString {
		t.Errorf("Hard = %s, want the defaults (not the kubeadm file's)", got)
	}

	// A parent that is a file is absent too (ENOTDIR), not an error.
	c, err = FindConfig(Lookup{HostRoot: root, Path: "/srv/kubelet.yaml/config"})
	if err != nil || c.Found {
		t.Errorf("under a file: %+v %v, want unknown", c, err)
	}

	c, err = FindConfig(Lookup{HostRoot: root, Path: "srv/kubelet.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Found || c.Platform != "" || thresholdStrings(c.Hard) != "memory.available<3Gi" {
		t.Errorf("Found %v Platform %q Hard %s, want the explicit file", c.Found, c.Platform, thresholdStrings(c.Hard))
	}
}

// eksRoot is an EKS AL2023 node as nodeadm leaves it: config.json and its drop-ins.
func eksRoot(t *testing.T, dropIns map[string]string) string {
	t.Helper()
	root := t.TempDir()
	writeHostFile(t, root, "/etc/kubernetes/kubelet/config.json",
		`{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"5%"},"maxPods":58}`)
	for name, content := range dropIns {
		writeHostFile(t, root, filepath.Join("/etc/kubernetes/kubelet/config.json.d", name), content)
	}
	return root
}

// TestFindConfigDropIns merges the drop-ins as the kubelet's mergeKubeletConfigurations does.
func TestFindConfigDropIns(t *testing.T) {
	tests := []struct {
		name    string
		dropIns map[string]string
		hard    string
		applied []string // relative to the drop-in dir
		check   func(t *testing.T, c Config)
	}{
		{
			name:    "none: the directory is absent",
			hard:    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			applied: nil,
		},
		{
			// A JSON merge patch: the drop-in's one evictionHard key replaces the file's, the
			// others stay (not replaced as a whole, and not reset to the defaults).
			name:    "nodeadm's drop-in overrides one threshold",
			dropIns: map[string]string{"00-nodeadm.conf": `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"500Mi"}}`},
			hard:    "memory.available<500Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			applied: []string{"00-nodeadm.conf"},
		},
		{
			name: "a drop-in adds a key and another a setting",
			dropIns: map[string]string{
				"00-nodeadm.conf": `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"500Mi"}}`,
				"50-extra.conf":   hdr + "evictionHard:\n  pid.available: 10%\nshutdownGracePeriod: 45s\nshutdownGracePeriodCriticalPods: 15s\nnodeStatusUpdateFrequency: 4s\n",
			},
			hard:    "memory.available<500Mi,nodefs.available<10%,nodefs.inodesFree<5%,pid.available<10%",
			applied: []string{"00-nodeadm.conf", "50-extra.conf"},
			check: func(t *testing.T, c Config) {
				if c.ShutdownGracePeriod != 45*time.Second || c.ShutdownGracePeriodCriticalPods != 15*time.Second || c.NodeStatusUpdateFrequency != 4*time.Second {
					t.Errorf("shutdown %v/%v, status %v: want the drop-in's 45s/15s and 4s", c.ShutdownGracePeriod, c.ShutdownGracePeriodCriticalPods, c.NodeStatusUpdateFrequency)
				}
			},
		},
		{
			// Lexical, not numeric: "10-" sorts before "9-", so 9-late.conf is applied last.
			name: "lexical order",
			dropIns: map[string]string{
				"9-late.conf":   hdr + "evictionHard:\n  memory.available: 900Mi\n",
				"10-early.conf": hdr + "evictionHard:\n  memory.available: 1000Mi\n",
			},
			hard:    "memory.available<900Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			applied: []string{"10-early.conf", "9-late.conf"},
		},
		{
			name: "only .conf files",
			dropIns: map[string]string{
				"00-nodeadm.conf":  hdr + "evictionHard:\n  memory.available: 500Mi\n",
				"99-override.yaml": hdr + "evictionHard:\n  memory.available: 5Gi\n",
				"99-backup.conf~":  "not even YAML: {",
				"README":           "notes",
			},
			hard:    "memory.available<500Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			applied: []string{"00-nodeadm.conf"},
		},
		{
			// filepath.WalkDir, as the kubelet: a subdirectory's files where the directory sorts.
			name: "subdirectories",
			dropIns: map[string]string{
				"10-a.conf":      hdr + "evictionHard:\n  memory.available: 200Mi\n",
				"20-dir/01.conf": hdr + "evictionHard:\n  memory.available: 300Mi\n",
				"30-c.conf":      hdr + "evictionHard:\n  nodefs.available: 20%\n",
			},
			hard:    "memory.available<300Mi,nodefs.available<20%,nodefs.inodesFree<5%",
			applied: []string{"10-a.conf", "20-dir/01.conf", "30-c.conf"},
		},
		{
			name:    "a null removes a threshold",
			dropIns: map[string]string{"00-a.conf": hdr + "evictionHard:\n  nodefs.inodesFree: null\n"},
			hard:    "memory.available<100Mi,nodefs.available<10%",
			applied: []string{"00-a.conf"},
		},
		{
			// The kubelet defaults evictionHard before the drop-ins only: none is left.
			name:    "evictionHard null leaves none",
			dropIns: map[string]string{"00-a.conf": hdr + "evictionHard: null\n"},
			hard:    "",
			applied: []string{"00-a.conf"},
		},
		{
			// mergeDefaultEvictionSettings acts in loadConfigFile, on the main file only.
			name:    "mergeDefaultEvictionSettings in a drop-in does nothing",
			dropIns: map[string]string{"00-a.conf": hdr + "mergeDefaultEvictionSettings: true\n"},
			hard:    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			applied: []string{"00-a.conf"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := eksRoot(t, tt.dropIns)
			c, err := FindConfig(Lookup{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "/etc/kubernetes/kubelet/config.json.d")
			if !c.Found || c.Platform != "EKS AL2023 (nodeadm)" {
				t.Errorf("Found %v Platform %q", c.Found, c.Platform)
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %s, want %s", got, tt.hard)
			}
			want := under(dir, tt.applied...)
			if tt.applied == nil {
				want = nil
			}
			if !slices.Equal(c.DropIns, want) {
				t.Errorf("DropIns = %v, want %v", c.DropIns, want)
			}
			if wantDir := dir; tt.dropIns == nil && c.DropInDir != "" || tt.dropIns != nil && c.DropInDir != wantDir {
				t.Errorf("DropInDir = %q", c.DropInDir)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// TestFindConfigDropInDir: --kubelet-config-dir names the drop-ins of any file, and a known file
// named explicitly keeps its platform's.
func TestFindConfigDropInDir(t *testing.T) {
	root := eksRoot(t, map[string]string{"00-nodeadm.conf": hdr + "evictionHard:\n  memory.available: 500Mi\n"})
	writeHostFile(t, root, "/srv/kubelet.yaml", hdr+"evictionHard:\n  memory.available: 3Gi\n")
	writeHostFile(t, root, "/srv/kubelet.d/10.conf", hdr+"evictionHard:\n  pid.available: 1k\n")

	c, err := FindConfig(Lookup{HostRoot: root, Path: "/etc/kubernetes/kubelet/config.json"})
	if err != nil || c.Platform != "EKS AL2023 (nodeadm)" || len(c.DropIns) != 1 || !strings.HasPrefix(thresholdStrings(c.Hard), "memory.available<500Mi") {
		t.Errorf("explicit EKS path: %+v %v, want its platform's drop-in merged", c, err)
	}
	c, err = FindConfig(Lookup{HostRoot: root, Path: "/srv/kubelet.yaml", DropInDir: "/srv/kubelet.d"})
	if err != nil || thresholdStrings(c.Hard) != "memory.available<3Gi,pid.available<1k" || c.DropInDir != filepath.Join(root, "/srv/kubelet.d") {
		t.Errorf("explicit dir: %+v %v, want 3Gi and the drop-in's pid.available", c, err)
	}
	// An explicit directory overrides the location's.
	c, err = FindConfig(Lookup{HostRoot: root, DropInDir: "/srv/kubelet.d"})
	if err != nil || thresholdStrings(c.Hard) != "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,pid.available<1k" {
		t.Errorf("search with an explicit dir: %+v %v", c, err)
	}
	// A directory asked for must exist.
	_, err = FindConfig(Lookup{HostRoot: root, DropInDir: "/srv/missing.d"})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "/srv/missing.d")) {
		t.Errorf("missing explicit dir: err %v, want one naming it", err)
	}
}

// TestFindConfigDropInErrors: a drop-in the kubelet would refuse (and not start) is an error
// naming the file.
func TestFindConfigDropInErrors(t *testing.T) {
	tests := []struct {
		name, content string
		has           []string
	}{
		{name: "no type", content: "evictionHard:\n  memory.available: 1Gi\n", has: []string{"50-bad.conf", `kind ""`}},
		{name: "another version", content: "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", has: []string{"50-bad.conf", "v1alpha1"}},
		{name: "empty", content: "", has: []string{"50-bad.conf", "empty"}},
		{name: "not YAML", content: "evictionHard: {\n", has: []string{"50-bad.conf", "parsing"}},
		{name: "not an object", content: "- a\n- b\n", has: []string{"50-bad.conf"}},
		{name: "wrong value type", content: hdr + "evictionHard:\n  pid.available: 1000\n", has: []string{"merging", "config.json.d"}},
		{name: "bad threshold", content: hdr + "evictionHard:\n  memory.available: lots\n", has: []string{"with the drop-ins of", `"lots"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := eksRoot(t, map[string]string{"00-nodeadm.conf": hdr, "50-bad.conf": tt.content})
			c, err := FindConfig(Lookup{HostRoot: root})
			if err == nil {
				t.Fatalf("got %+v, want an error", c)
			}
			if c.Found {
				t.Error("Found with an error")
			}
			for _, h := range tt.has {
				if !strings.Contains(err.Error(), h) {
					t.Errorf("error %q does not say %s", err, h)
				}
			}
		})
	}
}

// TestFindConfigUnreadable: a file that exists and cannot be read (here a directory where the
// file should be) is an error naming it, not "not found".
func TestFindConfigUnreadable(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "/home/kubernetes/kubelet-config.yaml")
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	writeHostFile(t, root, DefaultConfigPath, hdr)
	c, err := FindConfig(Lookup{HostRoot: root})
	if err == nil || c.Found || !strings.Contains(err.Error(), path) {
		t.Errorf("got %+v %v, want an error naming %s", c, err, path)
	}
}

// TestFindConfigNotReadableByThisProcess: a platform's file that this process may not read (AKS writes
// kubeletconfig.json 0600, and the agent runs as non-root) is unknown, said in Searched with
// the reason, not an error: the defaults are assumed and pressure handling goes on.
func TestFindConfigNotReadableByThisProcess(t *testing.T) {
	host := t.TempDir()
	path := filepath.Join(host, "etc", "default", "kubeletconfig.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The tests run as root, who reads any file: the read is refused here as the kernel would.
	orig := readMainFile
	t.Cleanup(func() { readMainFile = orig })
	readMainFile = func(p string) ([]byte, error) {
		if p == path {
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrPermission}
		}
		return orig(p)
	}
	c, err := FindConfig(Lookup{HostRoot: host})
	if err != nil {
		t.Fatalf("FindConfig: %v; want unknown, not an error", err)
	}
	if c.Found || c.Path != path || c.Platform != "AKS" {
		t.Errorf("Found %v, Path %q, Platform %q; want not found at AKS's %s", c.Found, c.Path, c.Platform, path)
	}
	if last := c.Searched[len(c.Searched)-1]; !strings.Contains(last, "not readable by this process") || !strings.HasPrefix(last, path) {
		t.Errorf("Searched ends with %q; want the AKS file and why it was not read", last)
	}
	if len(c.Hard) == 0 {
		t.Error("no hard thresholds: want the kubelet's defaults assumed")
	}
}

// AKS's host paths: the config file, the flags file and the unit drop-in that passes --config.
const (
	aksConfig  = "/etc/default/kubeletconfig.json"
	aksFlags   = "/etc/default/kubelet"
	aksUnitCfg = "/etc/systemd/system/kubelet.service.d/10-componentconfig.conf"
)

// TestFindConfigAKSFlags: AKS's kubelet flags in /etc/default/kubelet, alone on pools without a
// config file and over the file where both are, as the kubelet applies them.
func TestFindConfigAKSFlags(t *testing.T) {
	aksFile := `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1",` +
		`"evictionHard":{"memory.available":"100Mi","nodefs.available":"10%","pid.available":"2000"},` +
		`"evictionSoft":{"memory.available":"1Gi"},"evictionSoftGracePeriod":{"memory.available":"1m"},` +
		`"evictionPressureTransitionPeriod":"30s","nodeStatusUpdateFrequency":"20s"}`
	const flagsOnly, both = "AKS (kubelet flags)", "AKS (config file and kubelet flags)"
	tests := []struct {
		name  string
		files map[string]string
		// found: Found; platform and path (a host path) of the reading; hard its evictionHard.
		found          bool
		platform, path string
		hard           string
		flags          []string // Config.Flags
		searched       []string // host paths after GKE's; nil: up to AKS's when found, else every location
		check          func(t *testing.T, c Config)
	}{
		{
			name:  "flags alone, as AgentBaker writes them",
			files: map[string]string{aksFlags: aksFlagsFile},
			found: true, platform: flagsOnly, path: aksFlags,
			hard:     "memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			flags:    []string{"--eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%", "--node-status-update-frequency=10s"},
			searched: []string{aksConfig, DefaultConfigPath, aksFlags},
			check: func(t *testing.T, c Config) {
				if c.NodeStatusUpdateFrequency != 10*time.Second || c.PressureTransitionPeriod != 5*time.Minute || c.Soft != nil || c.FlagsFile != c.Path {
					t.Errorf("got %+v, want the flag defaults besides the flags", c)
				}
			},
		},
		{
			name:  "quoted variable, --flag value form",
			files: map[string]string{aksFlags: `KUBELET_FLAGS="--v=2 --eviction-hard 'memory.available<1Gi, nodefs.available<5%' --eviction-pressure-transition-period 1m"` + "\n"},
			found: true, platform: flagsOnly, path: aksFlags, hard: "memory.available<1Gi,nodefs.available<5%",
			flags:    []string{"--eviction-hard=memory.available<1Gi, nodefs.available<5%", "--eviction-pressure-transition-period=1m"},
			searched: []string{aksConfig, DefaultConfigPath, aksFlags},
			check: func(t *testing.T, c Config) {
				if c.PressureTransitionPeriod != time.Minute {
					t.Errorf("PressureTransitionPeriod %v, want 1m", c.PressureTransitionPeriod)
				}
			},
		},
		{
			// As AKS Windows passes it: no hard eviction at all.
			name:  `--eviction-hard=""`,
			files: map[string]string{aksFlags: `KUBELET_FLAGS=--max-pods=30 --eviction-hard="" --node-status-update-frequency=4s`},
			found: true, platform: flagsOnly, path: aksFlags, hard: "",
			flags: []string{"--eviction-hard=", "--node-status-update-frequency=4s"}, searched: []string{aksConfig, DefaultConfigPath, aksFlags},
		},
		{
			// AgentBaker always writes the flags file; no eviction flag and no --config: the
			// kubelet's flag defaults, which (without loadConfigFile) have no evictionHard.
			name:  "flags without eviction flags, no config file",
			files: map[string]string{aksFlags: "KUBELET_FLAGS=--max-pods=30 --cloud-provider=external \nKUBELET_NODE_LABELS=a=b\n"},
			found: true, platform: flagsOnly, path: aksFlags, hard: "", searched: []string{aksConfig, DefaultConfigPath, aksFlags},
			check: func(t *testing.T, c Config) {
				if c.PressureTransitionPeriod != 5*time.Minute || c.NodeStatusUpdateFrequency != 10*time.Second || c.Flags != nil {
					t.Errorf("got %+v, want the kubelet's flag defaults", c)
				}
			},
		},
		{
			// The unit passes --config kubeletconfig.json, which is gone: the kubelet would not
			// start that way, so what runs is unknown, and the search goes on.
			name:  "the unit passes a --config that is absent",
			files: map[string]string{aksFlags: aksFlagsFile, aksUnitCfg: "[Service]\nEnvironment=\"KUBELET_CONFIG_FILE_FLAGS=--config /etc/default/kubeletconfig.json\"\n"},
		},
		{
			name:     "the flags pass a --config that is absent",
			files:    map[string]string{aksFlags: "KUBELET_FLAGS=--config=/etc/kubelet/custom.yaml --eviction-hard=memory.available<1Gi"},
			searched: []string{"/etc/kubelet/custom.yaml", "/var/lib/kubelet/config.yaml"},
		},
		{
			// The flags alone are taken only when no later location has a file: a kubeadm
			// node that sets KUBELET_FLAGS keeps its file.
			name:  "flags without a config file, and kubeadm's file",
			files: map[string]string{aksFlags: aksFlagsFile, DefaultConfigPath: hdr + "evictionHard:\n  memory.available: 1Gi\n"},
			found: true, platform: "kubeadm", path: DefaultConfigPath, hard: "memory.available<1Gi",
			searched: []string{aksConfig, DefaultConfigPath},
		},
		{
			name:  "GKE's flags file: another variable, not read",
			files: map[string]string{aksFlags: `KUBELET_OPTS="--eviction-hard=memory.available<1Gi --config /home/kubernetes/kubelet-config.yaml"`},
		},
		{
			// kubeletConfigFlagPrecedence: --eviction-hard replaces the file's whole map, the
			// soft thresholds stay the file's, the flag's duration wins.
			name:  "flags over the file",
			files: map[string]string{aksConfig: aksFile, aksFlags: "KUBELET_FLAGS=--eviction-hard=memory.available<750Mi --node-status-update-frequency=10s\n"},
			found: true, platform: both, path: aksConfig, hard: "memory.available<750Mi",
			flags: []string{"--eviction-hard=memory.available<750Mi", "--node-status-update-frequency=10s"},
			check: func(t *testing.T, c Config) {
				if thresholdStrings(c.Soft) != "memory.available<1Gi" || c.PressureTransitionPeriod != 30*time.Second ||
					c.NodeStatusUpdateFrequency != 10*time.Second || !strings.HasSuffix(c.FlagsFile, aksFlags) {
					t.Errorf("got %+v, want the file's soft threshold and transition period, the flags' 10s", c)
				}
			},
		},
		{
			// mergeDefaultEvictionSettings fills the file's map in loadConfigFile; the flag then
			// replaces that map as a whole.
			name: "flags over a file merging the defaults",
			files: map[string]string{aksConfig: hdr + "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 300Mi\n",
				aksFlags: "KUBELET_FLAGS=--eviction-hard=nodefs.available<20%"},
			found: true, platform: both, path: aksConfig, hard: "nodefs.available<20%",
			flags: []string{"--eviction-hard=nodefs.available<20%"},
		},
		{
			name:  "flags over the file, a zero duration kept",
			files: map[string]string{aksConfig: aksFile, aksFlags: "KUBELET_FLAGS=--eviction-pressure-transition-period=0s --eviction-soft= --eviction-soft-grace-period="},
			found: true, platform: both, path: aksConfig, hard: "memory.available<100Mi,nodefs.available<10%,pid.available<2k",
			flags: []string{"--eviction-pressure-transition-period=0s", "--eviction-soft=", "--eviction-soft-grace-period="},
			check: func(t *testing.T, c Config) {
				if c.PressureTransitionPeriod != 0 || c.Soft != nil || c.SoftGracePeriod != nil {
					t.Errorf("got %+v, want the flags' 0s and no soft thresholds", c)
				}
			},
		},
		{
			// AgentBaker's config-file pools: the translated flags are out of KUBELET_FLAGS.
			name:  "the file, and flags without eviction flags",
			files: map[string]string{aksConfig: aksFile, aksFlags: "KUBELET_FLAGS=--cloud-provider=external\n", aksUnitCfg: "[Service]\n"},
			found: true, platform: "AKS", path: aksConfig, hard: "memory.available<100Mi,nodefs.available<10%,pid.available<2k",
		},
		{
			name: "--config among the flags names the file",
			files: map[string]string{"/etc/kubelet/custom.yaml": hdr + "evictionHard:\n  memory.available: 2Gi\n", aksConfig: aksFile,
				aksFlags: "KUBELET_FLAGS=--config /etc/kubelet/custom.yaml --eviction-soft= --eviction-soft-grace-period="},
			found: true, platform: both, path: "/etc/kubelet/custom.yaml", hard: "memory.available<2Gi",
			flags: []string{"--eviction-soft=", "--eviction-soft-grace-period="}, searched: []string{"/etc/kubelet/custom.yaml"},
		},
		{
			name: "--config-dir among the flags",
			files: map[string]string{aksFlags: "KUBELET_FLAGS=--config-dir=/etc/kubelet.d --eviction-soft-grace-period=memory.available=1m",
				"/etc/kubelet.d/10.conf": hdr + "evictionHard:\n  memory.available: 400Mi\nevictionSoft:\n  memory.available: 1Gi\n"},
			found: true, platform: flagsOnly, path: aksFlags, hard: "memory.available<400Mi",
			flags: []string{"--eviction-soft-grace-period=memory.available=1m"}, searched: []string{aksConfig, DefaultConfigPath, aksFlags},
			check: func(t *testing.T, c Config) {
				if thresholdStrings(c.Soft) != "memory.available<1Gi" || len(c.DropIns) != 1 {
					t.Errorf("got %+v, want the drop-in's soft threshold with the flag's grace period", c)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range tt.files {
				writeHostFile(t, root, p, content)
			}
			c, err := FindConfig(Lookup{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if c.Found != tt.found {
				t.Fatalf("Found %v, want %v: %+v", c.Found, tt.found, c)
			}
			var want []string
			switch {
			case tt.searched == nil && !tt.found:
				want = under(root, locationPaths(t, "kubeadm")...)
			case tt.searched == nil:
				want = under(root, locationPaths(t, "AKS")...)
			default:
				want = append(under(root, locationPaths(t, "GKE")...), under(root, tt.searched...)...)
			}
			if !slices.Equal(c.Searched, want) {
				t.Errorf("Searched = %v, want %v", c.Searched, want)
			}
			if !tt.found {
				if thresholdStrings(c.Hard) != defaultHardString {
					t.Errorf("Hard = %s, want the defaults assumed", thresholdStrings(c.Hard))
				}
				return
			}
			if c.Platform != tt.platform || c.Path != filepath.Join(root, tt.path) {
				t.Errorf("Platform %q Path %q, want %q %q", c.Platform, c.Path, tt.platform, filepath.Join(root, tt.path))
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %s, want %s", got, tt.hard)
			}
			if !slices.Equal(c.Flags, tt.flags) {
				t.Errorf("Flags = %q, want %q", c.Flags, tt.flags)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// TestFindConfigAKSFlagsErrors: flags the kubelet would refuse, as it would not start with them,
// are an error naming the flags file.
func TestFindConfigAKSFlagsErrors(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"malformed pair":         {aksFlags: "KUBELET_FLAGS=--eviction-hard=memory.available=1Gi"},
		"bad threshold alone":    {aksFlags: "KUBELET_FLAGS=--eviction-hard=memory.available<lots"},
		"bad threshold over":     {aksConfig: hdr, aksFlags: "KUBELET_FLAGS=--eviction-hard=memory.available<lots"},
		"soft without its grace": {aksConfig: hdr, aksFlags: "KUBELET_FLAGS=--eviction-soft=memory.available<1Gi"},
		"missing --config-dir":   {aksFlags: "KUBELET_FLAGS=--config-dir=/etc/none.d"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range files {
				writeHostFile(t, root, p, content)
			}
			c, err := FindConfig(Lookup{HostRoot: root})
			if err == nil || c.Found || !strings.Contains(err.Error(), filepath.Join(root, aksFlags)) {
				t.Errorf("got %+v, %v; want an error naming the flags file", c, err)
			}
		})
	}
}

// denyReads makes the reads of the given host paths fail as the kernel would for a non-root
// process (the tests run as root, who reads any file).
func denyReads(t *testing.T, paths ...string) {
	t.Helper()
	deny := func(orig func(string) ([]byte, error)) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if slices.Contains(paths, p) {
				return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrPermission}
			}
			return orig(p)
		}
	}
	origMain, origFlags := readMainFile, readFlagsFile
	t.Cleanup(func() { readMainFile, readFlagsFile = origMain, origFlags })
	readMainFile, readFlagsFile = deny(origMain), deny(origFlags)
}

// TestFindConfigAKSNotReadable: AKS writes both files 0600, and the agent runs as non-root.
func TestFindConfigAKSNotReadable(t *testing.T) {
	evictionFlags := "KUBELET_FLAGS=--eviction-hard=memory.available<750Mi\n"
	tests := []struct {
		name     string
		files    map[string]string
		deny     []string
		found    bool
		platform string
		hard     string
		denied   string // the host path whose Searched entry says it was not readable
	}{
		{
			// Eviction flags mean the eviction settings were not put in the file.
			name:  "config file unreadable, eviction flags",
			files: map[string]string{aksConfig: aksFile(), aksFlags: evictionFlags}, deny: []string{aksConfig},
			found: true, platform: "AKS (kubelet flags)", hard: "memory.available<750Mi", denied: aksConfig,
		},
		{
			name:  "config file unreadable, no eviction flags: unknown, as before",
			files: map[string]string{aksConfig: aksFile(), aksFlags: "KUBELET_FLAGS=--v=2\n"}, deny: []string{aksConfig},
			platform: "AKS", hard: defaultHardString, denied: aksConfig,
		},
		{
			name:  "flags unreadable, config file read",
			files: map[string]string{aksConfig: aksFile(), aksFlags: evictionFlags}, deny: []string{aksFlags},
			found: true, platform: "AKS", hard: "memory.available<100Mi",
		},
		{
			name:  "flags unreadable, no config file: unknown, said",
			files: map[string]string{aksFlags: evictionFlags}, deny: []string{aksFlags},
			hard: defaultHardString, denied: aksFlags,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range tt.files {
				writeHostFile(t, root, p, content)
			}
			denyReads(t, under(root, tt.deny...)...)
			c, err := FindConfig(Lookup{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if c.Found != tt.found || c.Platform != tt.platform || thresholdStrings(c.Hard) != tt.hard {
				t.Errorf("Found %v Platform %q Hard %s, want %v %q %s", c.Found, c.Platform, thresholdStrings(c.Hard), tt.found, tt.platform, tt.hard)
			}
			notes := 0
			for _, s := range c.Searched {
				if strings.Contains(s, "not readable by this process") {
					notes++
					if !strings.HasPrefix(s, filepath.Join(root, tt.denied)+" ") {
						t.Errorf("Searched entry %q, want one for %s", s, tt.denied)
					}
				}
			}
			if want := min(len(tt.denied), 1); notes != want {
				t.Errorf("Searched %v: %d entries saying why, want %d", c.Searched, notes, want)
			}
		})
	}
}

func aksFile() string {
	return `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"memory.available":"100Mi"}}`
}

// TestFindConfigExplicitAKS: the AKS file named explicitly keeps its flags; another path does
// not read them.
func TestFindConfigExplicitAKS(t *testing.T) {
	root := t.TempDir()
	writeHostFile(t, root, aksConfig, aksFile())
	writeHostFile(t, root, aksFlags, "KUBELET_FLAGS=--eviction-hard=memory.available<750Mi --config=/srv/other.yaml\n")
	writeHostFile(t, root, "/srv/kubelet.yaml", hdr+"evictionHard:\n  memory.available: 3Gi\n")
	c, err := FindConfig(Lookup{HostRoot: root, Path: aksConfig})
	if err != nil || !c.Found || c.Path != filepath.Join(root, aksConfig) || thresholdStrings(c.Hard) != "memory.available<750Mi" {
		t.Errorf("explicit AKS path: %+v %v, want the file with the flags over it", c, err)
	}
	c, err = FindConfig(Lookup{HostRoot: root, Path: "/srv/kubelet.yaml"})
	if err != nil || c.FlagsFile != "" || thresholdStrings(c.Hard) != "memory.available<3Gi" {
		t.Errorf("explicit other path: %+v %v, want its file alone", c, err)
	}
	// Named and missing: unknown, as any explicit path, not the flags alone.
	if err := os.Remove(filepath.Join(root, aksConfig)); err != nil {
		t.Fatal(err)
	}
	c, err = FindConfig(Lookup{HostRoot: root, Path: aksConfig})
	if err != nil || c.Found || c.Path != filepath.Join(root, aksConfig) || !slices.Equal(c.Searched, []string{c.Path}) {
		t.Errorf("explicit AKS path missing: %+v %v, want unknown naming it", c, err)
	}
}

// TestFindConfigEKSFlags (issue 48, item 3): an EKS AL2023 node's kubelet runs as
// "kubelet $NODEADM_KUBELET_ARGS" from /etc/eks/kubelet/environment, where nodeadm appends the
// NodeConfig's spec.kubelet.flags after its own to give them precedence (awslabs/amazon-eks-ami
// nodeadm/internal/kubelet/environment.go): an eviction flag there wins over config.json and its
// drop-ins, as the kubelet applies its flags last.
func TestFindConfigEKSFlags(t *testing.T) {
	const (
		config = "/etc/kubernetes/kubelet/config.json"
		dropIn = "/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf"
		envF   = "/etc/eks/kubelet/environment"
		eks    = "EKS AL2023 (nodeadm)"
	)
	mainFile := `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration",` +
		`"evictionHard":{"memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"5%"},"nodeStatusUpdateFrequency":"10s"}`
	dropInFile := `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"memory.available":"500Mi"}}`
	// nodeadm's own flags as environment.go writes them (fmt.Sprintf("%s=%s"): unquoted, one
	// line), then the user's.
	nodeadm := "--cloud-provider=external --config=/etc/kubernetes/kubelet/config.json --config-dir=/etc/kubernetes/kubelet/config.json.d " +
		"--hostname-override=ip-192-168-10-21.us-west-2.compute.internal --node-ip=192.168.10.21"
	tests := []struct {
		name           string
		files          map[string]string
		platform, hard string
		flags          []string
		dropIns        int
		status         time.Duration
	}{
		{
			name: "the user's flags over the file and its drop-in",
			files: map[string]string{config: mainFile, dropIn: dropInFile,
				envF: "KUBELET_CONFIG_DROPIN_DIR_ALPHA=on\nNODEADM_KUBELET_ARGS=" + nodeadm + " --eviction-hard=memory.available<300Mi,nodefs.available<12% --node-status-update-frequency=20s\n"},
			platform: eks + " (config file and kubelet flags)", hard: "memory.available<300Mi,nodefs.available<12%",
			flags:   []string{"--eviction-hard=memory.available<300Mi,nodefs.available<12%", "--node-status-update-frequency=20s"},
			dropIns: 1, status: 20 * time.Second,
		},
		{
			name: "quoted, as eks-hybrid's nodeadm writes it, without eviction flags: the file and drop-in",
			files: map[string]string{config: mainFile, dropIn: dropInFile,
				envF: `NODEADM_KUBELET_ARGS="` + nodeadm + `"` + "\n"},
			platform: eks, hard: "memory.available<500Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			dropIns: 1, status: 10 * time.Second,
		},
		{
			name:     "no environment file (an AMI before nodeadm wrote one): the file alone",
			files:    map[string]string{config: mainFile},
			platform: eks, hard: "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%",
			status: 10 * time.Second,
		},
		{
			name: "a user's --eviction-hard=\"\": no hard eviction at all",
			files: map[string]string{config: mainFile,
				envF: "NODEADM_KUBELET_ARGS=" + strings.Replace(nodeadm, " --config-dir=/etc/kubernetes/kubelet/config.json.d", "", 1) + ` --eviction-hard=""` + "\n"},
			platform: eks + " (config file and kubelet flags)", hard: "",
			flags:  []string{"--eviction-hard="},
			status: 10 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range tt.files {
				writeHostFile(t, root, p, content)
			}
			c, err := FindConfig(Lookup{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if !c.Found || c.Platform != tt.platform || c.Path != filepath.Join(root, config) {
				t.Errorf("Found %v Platform %q Path %q; want true, %q, %s", c.Found, c.Platform, c.Path, tt.platform, config)
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %q, want %q", got, tt.hard)
			}
			if !slices.Equal(c.Flags, tt.flags) {
				t.Errorf("Flags = %q, want %q", c.Flags, tt.flags)
			}
			if len(c.DropIns) != tt.dropIns {
				t.Errorf("DropIns = %v, want %d", c.DropIns, tt.dropIns)
			}
			if c.NodeStatusUpdateFrequency != tt.status {
				t.Errorf("NodeStatusUpdateFrequency = %v, want %v", c.NodeStatusUpdateFrequency, tt.status)
			}
			if _, ok := tt.files[envF]; ok && c.FlagsFile != filepath.Join(root, envF) {
				t.Errorf("FlagsFile = %q, want %s", c.FlagsFile, envF)
			}
		})
	}
}
