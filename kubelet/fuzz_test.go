package kubelet

import (
	"math"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkThreshold fails unless t is well-formed: a known signal and exactly one of a positive
// quantity or a percentage in (0, 1].
func checkThreshold(t *testing.T, th Threshold) {
	t.Helper()
	if !th.Signal.Valid() {
		t.Fatalf("threshold %v: unknown signal", th)
	}
	if th.Quantity != nil {
		if th.Percentage != 0 || th.Quantity.Sign() <= 0 {
			t.Fatalf("threshold %v: quantity %v with percentage %v", th, th.Quantity, th.Percentage)
		}
		return
	}
	if !(th.Percentage > 0 && th.Percentage <= 1) {
		t.Fatalf("threshold %v: percentage %v outside (0, 1]", th, th.Percentage)
	}
	if v := th.Value(1 << 40); v < 0 || v > 1<<40 {
		t.Fatalf("threshold %v: Value(1Ti) = %d", th, v)
	}
}

func FuzzParseThresholds(f *testing.F) {
	for _, s := range []string{
		"",
		"memory.available<500Mi,nodefs.available<15%",
		"memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%",
		"pid.available<1000, imagefs.inodesFree<2.5%",
		"memory.available<0%,nodefs.available<100%",
		"memory.available<=1Gi",
		"nodefs.available<1e-3%",
		"nodefs.available<99.99999%",
		"memory.available<1.5",
		"memory.available<1E3",
		"nodefs.available<0x1p-2%",
		"nodefs.available<NaN%",
		"nodefs.available<10%,nodefs.available<10%",
		// Found by the fuzzer in CI: a 100% threshold written "0100%" rendered as "100%", which
		// the kubelet (and ParseThresholds) reads as no threshold.
		"memory.available<0100%",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		ts, err := ParseThresholds(spec)
		if err != nil {
			return
		}
		seen := map[Signal]bool{}
		for _, th := range ts {
			checkThreshold(t, th)
			if seen[th.Signal] {
				t.Fatalf("%q: %s twice in %v", spec, th.Signal, ts)
			}
			seen[th.Signal] = true
			// String() round-trips to the same threshold.
			back, err := ParseThresholds(th.String())
			if err != nil || len(back) != 1 || !sameThreshold(back[0], th) {
				t.Fatalf("%q: %v -> %q -> %v, %v", spec, th, th.String(), back, err)
			}
			if back[0].String() != th.String() {
				t.Fatalf("%q: String() not stable: %q then %q", spec, th.String(), back[0].String())
			}
		}
	})
}

func FuzzParseSummary(f *testing.F) {
	body, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(body)
	for _, s := range []string{
		`{}`,
		`{"node":{"memory":{"availableBytes":18446744073709551615,"workingSetBytes":2}}}`,
		`{"node":{"fs":{"availableBytes":3,"capacityBytes":2}},"pods":[{"podRef":{"uid":"x"}}]}`,
		`{"node":{"rlimit":{"maxpid":-1,"curproc":5}}}`,
		`{"node":{"rlimit":{"maxpid":10,"curproc":50}}}`,
		`{"pods":[{"podRef":{"uid":"a"},"memory":{"workingSetBytes":18446744073709551615}}]}`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := ParseSummary(body)
		if err != nil && s.Node == nil {
			return // did not parse at all
		}
		for sig, o := range s.Node {
			if !sig.Valid() {
				t.Fatalf("unknown signal %q", sig)
			}
			if o.Capacity < 0 {
				t.Fatalf("%s: negative capacity %+v", sig, o)
			}
			// Only pid.available can go below zero (curproc above maxpid), as in the kubelet.
			if sig != PIDAvailable && (o.Available < 0 || o.Available > o.Capacity) {
				t.Fatalf("%s: %+v, want 0 <= available <= capacity", sig, o)
			}
			if sig == PIDAvailable && o.Available > o.Capacity {
				t.Fatalf("%s: %+v, available above capacity", sig, o)
			}
		}
		if s.Pods == nil {
			t.Fatal("Pods nil from a parsed summary")
		}
		for uid, p := range s.Pods {
			if p.UID != uid || p.MemoryWorkingSet < 0 || p.EphemeralStorage < 0 || p.Processes < 0 {
				t.Fatalf("pod %q: %+v", uid, p)
			}
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	data, err := os.ReadFile("testdata/kubelet-config.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	for _, s := range []string{
		"",
		hdr,
		hdr + "evictionHard: {}\n",
		hdr + "evictionHard:\n  memory.available: 300Mi\n",
		hdr + "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 300Mi\n  pid.available: 10%\n",
		hdr + "evictionHard:\n  containerfs.available: 10%\n",
		hdr + "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 30s\n",
		hdr + "evictionMinimumReclaim:\n  nodefs.available: 200%\n",
		hdr + "evictionMaxPodGracePeriod: -1\n",
		hdr + "evictionPressureTransitionPeriod: 1h\n",
		hdr + "evictionPressureTransitionPeriod: -1s\n",
		hdr + "nodeStatusUpdateFrequency: 20s\n",
		"kind: ConfigMap\n",
		`{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","evictionHard":{"nodefs.inodesFree":"3%"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		for _, ts := range [][]Threshold{c.Hard, c.Soft} {
			last := -1
			for _, th := range ts {
				checkThreshold(t, th)
				if i := signalIndex(th.Signal); i <= last {
					t.Fatalf("thresholds %v not in Signals order or repeated", ts)
				} else {
					last = i
				}
			}
		}
		for _, th := range c.Soft {
			if _, ok := c.SoftGracePeriod[th.Signal]; !ok {
				t.Fatalf("soft %v without a grace period", th)
			}
		}
		for sig, m := range c.MinimumReclaim {
			if m.Signal != sig || !sig.Valid() {
				t.Fatalf("minimum reclaim %q: %v", sig, m)
			}
			if m.Quantity == nil && !(m.Percentage > 0) || m.Quantity != nil && m.Quantity.Sign() < 0 || math.IsInf(m.Percentage, 0) {
				t.Fatalf("minimum reclaim %v", m)
			}
		}
		if c.PressureTransitionPeriod <= 0 || c.MaxPodGracePeriod < 0 {
			t.Fatalf("periods %v, %v", c.PressureTransitionPeriod, c.MaxPodGracePeriod)
		}
	})
}

// FuzzParseFlagsEnvironment reads an environment file such as AKS's /etc/default/kubelet through
// the whole chain (ParseEnvironmentFile, SplitArgs, ParseKubeletFlags) and, when the kubelet
// would take its flags, the configuration they give.
func FuzzParseFlagsEnvironment(f *testing.F) {
	for _, s := range []string{
		"",
		aksFlagsFile,
		"KUBELET_FLAGS=--eviction-hard=\"\"\n",
		`KUBELET_FLAGS="--eviction-hard 'memory.available<1Gi, nodefs.available<5%' --eviction-pressure-transition-period 0s"`,
		"KUBELET_FLAGS=--eviction-soft=memory.available<1Gi --eviction-soft-grace-period=memory.available=1m --eviction-minimum-reclaim=memory.available=0\n",
		"KUBELET_FLAGS=--eviction-max-pod-grace-period=0x10 --node-status-update-frequency=-1s\n",
		"KUBELET_FLAGS=--eviction_hard=pid.available<1k,pid.available<2k --eviction-hard=,\n",
		"# comment\n; other\nKUBELET_FLAGS=one \\\n two\\ three \"four\n",
		"KUBELET_FLAGS='a'\"b\"c \\\nKUBELET_FLAGS=--config=x --config-dir y\n",
		"KUBELET_FLAGS=--eviction-hard -- --eviction-hard=memory.available<1Gi\n",
		"KUBELET_FLAGS=---x\x00KUBELET_FLAGS=--eviction-hard=memory.available<1Gi",
		"KUBELET_OPTS=--eviction-hard=memory.available<1Gi\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := ParseEnvironmentFile(data)
		if err != nil {
			return
		}
		for k := range env {
			// systemd's parser takes any key up to the first "=" after its first character
			// (so "==" sets "="), which its exec then drops as not a valid name.
			if k == "" || strings.ContainsAny(k, "\n\r") || strings.Contains(k[1:], "=") || strings.TrimLeft(k, " \t") != k {
				t.Fatalf("key %q", k)
			}
		}
		for _, a := range SplitArgs(env["KUBELET_FLAGS"]) {
			if !utf8.ValidString(a) {
				t.Fatalf("argument %q of valid UTF-8 input", a)
			}
		}
		fl, ok, err := ParseFlagsEnvironment(data, "KUBELET_FLAGS")
		if !ok || err != nil {
			return
		}
		for _, g := range fl.Given {
			if !strings.HasPrefix(g, "--") || !strings.Contains(g, "=") {
				t.Fatalf("given %q", g)
			}
		}
		c, err := fl.Config()
		if err != nil {
			return
		}
		for _, ts := range [][]Threshold{c.Hard, c.Soft} {
			for _, th := range ts {
				checkThreshold(t, th)
			}
		}
		for _, th := range c.Soft {
			if _, ok := c.SoftGracePeriod[th.Signal]; !ok {
				t.Fatalf("soft %v without a grace period", th)
			}
		}
		if c.PressureTransitionPeriod < 0 || c.MaxPodGracePeriod < 0 {
			t.Fatalf("periods %v, %v", c.PressureTransitionPeriod, c.MaxPodGracePeriod)
		}
		if fl.EvictionHard == nil && len(c.Hard) != 0 {
			t.Fatalf("hard thresholds %v without --eviction-hard", c.Hard)
		}
	})
}
