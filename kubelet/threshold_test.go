package kubelet

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func q(s string) *resource.Quantity {
	v := resource.MustParse(s)
	return &v
}

// pct is a percentage as the kubelet stores it: float32(v)/100 in float32.
func pct(v float32) float64 { return float64(v / 100) }

func sameThresholds(a, b []Threshold) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameThreshold(a[i], b[i]) {
			return false
		}
	}
	return true
}

func sameThreshold(a, b Threshold) bool {
	if a.Signal != b.Signal || a.Percentage != b.Percentage || (a.Quantity == nil) != (b.Quantity == nil) {
		return false
	}
	return a.Quantity == nil || a.Quantity.Cmp(*b.Quantity) == 0
}

func TestParseThresholds(t *testing.T) {
	tests := []struct {
		spec string
		want []Threshold
		str  string // joined String()s
	}{
		{spec: "", want: nil},
		{spec: " , ", want: nil},
		{
			spec: "memory.available<500Mi,nodefs.available<15%",
			want: []Threshold{{Signal: MemoryAvailable, Quantity: q("500Mi")}, {Signal: NodeFsAvailable, Percentage: pct(15)}},
			str:  "memory.available<500Mi,nodefs.available<15%",
		},
		{
			// Order kept; spaces and empty items skipped, as the kubelet's flag does.
			spec: " pid.available < 1000 ,, imagefs.inodesFree<2.5% ",
			want: []Threshold{{Signal: PIDAvailable, Quantity: q("1000")}, {Signal: ImageFsInodesFree, Percentage: pct(2.5)}},
			str:  "pid.available<1k,imagefs.inodesFree<2.5%",
		},
		{
			// "0%" and "100%" disable a signal in the kubelet: no threshold, no error.
			spec: "memory.available<0%,nodefs.available<100%,nodefs.inodesFree<100.0%",
			want: []Threshold{{Signal: NodeFsInodesFree, Percentage: 1}},
			// Not "100%", which the kubelet reads as no threshold: String() round-trips.
			str: "nodefs.inodesFree<100.0%",
		},
		{spec: "imagefs.available<0.0%", want: nil},
		{spec: "memory.available<1Gi", want: []Threshold{{Signal: MemoryAvailable, Quantity: q("1Gi")}}, str: "memory.available<1Gi"},
		{spec: "memory.available<10%%", want: []Threshold{{Signal: MemoryAvailable, Percentage: pct(10)}}, str: "memory.available<10%"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseThresholds(tt.spec)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if !sameThresholds(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			var strs []string
			for _, th := range got {
				strs = append(strs, th.String())
			}
			if s := strings.Join(strs, ","); s != tt.str {
				t.Errorf("String() = %q, want %q", s, tt.str)
			}
		})
	}
}

func TestParseThresholdsErrors(t *testing.T) {
	tests := []struct {
		spec  string
		quote string // the item the error must quote
		has   string
	}{
		{spec: "memory.available", quote: "memory.available", has: "signal<value"},
		{spec: "memory.available>100Mi", quote: "memory.available>100Mi", has: `"<"`},
		{spec: "memory.available=100Mi", quote: "memory.available=100Mi", has: `"<"`},
		{spec: "memory.available<=100Mi", quote: "memory.available<=100Mi", has: `"<"`},
		{spec: "memory.free<100Mi", quote: "memory.free<100Mi", has: "unknown signal"},
		{spec: "containerfs.available<100Mi", quote: "containerfs.available<100Mi", has: "unknown signal"},
		{spec: "memory.available<-100Mi", quote: "memory.available<-100Mi", has: "positive"},
		{spec: "memory.available<0", quote: "memory.available<0", has: "positive"},
		{spec: "memory.available<lots", quote: "memory.available<lots", has: "not a quantity"},
		{spec: "nodefs.available<-5%", quote: "nodefs.available<-5%", has: "between"},
		{spec: "nodefs.available<101%", quote: "nodefs.available<101%", has: "between"},
		{spec: "nodefs.available<NaN%", quote: "nodefs.available<NaN%", has: "not a percentage"},
		{spec: "nodefs.available<ten%", quote: "nodefs.available<ten%", has: "not a percentage"},
		{spec: "nodefs.available<1e40%", quote: "nodefs.available<1e40%", has: "not a percentage"},
		{spec: "nodefs.available<10%,nodefs.available<20%", quote: "nodefs.available<20%", has: "twice"},
		// A disabled signal still counts as given.
		{spec: "nodefs.available<0%,nodefs.available<20%", quote: "nodefs.available<20%", has: "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseThresholds(tt.spec)
			if err == nil {
				t.Fatalf("got %v, want an error", got)
			}
			if !strings.Contains(err.Error(), `"`+tt.quote+`"`) || !strings.Contains(err.Error(), tt.has) {
				t.Errorf("error %q, want it to quote %q and say %q", err, tt.quote, tt.has)
			}
		})
	}
}

func TestParseThresholdMap(t *testing.T) {
	got, err := ParseThresholdMap(map[string]string{
		"pid.available":     "5%",
		"imagefs.available": "15%",
		"memory.available":  "100Mi",
		"nodefs.available":  "0%", // disabled
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Threshold{
		{Signal: MemoryAvailable, Quantity: q("100Mi")},
		{Signal: ImageFsAvailable, Percentage: pct(15)},
		{Signal: PIDAvailable, Percentage: pct(5)},
	}
	if !sameThresholds(got, want) {
		t.Errorf("got %v, want %v (in Signals order)", got, want)
	}
	if got, err := ParseThresholdMap(nil); err != nil || got != nil {
		t.Errorf("ParseThresholdMap(nil) = %v, %v; want nil, nil", got, err)
	}

	for _, tt := range []struct {
		m     map[string]string
		quote string
	}{
		{m: map[string]string{"memory.available": "-1"}, quote: "-1"},
		{m: map[string]string{"nodefs.available": "200%"}, quote: "200%"},
		{m: map[string]string{"disk.available": "1Gi"}, quote: "disk.available"},
		{m: map[string]string{"memory.available": "100Mi", "pid.available": "x"}, quote: `"x"`},
	} {
		_, err := ParseThresholdMap(tt.m)
		if err == nil || !strings.Contains(err.Error(), tt.quote) {
			t.Errorf("ParseThresholdMap(%v) error %v, want one quoting %s", tt.m, err, tt.quote)
		}
	}
}

func TestParseMinimumReclaim(t *testing.T) {
	got, err := ParseMinimumReclaim("memory.available=500Mi, nodefs.available=1%,imagefs.available=0,pid.available=150%")
	if err != nil {
		t.Fatal(err)
	}
	want := map[Signal]Threshold{
		MemoryAvailable:  {Signal: MemoryAvailable, Quantity: q("500Mi")},
		NodeFsAvailable:  {Signal: NodeFsAvailable, Percentage: pct(1)},
		ImageFsAvailable: {Signal: ImageFsAvailable, Quantity: q("0")}, // the kubelet allows 0 here
		PIDAvailable:     {Signal: PIDAvailable, Percentage: pct(150)}, // and no upper bound
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for s, w := range want {
		if !sameThreshold(got[s], w) {
			t.Errorf("%s: got %v, want %v", s, got[s], w)
		}
	}
	if got, err := ParseMinimumReclaim(""); err != nil || len(got) != 0 {
		t.Errorf(`ParseMinimumReclaim("") = %v, %v`, got, err)
	}

	for _, tt := range []struct{ spec, quote, has string }{
		{spec: "memory.available<500Mi", quote: "memory.available<500Mi", has: "signal=value"},
		{spec: "memory.available=-1Mi", quote: "memory.available=-1Mi", has: "negative"},
		{spec: "memory.available=0%", quote: "memory.available=0%", has: "positive"},
		{spec: "nodefs.available=abc", quote: "nodefs.available=abc", has: "not a quantity"},
		{spec: "cpu.available=1", quote: "cpu.available=1", has: "unknown signal"},
		{spec: "pid.available=1,pid.available=2", quote: "pid.available=2", has: "twice"},
	} {
		_, err := ParseMinimumReclaim(tt.spec)
		if err == nil || !strings.Contains(err.Error(), `"`+tt.quote+`"`) || !strings.Contains(err.Error(), tt.has) {
			t.Errorf("ParseMinimumReclaim(%q) error %v, want it to quote %q and say %q", tt.spec, err, tt.quote, tt.has)
		}
	}
}

func TestThresholdValue(t *testing.T) {
	tests := []struct {
		name     string
		th       Threshold
		capacity int64
		want     int64
	}{
		{name: "quantity ignores capacity", th: Threshold{Quantity: q("100Mi")}, capacity: 1 << 40, want: 100 << 20},
		{name: "fractional quantity rounds up", th: Threshold{Quantity: q("1500m")}, capacity: 10, want: 2},
		{name: "10% of 1000", th: Threshold{Percentage: pct(10)}, capacity: 1000, want: 100},
		// The kubelet's float32 10% is 0.100000001490116..., so 100 GiB gives 160 bytes more than
		// an exact tenth; GetThresholdQuantity truncates.
		{name: "10% of 100Gi at float32", th: Threshold{Percentage: pct(10)}, capacity: 100 << 30, want: 10737418400},
		// float32 1% is 0.0099999998: 1% of 1000 is 9, as in the kubelet.
		{name: "1% of 1000 truncates at float32", th: Threshold{Percentage: pct(1)}, capacity: 1000, want: 9},
		{name: "5% of inodes", th: Threshold{Percentage: pct(5)}, capacity: 6553600, want: 327680},
		{name: "100%", th: Threshold{Percentage: 1}, capacity: 777, want: 777},
		{name: "zero capacity", th: Threshold{Percentage: pct(15)}, capacity: 0, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.th.Value(tt.capacity); got != tt.want {
				t.Errorf("Value(%d) = %d, want %d", tt.capacity, got, tt.want)
			}
		})
	}
}

func TestDefaultHard(t *testing.T) {
	var strs []string
	for _, th := range DefaultHard() {
		strs = append(strs, th.String())
	}
	want := "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%"
	if got := strings.Join(strs, ","); got != want {
		t.Errorf("DefaultHard() = %s, want %s", got, want)
	}
}

// A quantity beyond int64 would saturate or wrap when compared: refused, quoting it.
func TestThresholdQuantityTooLarge(t *testing.T) {
	for _, spec := range []string{"memory.available<1E30", "nodefs.available<100Ei"} {
		if _, err := ParseThresholds(spec); err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("ParseThresholds(%q) = %v, want a too-large error", spec, err)
		}
	}
	if _, err := ParseMinimumReclaim("memory.available=1E30"); err == nil {
		t.Error("a minimum reclaim beyond int64 accepted")
	}
}
