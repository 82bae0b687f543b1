package kubelet

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// configGroup is the KubeletConfiguration's API group.
const configGroup = "kubelet.config.k8s.io"

// DefaultConfigPath is where kubeadm puts the kubelet's configuration file; Locations lists the
// other platforms' paths.
const DefaultConfigPath = "/var/lib/kubelet/config.yaml"

// defaultPressureTransitionPeriod is the kubelet's evictionPressureTransitionPeriod default.
const defaultPressureTransitionPeriod = 5 * time.Minute

// The kubelet's imageGCHighThresholdPercent and imageGCLowThresholdPercent defaults
// (pkg/kubelet/apis/config/v1beta1/defaults.go).
const (
	defaultImageGCHigh = 85
	defaultImageGCLow  = 80
)

// defaultNodeStatusUpdateFrequency is the kubelet's nodeStatusUpdateFrequency default
// (pkg/kubelet/apis/config/v1beta1/defaults.go).
const defaultNodeStatusUpdateFrequency = 10 * time.Second

// maxConfigFile bounds the configuration file read; real ones are a few KiB.
const maxConfigFile = 4 << 20

// Config is the eviction part of the kubelet's configuration.
type Config struct {
	Hard, Soft     []Threshold
	MinimumReclaim map[Signal]Threshold
	// SoftGracePeriod is evictionSoftGracePeriod: how long each soft threshold must hold before the
	// kubelet evicts. The kubelet requires one for every soft threshold.
	SoftGracePeriod map[Signal]time.Duration
	// MaxPodGracePeriod is evictionMaxPodGracePeriod: the grace the kubelet allows a pod it
	// evicts for a soft threshold (hard evictions get none).
	MaxPodGracePeriod time.Duration
	// PressureTransitionPeriod is evictionPressureTransitionPeriod (default 5m): how long the
	// kubelet keeps a pressure condition after the signal recovers.
	PressureTransitionPeriod time.Duration
	// ShutdownGracePeriod and ShutdownGracePeriodCriticalPods are the kubelet's graceful node
	// shutdown (zero: off): at the ACPI soft-off it stops the pods still running, the ordinary
	// ones with ShutdownGracePeriod - ShutdownGracePeriodCriticalPods at most, then the critical
	// ones (pkg/kubelet/nodeshutdown, migrateConfig).
	ShutdownGracePeriod, ShutdownGracePeriodCriticalPods time.Duration
	// NodeStatusUpdateFrequency is nodeStatusUpdateFrequency (default 10s): how often the
	// kubelet computes the node's status and posts it when it changed (volumesInUse among it).
	// As the kubelet, which does not validate it, a negative value is kept as written.
	NodeStatusUpdateFrequency time.Duration
	// EnforcePodsAllocatable is whether enforceNodeAllocatable holds "pods" (its default): the
	// kubelet then limits the pods cgroup to node allocatable and evicts on
	// allocatableMemory.available too (EvictionHard).
	EnforcePodsAllocatable bool
	// ImageGCHighThresholdPercent and ImageGCLowThresholdPercent are the kubelet's image garbage
	// collection (defaults 85 and 80): every 5 minutes, once the image filesystem is used to the
	// high percentage or more, it deletes unused images until it is down to the low one
	// (realImageGCManager.GarbageCollect, pkg/kubelet/images). A high of 100 turns it off
	// (ImageGC).
	ImageGCHighThresholdPercent, ImageGCLowThresholdPercent int32
	// Ignored lists the entries the kubelet accepts but reprieve does not model
	// ("evictionHard.containerfs.available", "evictionSoft.allocatableMemory.available", ...),
	// so that the caller can log them.
	Ignored []string

	// Path is the file read, under the host root (FindConfig): the configuration file, or, for
	// a kubelet run on its flags alone, the file of its flags (FlagsFile). Found is false when
	// no file was found: the fields then hold the kubelet's defaults, but what the kubelet
	// really uses is unknown, and the caller must say so.
	Path  string
	Found bool
	// Platform names the known location (Locations) Path is, "" for another path; "AKS (kubelet
	// flags)" when the kubelet runs on its flags alone, "AKS (config file and kubelet flags)" when
	// its flags override some of its file's eviction settings.
	Platform string
	// DropInDir is the drop-in directory (the kubelet's --config-dir) merged over Path, ""
	// when none; DropIns are the files merged from it, in the order applied.
	DropInDir string
	DropIns   []string
	// FlagsFile is the environment file of the kubelet's command-line flags read with Path
	// (AKS's /etc/default/kubelet, KUBELET_FLAGS), "" when none was read; Flags are the eviction
	// flags found in it, as "--name=value", which override the file's and drop-ins' values as
	// the kubelet's flags do.
	FlagsFile string
	Flags     []string
	// Searched lists every file tried, in order, the one found last: when Found is false, the
	// places the configuration was looked for.
	Searched []string
}

// knownUnmodelled are signals the kubelet accepts (validSignal) that reprieve does not read: the
// kubelet derives containerfs thresholds from the nodefs or imagefs ones and ignores any given
// (UpdateContainerFsThresholds).
var knownUnmodelled = map[string]bool{
	"containerfs.available":  true,
	"containerfs.inodesFree": true,
}

// nodeAllocatableEnforcementKey is the enforceNodeAllocatable entry for the pods cgroup
// (kubetypes.NodeAllocatableEnforcementKey).
const nodeAllocatableEnforcementKey = "pods"

// evictionConfig is the eviction part of k8s.io/kubelet/config/v1beta1.KubeletConfiguration,
// with the same JSON names and types (TestEvictionConfigMatchesUpstream holds it to them).
// Decoding the whole upstream type would link component-base's logging, metrics and tracing, cobra
// and OpenTelemetry into the agent for eight fields.
type evictionConfig struct {
	APIVersion                       string            `json:"apiVersion,omitempty"`
	Kind                             string            `json:"kind,omitempty"`
	EvictionHard                     map[string]string `json:"evictionHard,omitempty"`
	EvictionSoft                     map[string]string `json:"evictionSoft,omitempty"`
	EvictionSoftGracePeriod          map[string]string `json:"evictionSoftGracePeriod,omitempty"`
	EvictionPressureTransitionPeriod metav1.Duration   `json:"evictionPressureTransitionPeriod,omitempty"`
	EvictionMaxPodGracePeriod        int32             `json:"evictionMaxPodGracePeriod,omitempty"`
	EvictionMinimumReclaim           map[string]string `json:"evictionMinimumReclaim,omitempty"`
	MergeDefaultEvictionSettings     *bool             `json:"mergeDefaultEvictionSettings,omitempty"`
	ShutdownGracePeriod              metav1.Duration   `json:"shutdownGracePeriod,omitempty"`
	ShutdownGracePeriodCriticalPods  metav1.Duration   `json:"shutdownGracePeriodCriticalPods,omitempty"`
	NodeStatusUpdateFrequency        metav1.Duration   `json:"nodeStatusUpdateFrequency,omitempty"`
	EnforceNodeAllocatable           []string          `json:"enforceNodeAllocatable,omitempty"`
	ImageGCHighThresholdPercent      *int32            `json:"imageGCHighThresholdPercent,omitempty"`
	ImageGCLowThresholdPercent       *int32            `json:"imageGCLowThresholdPercent,omitempty"`
}

// decodeEvictionConfig decodes a KubeletConfiguration file as the kubelet's codec does: YAML or
// JSON, field names matched case-sensitively, unknown fields ignored.
func decodeEvictionConfig(data []byte) (evictionConfig, error) {
	var kc evictionConfig
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return kc, fmt.Errorf("parsing KubeletConfiguration: %w", err)
	}
	if string(j) == "null" { // an empty file
		return kc, nil
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(j, &kc); err != nil {
		return kc, fmt.Errorf("parsing KubeletConfiguration: %w", err)
	}
	return kc, nil
}

// DefaultConfig is the configuration of a kubelet with no configuration file.
// Its enforceNodeAllocatable is the default ["pods"].
func DefaultConfig() Config {
	return Config{Hard: DefaultHard(), PressureTransitionPeriod: defaultPressureTransitionPeriod,
		NodeStatusUpdateFrequency: defaultNodeStatusUpdateFrequency, EnforcePodsAllocatable: true,
		ImageGCHighThresholdPercent: defaultImageGCHigh, ImageGCLowThresholdPercent: defaultImageGCLow}
}

// ReadConfig reads the kubelet's config file (a KubeletConfiguration YAML) at path, without
// drop-ins. A missing file gives the kubelet's defaults with Found false and path in Searched.
// See ParseConfig for the rules, FindConfig for the search of the known locations.
func ReadConfig(path string) (Config, error) {
	return FindConfig(Lookup{Path: path})
}

func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxConfigFile {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", path, st.Size(), maxConfigFile)
	}
	return os.ReadFile(path)
}

// ParseConfig is ReadConfig's pure part, on the file's bytes.
//
// As the kubelet's loadConfigFile (cmd/kubelet/app/server.go): with no evictionHard (absent or
// null) the defaults apply; once any evictionHard signal is set, the unset ones have no threshold
// unless mergeDefaultEvictionSettings is true, which fills them from the defaults. An explicit
// empty map ({}) therefore means no hard thresholds at all. The file must be a
// kubelet.config.k8s.io KubeletConfiguration, as the kubelet requires. Unknown fields are tolerated
// (kubelets are newer than us); a threshold that does not parse is an error naming the field and
// quoting the value, and so is a soft threshold without a grace period, as in the kubelet's
// ParseThresholdConfig.
func ParseConfig(data []byte) (Config, error) {
	kc, err := decodeMainConfig(data)
	if err != nil {
		return Config{}, err
	}
	return kc.config()
}

// decodeMainConfig decodes the main configuration file as the kubelet's loadConfigFile does: the
// type checked, then evictionHard defaulted (ParseConfig says how).
func decodeMainConfig(data []byte) (evictionConfig, error) {
	kc, err := decodeEvictionConfig(data)
	if err != nil {
		return kc, err
	}
	// The kubelet's loader refuses a file without its type; so does this, so that a wrong
	// --kubelet-config path is not read as "no settings, defaults apply".
	if kc.Kind != "KubeletConfiguration" || !strings.HasPrefix(kc.APIVersion, configGroup+"/") {
		return kc, fmt.Errorf("apiVersion %q kind %q, want %s/v1beta1 KubeletConfiguration", kc.APIVersion, kc.Kind, configGroup)
	}
	if kc.EvictionHard == nil {
		kc.EvictionHard = maps.Clone(defaultHard)
	} else if kc.MergeDefaultEvictionSettings != nil && *kc.MergeDefaultEvictionSettings {
		for k, v := range defaultHard {
			if _, ok := kc.EvictionHard[k]; !ok {
				kc.EvictionHard[k] = v
			}
		}
	}
	return kc, nil
}

// config validates and parses a decoded configuration whose evictionHard is already defaulted
// (decodeMainConfig, then any drop-ins): after the drop-ins the kubelet does not default
// evictionHard again, so a drop-in's "evictionHard: null" leaves no hard thresholds.
func (kc evictionConfig) config() (Config, error) {
	var err error
	c := Config{PressureTransitionPeriod: kc.EvictionPressureTransitionPeriod.Duration}
	switch {
	case c.PressureTransitionPeriod == 0:
		c.PressureTransitionPeriod = defaultPressureTransitionPeriod
	case c.PressureTransitionPeriod < 0:
		return Config{}, fmt.Errorf("evictionPressureTransitionPeriod %v is negative", c.PressureTransitionPeriod)
	}
	if kc.EvictionMaxPodGracePeriod < 0 {
		return Config{}, fmt.Errorf("evictionMaxPodGracePeriod %d is negative", kc.EvictionMaxPodGracePeriod)
	}
	c.MaxPodGracePeriod = time.Duration(kc.EvictionMaxPodGracePeriod) * time.Second
	// As the kubelet's validation (ValidateKubeletConfiguration): neither negative, the
	// critical pods' share within the whole.
	c.ShutdownGracePeriod, c.ShutdownGracePeriodCriticalPods = kc.ShutdownGracePeriod.Duration, kc.ShutdownGracePeriodCriticalPods.Duration
	if c.ShutdownGracePeriod < 0 || c.ShutdownGracePeriodCriticalPods < 0 || c.ShutdownGracePeriodCriticalPods > c.ShutdownGracePeriod {
		return Config{}, fmt.Errorf("shutdownGracePeriod %v and shutdownGracePeriodCriticalPods %v: want both non-negative, the second within the first",
			c.ShutdownGracePeriod, c.ShutdownGracePeriodCriticalPods)
	}

	// As SetDefaults_KubeletConfiguration, which the kubelet also runs after the drop-ins.
	c.NodeStatusUpdateFrequency = kc.NodeStatusUpdateFrequency.Duration
	if c.NodeStatusUpdateFrequency == 0 {
		c.NodeStatusUpdateFrequency = defaultNodeStatusUpdateFrequency
	}

	var errs []error
	// As SetDefaults_KubeletConfiguration and ValidateKubeletConfiguration: each within 0-100,
	// the low one under the high one.
	c.ImageGCHighThresholdPercent, c.ImageGCLowThresholdPercent = defaultImageGCHigh, defaultImageGCLow
	if kc.ImageGCHighThresholdPercent != nil {
		c.ImageGCHighThresholdPercent = *kc.ImageGCHighThresholdPercent
	}
	if kc.ImageGCLowThresholdPercent != nil {
		c.ImageGCLowThresholdPercent = *kc.ImageGCLowThresholdPercent
	}
	if h, l := c.ImageGCHighThresholdPercent, c.ImageGCLowThresholdPercent; h < 0 || h > 100 || l < 0 || l > 100 || l >= h {
		errs = append(errs, fmt.Errorf("imageGCHighThresholdPercent %d and imageGCLowThresholdPercent %d: want both within 0-100, the low one under the high one", h, l))
	}
	if c.Hard, err = c.thresholds("evictionHard", kc.EvictionHard); err != nil {
		errs = append(errs, err)
	}
	if c.Soft, err = c.thresholds("evictionSoft", kc.EvictionSoft); err != nil {
		errs = append(errs, err)
	}
	for _, name := range sortedKeys(kc.EvictionSoftGracePeriod) {
		val := kc.EvictionSoftGracePeriod[name]
		if c.ignore("evictionSoftGracePeriod", name) {
			continue
		}
		if !Signal(name).Valid() {
			errs = append(errs, fmt.Errorf("evictionSoftGracePeriod: %s: unknown signal", name))
			continue
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("evictionSoftGracePeriod: %s: %q is not a non-negative duration", name, val))
			continue
		}
		if c.SoftGracePeriod == nil {
			c.SoftGracePeriod = map[Signal]time.Duration{}
		}
		c.SoftGracePeriod[Signal(name)] = d
	}
	for _, t := range c.Soft {
		if _, ok := c.SoftGracePeriod[t.Signal]; !ok {
			errs = append(errs, fmt.Errorf("evictionSoft: %s has no evictionSoftGracePeriod", t.Signal))
		}
	}
	for _, name := range sortedKeys(kc.EvictionMinimumReclaim) {
		val := kc.EvictionMinimumReclaim[name]
		if c.ignore("evictionMinimumReclaim", name) {
			continue
		}
		t, err := parseMinimumReclaim(Signal(name), val)
		if err != nil {
			errs = append(errs, fmt.Errorf("evictionMinimumReclaim: %s: %q: %w", name, val, err))
			continue
		}
		if c.MinimumReclaim == nil {
			c.MinimumReclaim = map[Signal]Threshold{}
		}
		c.MinimumReclaim[t.Signal] = t
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	// As SetDefaults_KubeletConfiguration: enforceNodeAllocatable unset (nil) is ["pods"]; an
	// explicit empty list enforces nothing.
	c.EnforcePodsAllocatable = kc.EnforceNodeAllocatable == nil || slices.Contains(kc.EnforceNodeAllocatable, nodeAllocatableEnforcementKey)
	return c, nil
}

// EvictionHard returns the hard thresholds the kubelet's eviction manager holds, and their minimum
// reclaims: Hard, and with EnforcePodsAllocatable every hard memory.available threshold copied to
// allocatableMemory.available with its minimum reclaim, as the kubelet's addAllocatableThresholds
// (pkg/kubelet/eviction/helpers.go, from ParseThresholdConfig) copies them. The soft ones are not
// copied. When allocatableMemory.available is given as well the kubelet holds both; reprieve keeps
// one a signal, the higher (the one met first) when they compare, else the one given.
func (c Config) EvictionHard() ([]Threshold, map[Signal]Threshold) {
	hard, reclaim := slices.Clone(c.Hard), maps.Clone(c.MinimumReclaim)
	mem, ok := findThreshold(hard, MemoryAvailable)
	if !c.EnforcePodsAllocatable || !ok {
		return hard, reclaim
	}
	if own, ok := findThreshold(hard, AllocatableMemoryAvailable); ok {
		switch {
		case own.Quantity == nil && mem.Quantity == nil && own.Percentage >= mem.Percentage,
			own.Quantity != nil && mem.Quantity != nil && own.Quantity.Cmp(*mem.Quantity) >= 0,
			(own.Quantity == nil) != (mem.Quantity == nil):
			return hard, reclaim
		}
		hard = slices.DeleteFunc(hard, func(t Threshold) bool { return t.Signal == AllocatableMemoryAvailable })
	}
	mem.Signal = AllocatableMemoryAvailable
	hard = append(hard, mem)
	sortThresholds(hard)
	if r, ok := reclaim[MemoryAvailable]; ok {
		if _, own := reclaim[AllocatableMemoryAvailable]; !own {
			r.Signal = AllocatableMemoryAvailable
			reclaim[AllocatableMemoryAvailable] = r
		}
	}
	return hard, reclaim
}

// ImageGC returns the kubelet's image garbage collection band as shares of the image
// filesystem's capacity used: it starts at high and frees down to low. on is false when it is
// off (a high threshold of 100: StartGarbageCollection stubs it).
func (c Config) ImageGC() (low, high float64, on bool) {
	if c.ImageGCHighThresholdPercent >= 100 {
		return 0, 0, false
	}
	return float64(c.ImageGCLowThresholdPercent) / 100, float64(c.ImageGCHighThresholdPercent) / 100, true
}

func findThreshold(ts []Threshold, s Signal) (Threshold, bool) {
	for _, t := range ts {
		if t.Signal == s {
			return t, true
		}
	}
	return Threshold{}, false
}

// thresholds parses one threshold map, setting aside the signals the kubelet knows and reprieve
// does not model.
func (c *Config) thresholds(field string, m map[string]string) ([]Threshold, error) {
	kept := make(map[string]string, len(m))
	for _, name := range sortedKeys(m) {
		if !c.ignore(field, name) {
			kept[name] = m[name]
		}
	}
	ts, err := ParseThresholdMap(kept)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return ts, nil
}

func (c *Config) ignore(field, name string) bool {
	if knownUnmodelled[name] {
		c.Ignored = append(c.Ignored, field+"."+name)
		return true
	}
	return false
}
