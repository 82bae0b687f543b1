package kubelet

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

func thresholdStrings(ts []Threshold) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.String())
	}
	return strings.Join(s, ",")
}

// hdr is the type line every kubelet configuration file carries.
const hdr = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

const defaultHardString = "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%"

func TestReadConfig(t *testing.T) {
	c, err := ReadConfig("testdata/kubelet-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Found || c.Path != "testdata/kubelet-config.yaml" {
		t.Errorf("Found %v Path %q", c.Found, c.Path)
	}
	// Two hard signals set, merge off: the other defaults are gone.
	if got, want := thresholdStrings(c.Hard), "memory.available<200Mi,nodefs.available<5%"; got != want {
		t.Errorf("Hard = %s, want %s", got, want)
	}
	if got, want := thresholdStrings(c.Soft), "memory.available<500Mi,nodefs.available<12.5%"; got != want {
		t.Errorf("Soft = %s, want %s", got, want)
	}
	if c.SoftGracePeriod[MemoryAvailable] != 90*time.Second || c.SoftGracePeriod[NodeFsAvailable] != 2*time.Minute {
		t.Errorf("SoftGracePeriod = %v", c.SoftGracePeriod)
	}
	if m := c.MinimumReclaim[MemoryAvailable]; m.Quantity == nil || m.Quantity.String() != "100Mi" {
		t.Errorf("MinimumReclaim[memory] = %v", m)
	}
	if m := c.MinimumReclaim[NodeFsAvailable]; m.Quantity != nil || m.Percentage != pct(1) {
		t.Errorf("MinimumReclaim[nodefs] = %v, want 1%%", m)
	}
	if c.MaxPodGracePeriod != time.Minute || c.PressureTransitionPeriod != 30*time.Second {
		t.Errorf("MaxPodGracePeriod %v, PressureTransitionPeriod %v", c.MaxPodGracePeriod, c.PressureTransitionPeriod)
	}
	if c.NodeStatusUpdateFrequency != 4*time.Second {
		t.Errorf("NodeStatusUpdateFrequency %v, want 4s", c.NodeStatusUpdateFrequency)
	}
}

func TestReadConfigMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	c, err := ReadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Found || c.Path != path || !slices.Equal(c.Searched, []string{path}) {
		t.Errorf("Found %v Path %q Searched %v, want false and %q", c.Found, c.Path, c.Searched, path)
	}
	if got := thresholdStrings(c.Hard); got != defaultHardString {
		t.Errorf("Hard = %s, want the defaults", got)
	}
	if c.Soft != nil || c.MinimumReclaim != nil || c.PressureTransitionPeriod != 5*time.Minute {
		t.Errorf("got %+v, want no soft thresholds or reclaims and a 5m transition period", c)
	}
}

func TestReadConfigBadValueNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, hdr+"evictionHard:\n  memory.available: 12 apples\n")
	_, err := ReadConfig(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"12 apples"`) ||
		!strings.Contains(err.Error(), "memory.available") {
		t.Errorf("error %v, want one naming the file, the signal and the value", err)
	}
	if err := os.Chmod(path, 0); err == nil && os.Getuid() != 0 {
		if _, err := ReadConfig(path); err == nil {
			t.Error("no error reading an unreadable file")
		}
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		hard    string
		soft    string
		ignored []string
	}{
		{name: "no eviction settings", yaml: "maxPods: 58\n", hard: defaultHardString},
		{name: "null evictionHard", yaml: "evictionHard: null\n", hard: defaultHardString},
		{
			name: "one hard signal zeroes the rest",
			yaml: "evictionHard:\n  memory.available: 300Mi\n",
			hard: "memory.available<300Mi",
		},
		{
			name: "mergeDefaultEvictionSettings keeps the rest",
			yaml: "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 300Mi\n  pid.available: 10%\n",
			hard: "memory.available<300Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%,pid.available<10%",
		},
		{
			name: "merge off explicitly",
			yaml: "mergeDefaultEvictionSettings: false\nevictionHard:\n  nodefs.available: 20%\n",
			hard: "nodefs.available<20%",
		},
		{
			name: "merge with a default disabled by 0%",
			yaml: "mergeDefaultEvictionSettings: true\nevictionHard:\n  imagefs.available: 0%\n",
			hard: "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.inodesFree<5%",
		},
		{
			// loadConfigFile only defaults a nil map: an explicit empty one leaves no thresholds.
			name: "explicit empty evictionHard",
			yaml: "evictionHard: {}\n",
			hard: "",
		},
		{
			name: "soft with grace periods",
			yaml: "evictionSoft:\n  pid.available: 20%\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 30s\n  pid.available: 1m\n",
			hard: defaultHardString,
			soft: "memory.available<1Gi,pid.available<20%",
		},
		{
			// containerfs.* the kubelet derives and ignores as given (UpdateContainerFsThresholds);
			// allocatableMemory.available is a signal of its own.
			name:    "signals the kubelet knows and reprieve does not model",
			yaml:    "evictionHard:\n  memory.available: 100Mi\n  containerfs.available: 10%\n  allocatableMemory.available: 1Gi\n",
			hard:    "memory.available<100Mi,allocatableMemory.available<1Gi",
			ignored: []string{"evictionHard.containerfs.available"},
		},
		{
			name: "JSON",
			yaml: `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"nodefs.inodesFree":"3%"}}`,
			hard: "nodefs.inodesFree<3%",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := tt.yaml
			if !strings.HasPrefix(doc, "{") {
				doc = hdr + doc
			}
			c, err := ParseConfig([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %s, want %s", got, tt.hard)
			}
			if got := thresholdStrings(c.Soft); got != tt.soft {
				t.Errorf("Soft = %s, want %s", got, tt.soft)
			}
			if !slices.Equal(c.Ignored, tt.ignored) {
				t.Errorf("Ignored = %v, want %v", c.Ignored, tt.ignored)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		has  []string
	}{
		{name: "bad hard value", yaml: "evictionHard:\n  nodefs.available: 110%\n", has: []string{"evictionHard", "nodefs.available", `"110%"`}},
		{name: "negative hard quantity", yaml: "evictionHard:\n  memory.available: -5Mi\n", has: []string{"evictionHard", `"-5Mi"`}},
		{name: "unknown signal", yaml: "evictionSoft:\n  swap.available: 1Gi\n", has: []string{"evictionSoft", "swap.available"}},
		{name: "soft without grace period", yaml: "evictionSoft:\n  memory.available: 1Gi\n", has: []string{"memory.available", "evictionSoftGracePeriod"}},
		{name: "bad grace period", yaml: "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: soon\n", has: []string{"evictionSoftGracePeriod", `"soon"`}},
		{name: "bad minimum reclaim", yaml: "evictionMinimumReclaim:\n  memory.available: 0%\n", has: []string{"evictionMinimumReclaim", `"0%"`}},
		{name: "wrong type", yaml: "evictionHard: [memory.available]\n", has: []string{"KubeletConfiguration"}},
		{name: "negative transition period", yaml: "evictionPressureTransitionPeriod: -1m\n", has: []string{"evictionPressureTransitionPeriod"}},
		{name: "not YAML", yaml: "evictionHard: {\n", has: []string{"parsing"}},
		// The kubelet refuses files without their type; a wrong path must not read as defaults.
		{name: "wrong kind", yaml: "-apiVersion: v1\nkind: ConfigMap\n", has: []string{`"ConfigMap"`}},
		{name: "no type", yaml: "-evictionHard:\n  memory.available: 1Gi\n", has: []string{"KubeletConfiguration"}},
		{name: "empty file", yaml: "-", has: []string{"KubeletConfiguration"}},
		{name: "a Summary API payload", yaml: `-{"node":{"nodeName":"n"},"pods":[]}`, has: []string{"KubeletConfiguration"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := hdr + tt.yaml
			if rest, ok := strings.CutPrefix(tt.yaml, "-"); ok { // without the type line
				doc = rest
			}
			c, err := ParseConfig([]byte(doc))
			if err == nil {
				t.Fatalf("got %+v, want an error", c)
			}
			for _, h := range tt.has {
				if !strings.Contains(err.Error(), h) {
					t.Errorf("error %q does not say %s", err, h)
				}
			}
		})
	}
}

// TestEvictionConfigMatchesUpstream holds evictionConfig to the kubelet's own type: every field
// has the same JSON name and Go type in k8s.io/kubelet/config/v1beta1, and the fixture decodes to
// the same values through both.
func TestEvictionConfigMatchesUpstream(t *testing.T) {
	upstream := map[string]reflect.StructField{}
	var collect func(rt reflect.Type)
	collect = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous && name == "" {
				collect(f.Type) // TypeMeta, inline
				continue
			}
			upstream[name] = f
		}
	}
	collect(reflect.TypeFor[kubeletconfig.KubeletConfiguration]())

	ours := reflect.TypeFor[evictionConfig]()
	for i := range ours.NumField() {
		f := ours.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		u, ok := upstream[name]
		if !ok {
			t.Errorf("%s: no field %q upstream", f.Name, name)
			continue
		}
		if u.Type != f.Type {
			t.Errorf("%s (%q): type %v, upstream %v", f.Name, name, f.Type, u.Type)
		}
	}

	data, err := os.ReadFile("testdata/kubelet-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var full kubeletconfig.KubeletConfiguration
	if err := yaml.UnmarshalStrict(data, &full); err == nil {
		t.Fatal("the fixture should carry a field upstream does not know")
	}
	if err := yaml.Unmarshal(data, &full); err != nil {
		t.Fatal(err)
	}
	got, err := decodeEvictionConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	want := evictionConfig{
		APIVersion:                       full.APIVersion,
		Kind:                             full.Kind,
		EvictionHard:                     full.EvictionHard,
		EvictionSoft:                     full.EvictionSoft,
		EvictionSoftGracePeriod:          full.EvictionSoftGracePeriod,
		EvictionPressureTransitionPeriod: full.EvictionPressureTransitionPeriod,
		EvictionMaxPodGracePeriod:        full.EvictionMaxPodGracePeriod,
		EvictionMinimumReclaim:           full.EvictionMinimumReclaim,
		MergeDefaultEvictionSettings:     full.MergeDefaultEvictionSettings,
		ShutdownGracePeriod:              full.ShutdownGracePeriod,
		ShutdownGracePeriodCriticalPods:  full.ShutdownGracePeriodCriticalPods,
		NodeStatusUpdateFrequency:        full.NodeStatusUpdateFrequency,
		ImageGCHighThresholdPercent:      full.ImageGCHighThresholdPercent,
		ImageGCLowThresholdPercent:       full.ImageGCLowThresholdPercent,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n%+v\nupstream\n%+v", got, want)
	}
}

func TestParseConfigCaseSensitive(t *testing.T) {
	// The kubelet's decoder matches field names exactly: "EvictionHard" is an unknown field.
	c, err := ParseConfig([]byte(hdr + "EvictionHard:\n  memory.available: 1Gi\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := thresholdStrings(c.Hard); got != defaultHardString {
		t.Errorf("Hard = %s, want the defaults", got)
	}
}

// TestParseConfigShutdownGrace reads the kubelet's graceful node shutdown, as GKE sets it
// (30 s, 15 s of it for critical pods), and refuses what the kubelet's validation refuses.
func TestParseConfigShutdownGrace(t *testing.T) {
	head := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	c, err := ParseConfig([]byte(head + "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\n"))
	if err != nil || c.ShutdownGracePeriod != 30*time.Second || c.ShutdownGracePeriodCriticalPods != 15*time.Second {
		t.Fatalf("config %+v err %v: want 30 s and 15 s", c, err)
	}
	if _, err := ParseConfig([]byte(head + "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 15s\n")); err == nil ||
		!strings.Contains(err.Error(), "shutdownGracePeriodCriticalPods") {
		t.Errorf("critical pods' share above the whole: err %v, want one naming shutdownGracePeriodCriticalPods", err)
	}
	if c, err := ParseConfig([]byte(head)); err != nil || c.ShutdownGracePeriod != 0 {
		t.Errorf("without it: %+v %v, want off", c, err)
	}
}

// TestParseConfigNodeStatusUpdateFrequency reads nodeStatusUpdateFrequency, 10 s when unset as
// the kubelet's defaulting gives it.
func TestParseConfigNodeStatusUpdateFrequency(t *testing.T) {
	for _, tt := range []struct {
		yaml string
		want time.Duration
	}{
		{"", 10 * time.Second},
		{"nodeStatusUpdateFrequency: 0s\n", 10 * time.Second},
		{"nodeStatusUpdateFrequency: 4s\n", 4 * time.Second},
		{"nodeStatusUpdateFrequency: 1m\n", time.Minute},
	} {
		c, err := ParseConfig([]byte(hdr + tt.yaml))
		if err != nil || c.NodeStatusUpdateFrequency != tt.want {
			t.Errorf("%q: %v %v, want %v", tt.yaml, c.NodeStatusUpdateFrequency, err, tt.want)
		}
	}
	if c := DefaultConfig(); c.NodeStatusUpdateFrequency != 10*time.Second {
		t.Errorf("DefaultConfig: %v, want 10s", c.NodeStatusUpdateFrequency)
	}
}

// The kubelet copies each hard memory.available threshold, with its minimum reclaim, to
// allocatableMemory.available when enforceNodeAllocatable holds "pods", its default
// (addAllocatableThresholds, from ParseThresholdConfig); not the soft ones, and not without
// "pods".
func TestEvictionHardAllocatable(t *testing.T) {
	tests := []struct {
		name, yaml, hard, reclaim string
	}{
		{name: "default enforceNodeAllocatable", yaml: "maxPods: 58\n",
			hard: "memory.available<100Mi,allocatableMemory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%"},
		{name: "pods enforced, with reclaim; soft not copied",
			yaml: "enforceNodeAllocatable: [pods, kube-reserved]\nevictionHard:\n  memory.available: 500Mi\nevictionMinimumReclaim:\n  memory.available: 1Gi\n" +
				"evictionSoft:\n  memory.available: 2Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\n",
			hard: "memory.available<500Mi,allocatableMemory.available<500Mi", reclaim: "allocatableMemory.available=1Gi,memory.available=1Gi"},
		{name: "nothing enforced", yaml: "enforceNodeAllocatable: []\nevictionHard:\n  memory.available: 500Mi\n", hard: "memory.available<500Mi"},
		{name: "system-reserved only", yaml: "enforceNodeAllocatable: [system-reserved]\nevictionHard:\n  memory.available: 500Mi\n", hard: "memory.available<500Mi"},
		{name: "a higher allocatable one given stays", yaml: "evictionHard:\n  memory.available: 500Mi\n  allocatableMemory.available: 1Gi\n",
			hard: "memory.available<500Mi,allocatableMemory.available<1Gi"},
		{name: "a lower allocatable one given: the copy is met first", yaml: "evictionHard:\n  memory.available: 500Mi\n  allocatableMemory.available: 100Mi\n",
			hard: "memory.available<500Mi,allocatableMemory.available<500Mi"},
		{name: "no memory threshold", yaml: "evictionHard:\n  nodefs.available: 10%\n", hard: "nodefs.available<10%"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(hdr + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			hard, reclaim := c.EvictionHard()
			if got := thresholdStrings(hard); got != tt.hard {
				t.Errorf("EvictionHard = %s, want %s", got, tt.hard)
			}
			var rs []string
			for s, r := range reclaim {
				rs = append(rs, string(s)+"="+r.valueString())
			}
			slices.Sort(rs)
			if got := strings.Join(rs, ","); got != tt.reclaim {
				t.Errorf("minimum reclaims %s, want %s", got, tt.reclaim)
			}
			if strings.Contains(thresholdStrings(c.Hard), "allocatable") != strings.Contains(tt.yaml, "allocatable") {
				t.Errorf("Hard %s: the copy leaked into the file's own thresholds", thresholdStrings(c.Hard))
			}
		})
	}
	if hard, _ := DefaultConfig().EvictionHard(); !strings.Contains(thresholdStrings(hard), "allocatableMemory.available<100Mi") {
		t.Errorf("the kubelet's defaults: %s, want allocatableMemory.available<100Mi too", thresholdStrings(hard))
	}
}

// TestParseConfigImageGC reads the kubelet's image garbage collection band (issue 47): the
// defaults 85 and 80, the file's values, off at a high threshold of 100, and what the kubelet's
// validation refuses.
func TestParseConfigImageGC(t *testing.T) {
	head := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	for _, c := range []struct {
		doc       string
		low, high float64
		on        bool
		err       bool
	}{
		{"", 0.80, 0.85, true, false},
		{"imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\n", 0.70, 0.90, true, false},
		{"imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n", 0, 0, false, false},
		{"imageGCHighThresholdPercent: 80\n", 0, 0, false, true},
		{"imageGCLowThresholdPercent: -1\n", 0, 0, false, true},
		{"imageGCHighThresholdPercent: 101\n", 0, 0, false, true},
	} {
		kc, err := ParseConfig([]byte(head + c.doc))
		if (err != nil) != c.err {
			t.Errorf("%q: err %v, want an error: %v", c.doc, err, c.err)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), "imageGCHighThresholdPercent") {
				t.Errorf("%q: err %v does not name the field", c.doc, err)
			}
			continue
		}
		low, high, on := kc.ImageGC()
		if low != c.low || high != c.high || on != c.on {
			t.Errorf("%q: band %v-%v on %v, want %v-%v on %v", c.doc, low, high, on, c.low, c.high, c.on)
		}
	}
	if low, high, on := DefaultConfig().ImageGC(); low != 0.8 || high != 0.85 || !on {
		t.Errorf("DefaultConfig: band %v-%v on %v, want the kubelet's 80-85", low, high, on)
	}
}
