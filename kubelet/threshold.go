package kubelet

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Threshold is an eviction threshold in the kubelet's terms: the signal is crossed when what is
// available falls below Value(capacity).
type Threshold struct {
	Signal   Signal
	Quantity *resource.Quantity // absolute; nil when Percentage is used
	// Percentage is a fraction of capacity, 0 < p <= 1, kept at the kubelet's float32 precision
	// (parsePercentage) so that Value matches the kubelet's byte for byte. Minimum reclaims may
	// exceed 1, as the kubelet allows.
	Percentage float64
}

// Value is the available amount below which the threshold is crossed, for a given capacity.
//
// As the kubelet's GetThresholdQuantity: a percentage is int64(float64(capacity) * percentage),
// truncated. A fractional quantity is rounded up, which gives the same answer as the kubelet's
// exact comparison for the strict "available < value" test on whole units.
func (t Threshold) Value(capacity int64) int64 {
	if t.Quantity != nil {
		return t.Quantity.Value()
	}
	v := float64(capacity) * t.Percentage
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// String is the threshold in the kubelet's syntax, e.g. "memory.available<100Mi" or
// "nodefs.available<10%".
func (t Threshold) String() string {
	return string(t.Signal) + "<" + t.valueString()
}

func (t Threshold) valueString() string {
	if t.Quantity != nil {
		return t.Quantity.String()
	}
	return percentString(t.Percentage)
}

// percentString renders a fraction as the shortest percentage that parses back to the same
// float32 fraction, never the literal "0%" or "100%" that the kubelet ignores.
func percentString(p float64) string {
	f := float32(p) * 100
	cands := []float32{f}
	up, down := f, f
	for range 4 {
		up = math.Nextafter32(up, float32(math.Inf(1)))
		down = math.Nextafter32(down, float32(math.Inf(-1)))
		cands = append(cands, up, down)
	}
	best := ""
	for _, c := range cands {
		s := strconv.FormatFloat(float64(c), 'f', -1, 32)
		if q, err := parsePercentage(s); err == nil && q == p && (best == "" || len(s) < len(best)) {
			best = s
		}
	}
	if best == "" {
		best = strconv.FormatFloat(float64(f), 'f', -1, 32)
	}
	// The kubelet reads exactly "0%" and "100%" as "no threshold" (a string comparison), while
	// "100.0%" is a threshold at all of capacity: write the one the threshold is.
	if best == "0" || best == "100" {
		best += ".0"
	}
	return best + "%"
}

// parsePercentage is the kubelet's (pkg/kubelet/eviction/helpers.go): a float32 parse of the
// number before the "%", divided by 100 in float32.
func parsePercentage(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimRight(s, "%"), 32)
	if err != nil {
		return 0, err
	}
	return float64(float32(v) / 100), nil
}

// parseThresholdValue parses one hard or soft threshold's value, as the kubelet's
// parseThresholdStatement. It returns nil, nil for a threshold the kubelet ignores.
func parseThresholdValue(signal Signal, val string) (*Threshold, error) {
	if !signal.Valid() {
		return nil, fmt.Errorf("unknown signal (want one of %s)", signalList())
	}
	if strings.HasSuffix(val, "%") {
		// The kubelet ignores exactly "0%" and "100%": that is how a default is disabled.
		if val == "0%" || val == "100%" {
			return nil, nil
		}
		p, err := parsePercentage(val)
		if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
			// The kubelet lets NaN through its range checks; reject it here.
			return nil, errors.New("not a percentage")
		}
		if p < 0 || p > 1 {
			return nil, errors.New("percentage must be between 0% and 100%")
		}
		if p == 0 {
			// "0.0%" passes the kubelet's checks and can never be crossed (available < 0):
			// the same as "0%", so drop it rather than keep a threshold that means nothing.
			return nil, nil
		}
		return &Threshold{Signal: signal, Percentage: p}, nil
	}
	q, err := resource.ParseQuantity(val)
	if err != nil {
		return nil, fmt.Errorf("not a quantity or percentage: %w", err)
	}
	if q.Sign() <= 0 {
		return nil, errors.New("quantity must be positive")
	}
	if q.AsApproximateFloat64() >= math.MaxInt64 {
		// Value() would saturate or wrap, silently disabling the threshold.
		return nil, errors.New("quantity too large")
	}
	return &Threshold{Signal: signal, Quantity: &q}, nil
}

func signalList() string {
	s := make([]string, len(Signals))
	for i, x := range Signals {
		s[i] = string(x)
	}
	return strings.Join(s, ", ")
}

// ParseThresholds parses "memory.available<500Mi,nodefs.available<15%", the kubelet's
// --eviction-hard syntax. Empty items and spaces around names and values are skipped, as the
// kubelet's flag does. An item that does not parse is an error that quotes it; unknown signals,
// operators other than "<", non-positive quantities, percentages outside [0%, 100%] and duplicate
// signals are errors (the kubelet's flag lets the last duplicate win; here it is a mistake to
// report). As in the kubelet, "0%" and "100%" disable the signal: they give no threshold.
// Empty string = no thresholds. The result is in the order given.
func ParseThresholds(spec string) ([]Threshold, error) {
	var out []Threshold
	seen := map[Signal]bool{}
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, "<")
		if !ok {
			if strings.ContainsAny(item, ">=") {
				return nil, fmt.Errorf("threshold %q: the operator must be \"<\"", item)
			}
			return nil, fmt.Errorf("threshold %q: want signal<value", item)
		}
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if strings.HasPrefix(val, "=") {
			return nil, fmt.Errorf("threshold %q: the operator must be \"<\"", item)
		}
		signal := Signal(name)
		if seen[signal] {
			return nil, fmt.Errorf("threshold %q: %s given twice", item, signal)
		}
		seen[signal] = true
		t, err := parseThresholdValue(signal, val)
		if err != nil {
			return nil, fmt.Errorf("threshold %q: %w", item, err)
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	return out, nil
}

// ParseThresholdMap parses the kubelet config's form {"memory.available": "100Mi"}, with the same
// rules as ParseThresholds; the result is sorted in Signals order.
func ParseThresholdMap(m map[string]string) ([]Threshold, error) {
	var out []Threshold
	var errs []error
	for _, name := range sortedKeys(m) {
		t, err := parseThresholdValue(Signal(name), m[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q: %w", name, m[name], err))
			continue
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sortThresholds(out)
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortThresholds(ts []Threshold) {
	slices.SortStableFunc(ts, func(a, b Threshold) int { return signalIndex(a.Signal) - signalIndex(b.Signal) })
}

// parseMinimumReclaim parses one minimum reclaim value, as the kubelet's parseMinimumReclaims: a
// positive percentage (no "0%" rule and no upper bound there) or a non-negative quantity.
func parseMinimumReclaim(signal Signal, val string) (Threshold, error) {
	if !signal.Valid() {
		return Threshold{}, fmt.Errorf("unknown signal (want one of %s)", signalList())
	}
	if strings.HasSuffix(val, "%") {
		p, err := parsePercentage(val)
		if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
			return Threshold{}, errors.New("not a percentage")
		}
		if p <= 0 {
			return Threshold{}, errors.New("percentage must be positive")
		}
		return Threshold{Signal: signal, Percentage: p}, nil
	}
	q, err := resource.ParseQuantity(val)
	if err != nil {
		return Threshold{}, fmt.Errorf("not a quantity or percentage: %w", err)
	}
	if q.Sign() < 0 {
		return Threshold{}, errors.New("quantity must not be negative")
	}
	if q.AsApproximateFloat64() >= math.MaxInt64 {
		return Threshold{}, errors.New("quantity too large")
	}
	return Threshold{Signal: signal, Quantity: &q}, nil
}

// ParseMinimumReclaim parses "memory.available=500Mi,nodefs.available=1%" (the kubelet's
// --eviction-minimum-reclaim). An item that does not parse is an error that quotes it, and so is a
// duplicate signal.
func ParseMinimumReclaim(spec string) (map[Signal]Threshold, error) {
	out := map[Signal]Threshold{}
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("minimum reclaim %q: want signal=value", item)
		}
		signal := Signal(strings.TrimSpace(name))
		if _, dup := out[signal]; dup {
			return nil, fmt.Errorf("minimum reclaim %q: %s given twice", item, signal)
		}
		t, err := parseMinimumReclaim(signal, strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("minimum reclaim %q: %w", item, err)
		}
		out[signal] = t
	}
	return out, nil
}

// defaultHard is the kubelet's Linux evictionHard default (pkg/kubelet/eviction/defaults_linux.go).
var defaultHard = map[string]string{
	string(MemoryAvailable):   "100Mi",
	string(NodeFsAvailable):   "10%",
	string(NodeFsInodesFree):  "5%",
	string(ImageFsAvailable):  "15%",
	string(ImageFsInodesFree): "5%",
}

// DefaultHard is the kubelet's Linux evictionHard default: memory.available<100Mi,
// nodefs.available<10%, nodefs.inodesFree<5%, imagefs.available<15%, imagefs.inodesFree<5%.
// There is no pid.available default.
func DefaultHard() []Threshold {
	ts, err := ParseThresholdMap(defaultHard)
	if err != nil {
		panic(fmt.Sprintf("kubelet: default thresholds do not parse: %v", err))
	}
	return ts
}
