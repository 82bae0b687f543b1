package gcp

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
)

// TestWindows: which maintenance notice applies, and where it came from, for each way of
// telling a GPU VM from an ordinary one (issue 21), and the preemption window.
func TestWindows(t *testing.T) {
	gpuNode := func() (bool, string, bool) { return true, "nvidia.com/gpu in status.capacity", true }
	plainNode := func() (bool, string, bool) { return false, "", true }
	tests := []struct {
		name        string
		machineType string // "" leaves the fake's default; "-" makes it absent (404)
		opts        Options
		want        time.Duration
		source      string
	}{
		{name: "ordinary machine type", want: time.Minute, source: "assumed ordinary VM: machine type n2-standard-4, node not read yet"},
		{name: "GPU machine family", machineType: "a3-highgpu-8g", want: time.Hour, source: "GPU VM: machine type a3-highgpu-8g (family a3"},
		{name: "G2 machine family", machineType: "g2-standard-4", want: time.Hour, source: "family g2 comes with GPUs"},
		{name: "machine type not served", machineType: "-", want: time.Minute, source: "machine type unknown, node not read yet (the shorter notice)"},
		{name: "N1 with a GPU on the node", machineType: "n1-standard-8", opts: Options{NodeAccelerator: gpuNode}, want: time.Hour, source: "GPU VM: the node shows nvidia.com/gpu"},
		{name: "N1 without one", machineType: "n1-standard-8", opts: Options{NodeAccelerator: plainNode}, want: time.Minute, source: "ordinary VM: machine type n1-standard-8, no accelerator on the node"},
		{name: "the flag wins over a GPU family", machineType: "a2-highgpu-1g", opts: Options{MaintenanceNotice: 5 * time.Minute}, want: 5 * time.Minute, source: "--gcp-maintenance-notice"},
		{name: "the flag wins over an ordinary VM", opts: Options{MaintenanceNotice: 5 * time.Minute}, want: 5 * time.Minute, source: "--gcp-maintenance-notice"},
		{name: "scaled figures", machineType: "a2-highgpu-1g", opts: Options{GPUMaintenanceNotice: 40 * time.Second, VMMaintenanceNotice: 20 * time.Second}, want: 40 * time.Second, source: "GPU VM"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, nil)
			switch tc.machineType {
			case "":
			case "-":
				s.Delete(PathMachineType)
			default:
				s.SetMachineType(tc.machineType)
			}
			opts := tc.opts
			opts.Endpoint, opts.Clock = s.Addr(), clocktesting.NewFakePassiveClock(t0)
			p, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			ws := p.Windows()
			if len(ws) != 2 {
				t.Fatalf("windows %+v, want the maintenance and the preemption one", ws)
			}
			if ws[0].Duration != tc.want || !strings.Contains(ws[0].Source, tc.source) {
				t.Errorf("maintenance window %s from %q, want %s from %q", ws[0].Duration, ws[0].Source, tc.want, tc.source)
			}
			// The deadline follows the window.
			s.Set(PathMaintenanceEvent, MaintenanceTerminate)
			ns, err := p.Poll(context.Background())
			if err != nil || len(ns) != 1 || !ns[0].Deadline.Equal(t0.Add(tc.want)) {
				t.Errorf("notices %q (err %v), want a deadline %s after first seen", summaries(ns), err, tc.want)
			}
		})
	}
}

// TestNodeAcceleratorLater: the node is read after the provider started (the API server was
// down at start, issue 20 case 5): until then the shorter notice applies, then the GPU VM's.
func TestNodeAcceleratorLater(t *testing.T) {
	s := startFake(t, map[string]string{PathMaintenanceEvent: MaintenanceTerminate})
	s.SetMachineType("n1-standard-8")
	var known atomic.Bool
	p, err := New(Options{Endpoint: s.Addr(), Clock: clocktesting.NewFakePassiveClock(t0),
		NodeAccelerator: func() (bool, string, bool) { return known.Load(), "nvidia.com/gpu in status.capacity", known.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := p.Poll(context.Background())
	if err != nil || len(ns) != 1 || !ns[0].Deadline.Equal(t0.Add(time.Minute)) {
		t.Fatalf("before the node is read: %q (err %v), want first seen + 60 s", summaries(ns), err)
	}
	known.Store(true)
	ns, err = p.Poll(context.Background())
	if err != nil || len(ns) != 1 || !ns[0].Deadline.Equal(t0.Add(time.Hour)) {
		t.Fatalf("once the node shows a GPU: %q (err %v), want first seen + 1 h", summaries(ns), err)
	}
}

// TestPreemptionNotice: with an extended preemption notice the deadline is the power-off, the
// notice plus 30 s after preempted=TRUE, and the soft-off is the notice after it.
func TestPreemptionNotice(t *testing.T) {
	s := startFake(t, nil)
	p, err := New(Options{Endpoint: s.Addr(), Clock: clocktesting.NewFakePassiveClock(t0), PreemptionNotice: 120 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Preempt(120*time.Second, nil, nil)
	ns, err := p.Poll(context.Background())
	if err != nil || len(ns) != 1 {
		t.Fatalf("notices %q, err %v", summaries(ns), err)
	}
	n := ns[0]
	if n.Kind != providers.KindPreemption || !n.Deadline.Equal(t0.Add(150*time.Second)) || !n.SoftOff.Equal(t0.Add(120*time.Second)) {
		t.Errorf("notice %s soft-off %v, want deadline first seen + 150 s, soft-off + 120 s", summary(n), n.SoftOff)
	}
	ws := p.Windows()
	if ws[1].Duration != 150*time.Second || !strings.Contains(ws[1].Source, "--gcp-preemption-notice") {
		t.Errorf("preemption window %+v, want 150 s from --gcp-preemption-notice", ws[1])
	}
	// Without the option: 30 s, the soft-off at once.
	p2, _ := New(Options{Endpoint: s.Addr(), Clock: clocktesting.NewFakePassiveClock(t0)})
	ns, _ = p2.Poll(context.Background())
	if len(ns) != 1 || !ns[0].Deadline.Equal(t0.Add(30*time.Second)) || !ns[0].SoftOff.Equal(t0) {
		t.Errorf("without the option: %q soft-off %v, want first seen + 30 s, the soft-off at first seen", summaries(ns), ns[0].SoftOff)
	}
}

func TestNoticeOptionsBounds(t *testing.T) {
	for _, o := range []Options{{MaintenanceNotice: -time.Second}, {PreemptionNotice: -time.Second}, {GPUMaintenanceNotice: 48 * time.Hour}, {VMMaintenanceNotice: -1}} {
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), "must be between 0 and") {
			t.Errorf("New(%+v) = %v, want an error naming the bound", o, err)
		}
	}
}
