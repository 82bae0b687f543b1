package kubelet

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// aksFlagsFile is /etc/default/kubelet as AgentBaker's cse_config.sh (ensureKubelet) writes it on
// a pool without a kubelet config file: KUBELET_FLAGS unquoted, its flags sorted and each
// followed by a space (pkg/agent/utils.go GetOrderedKubeletConfigFlagString), the eviction values
// those of its e2e/node_config.go fixture.
const aksFlagsFile = "KUBELET_FLAGS=--address=0.0.0.0 --anonymous-auth=false --cloud-provider=external --cluster-dns=10.0.0.10 " +
	"--enforce-node-allocatable=pods --eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5% " +
	"--kube-reserved=cpu=100m,memory=1638Mi --kubeconfig=/var/lib/kubelet/kubeconfig --max-pods=110 " +
	"--node-status-update-frequency=10s --pod-max-pids=-1 --read-only-port=0 \n" +
	"KUBELET_REGISTER_SCHEDULABLE=true\n" +
	"NETWORK_POLICY=\n" +
	"KUBELET_NODE_LABELS=agentpool=flagpool,kubernetes.azure.com/agentpool=flagpool\n"

func TestParseEnvironmentFile(t *testing.T) {
	tests := []struct {
		name, data string
		want       map[string]string
	}{
		{name: "AgentBaker's file", data: aksFlagsFile, want: map[string]string{
			"KUBELET_FLAGS":                strings.TrimSuffix(strings.SplitN(aksFlagsFile, "\n", 2)[0][len("KUBELET_FLAGS="):], " "),
			"KUBELET_REGISTER_SCHEDULABLE": "true", "NETWORK_POLICY": "",
			"KUBELET_NODE_LABELS": "agentpool=flagpool,kubernetes.azure.com/agentpool=flagpool",
		}},
		{name: "double quotes", data: `A="--x=1 --y=2"`, want: map[string]string{"A": "--x=1 --y=2"}},
		{name: "single quotes are literal", data: `A='a\"b $c'`, want: map[string]string{"A": `a\"b $c`}},
		{name: "double-quote escapes", data: `A="q\"b\\s\$d\x"`, want: map[string]string{"A": `q"b\s$d\x`}},
		{name: "quotes inside an unquoted value are kept", data: `A=--eviction-hard="" --b`, want: map[string]string{"A": `--eviction-hard="" --b`}},
		{name: "quoted parts concatenate, blanks between dropped", data: `A="a b" 'c'd`, want: map[string]string{"A": "a bcd"}},
		{name: "blanks around name and =, trailing blanks", data: "  A  =   v w  \t\n", want: map[string]string{"A": "v w"}},
		{name: "comments and a line without =", data: "# KUBELET_FLAGS=--x\n; B=1\njunk\nC=2", want: map[string]string{"C": "2"}},
		{name: "backslash continuation", data: "A=one \\\ntwo\nB=x\\ y", want: map[string]string{"A": "one two", "B": "x y"}},
		{name: "continued double-quoted value", data: "A=\"one\\\ntwo\"", want: map[string]string{"A": "onetwo"}},
		{name: "last wins", data: "A=1\nA=2\n", want: map[string]string{"A": "2"}},
		{name: "empty and open quote at the end", data: "A=\nB=\"open", want: map[string]string{"A": "", "B": "open"}},
		{name: "CRLF", data: "A=1\r\nB=2\r\n", want: map[string]string{"A": "1", "B": "2"}},
		{name: "a NUL ends the file", data: "A=1\x00\nB=2", want: map[string]string{"A": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnvironmentFile([]byte(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if _, err := ParseEnvironmentFile([]byte("A=\xff\n")); err == nil {
		t.Error("invalid UTF-8: no error, want one as systemd refuses the file")
	}
}

func TestSplitArgs(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  \t ", nil},
		{"--a=1  --b 2 ", []string{"--a=1", "--b", "2"}},
		{`--eviction-hard=""`, []string{"--eviction-hard="}},
		{`--eviction-hard="memory.available<1Gi, nodefs.available<5%" --x`, []string{"--eviction-hard=memory.available<1Gi, nodefs.available<5%", "--x"}},
		{`--eviction-hard 'memory.available<1Gi'`, []string{"--eviction-hard", "memory.available<1Gi"}},
		{`"a b"c 'd'"e"`, []string{"a bc", "de"}},
		{`a\ b "c\"d" 'e\'f'`, []string{"a b", `c"d`, "e'f"}},
		{`"open quote`, []string{"open quote"}},
		{`a \`, []string{"a", ""}},
		{`""`, []string{""}},
	}
	for _, tt := range tests {
		if got := SplitArgs(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("SplitArgs(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestParseKubeletFlags: the expected values are what the kubelet's own flag set
// (k8s.io/kubernetes v1.37.2 options.AddKubeletConfigFlags on a pflag FlagSet with
// cliflag.WordSepNormalizeFunc) gives for the same arguments, checked with a program built on it.
func TestParseKubeletFlags(t *testing.T) {
	d := func(s string) *time.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &v
	}
	i32 := func(n int32) *int32 { return &n }
	tests := []struct {
		name string
		args []string
		want KubeletFlags
		err  string
	}{
		{name: "none", args: []string{"--v=2", "--cloud-provider=external"}, want: KubeletFlags{}},
		{
			name: "--name=value",
			args: []string{"--eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%", "--node-status-update-frequency=20s"},
			want: KubeletFlags{
				EvictionHard:              map[string]string{"memory.available": "750Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%"},
				NodeStatusUpdateFrequency: d("20s"),
				Given:                     []string{"--eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%", "--node-status-update-frequency=20s"},
			},
		},
		{
			name: "--name value, the value taken whatever it is",
			args: []string{"--eviction-soft", "memory.available<1Gi", "--eviction-soft-grace-period", "memory.available=1m30s", "--eviction-max-pod-grace-period", "-1"},
			want: KubeletFlags{
				EvictionSoft: map[string]string{"memory.available": "1Gi"}, EvictionSoftGracePeriod: map[string]string{"memory.available": "1m30s"},
				EvictionMaxPodGracePeriod: i32(-1),
				Given:                     []string{"--eviction-soft=memory.available<1Gi", "--eviction-soft-grace-period=memory.available=1m30s", "--eviction-max-pod-grace-period=-1"},
			},
		},
		{
			name: "empty --eviction-hard: an empty map, no hard thresholds",
			args: []string{"--eviction-hard="},
			want: KubeletFlags{EvictionHard: map[string]string{}, Given: []string{"--eviction-hard="}},
		},
		{
			// The first occurrence clears, later ones add; a later key wins; blanks trimmed,
			// empty items skipped.
			name: "repeated map flags accumulate",
			args: []string{"--eviction-hard=memory.available<750Mi,nodefs.available<10%", "--eviction-hard=,pid.available<1k, memory.available < 1Gi,"},
			want: KubeletFlags{
				EvictionHard: map[string]string{"memory.available": "1Gi", "nodefs.available": "10%", "pid.available": "1k"},
				Given:        []string{"--eviction-hard=memory.available<750Mi,nodefs.available<10%", "--eviction-hard=,pid.available<1k, memory.available < 1Gi,"},
			},
		},
		{
			name: "underscores normalized, scalars last wins, int32 base 0",
			args: []string{"--eviction_pressure_transition_period=1m", "--eviction-pressure-transition-period", "0s", "--eviction-max-pod-grace-period=0x1e"},
			want: KubeletFlags{EvictionPressureTransitionPeriod: d("0s"), EvictionMaxPodGracePeriod: i32(30),
				Given: []string{"--eviction-pressure-transition-period=1m", "--eviction-pressure-transition-period=0s", "--eviction-max-pod-grace-period=0x1e"}},
		},
		{
			name: "minimum reclaim, config and config-dir",
			args: []string{"--eviction-minimum-reclaim=memory.available=0Mi,nodefs.available=500Mi", "--config", "/etc/kubelet.yaml", "--config-dir=/etc/kubelet.d", "--config=/etc/other.yaml"},
			want: KubeletFlags{EvictionMinimumReclaim: map[string]string{"memory.available": "0Mi", "nodefs.available": "500Mi"},
				ConfigFile: "/etc/other.yaml", ConfigDir: "/etc/kubelet.d", Given: []string{"--eviction-minimum-reclaim=memory.available=0Mi,nodefs.available=500Mi"}},
		},
		{
			// Another flag's value in the space form is skipped with it; a shorthand too.
			name: "other flags and their values",
			args: []string{"--node-labels", "a=b", "-v", "2", "--enable-server", "--eviction-hard", "memory.available<2Gi", "stray"},
			want: KubeletFlags{EvictionHard: map[string]string{"memory.available": "2Gi"}, Given: []string{"--eviction-hard=memory.available<2Gi"}},
		},
		{
			name: "-- ends the flags",
			args: []string{"--eviction-hard=memory.available<2Gi", "--", "--eviction-hard=memory.available<3Gi"},
			want: KubeletFlags{EvictionHard: map[string]string{"memory.available": "2Gi"}, Given: []string{"--eviction-hard=memory.available<2Gi"}},
		},
		{name: "a pair without <", args: []string{"--eviction-hard=memory.available=1Gi"}, err: `invalid argument "memory.available=1Gi" for "--eviction-hard" flag: malformed pair, expect string<string`},
		{name: "a blank item", args: []string{"--eviction-hard=memory.available<1Gi, ,"}, err: "malformed pair"},
		{name: "a pair without =", args: []string{"--eviction-soft-grace-period=memory.available<1m"}, err: "expect string=string"},
		{name: "missing value", args: []string{"--eviction-hard"}, err: "flag needs an argument: --eviction-hard"},
		{name: "duration without unit", args: []string{"--eviction-pressure-transition-period=5"}, err: `"--eviction-pressure-transition-period"`},
		{name: "int32 overflow", args: []string{"--eviction-max-pod-grace-period=3000000000"}, err: "out of range"},
		{name: "bad syntax", args: []string{"---eviction-hard=x"}, err: "bad flag syntax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKubeletFlags(tt.args)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameFlags(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
			if got.HasEviction() != (len(tt.want.Given) > 0) {
				t.Errorf("HasEviction %v", got.HasEviction())
			}
		})
	}
}

func sameFlags(a, b KubeletFlags) bool {
	eqMap := func(x, y map[string]string) bool { return (x == nil) == (y == nil) && maps.Equal(x, y) }
	eqPtr := func(x, y *time.Duration) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return eqMap(a.EvictionHard, b.EvictionHard) && eqMap(a.EvictionSoft, b.EvictionSoft) &&
		eqMap(a.EvictionSoftGracePeriod, b.EvictionSoftGracePeriod) && eqMap(a.EvictionMinimumReclaim, b.EvictionMinimumReclaim) &&
		(a.EvictionMaxPodGracePeriod == nil) == (b.EvictionMaxPodGracePeriod == nil) &&
		(a.EvictionMaxPodGracePeriod == nil || *a.EvictionMaxPodGracePeriod == *b.EvictionMaxPodGracePeriod) &&
		eqPtr(a.EvictionPressureTransitionPeriod, b.EvictionPressureTransitionPeriod) && eqPtr(a.NodeStatusUpdateFrequency, b.NodeStatusUpdateFrequency) &&
		a.ConfigFile == b.ConfigFile && a.ConfigDir == b.ConfigDir && slices.Equal(a.Given, b.Given)
}

// TestParseFlagsEnvironment reads the flags through the whole chain: the environment file, the
// split of $KUBELET_FLAGS, the kubelet's flags.
func TestParseFlagsEnvironment(t *testing.T) {
	tests := []struct {
		name, data string
		ok         bool
		hard       string // KubeletFlags.Config's
		err        string
	}{
		{name: "AgentBaker's file", data: aksFlagsFile, ok: true, hard: "memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%"},
		{name: "quoted variable", data: `KUBELET_FLAGS="--v=2 --eviction-hard=memory.available<1Gi,pid.available<10%"`, ok: true, hard: "memory.available<1Gi,pid.available<10%"},
		{name: "quoted value inside the variable", data: `KUBELET_FLAGS='--eviction-hard="memory.available<1Gi, nodefs.available<5%"'`, ok: true, hard: "memory.available<1Gi,nodefs.available<5%"},
		{name: "--flag value form", data: "KUBELET_FLAGS=--eviction-hard memory.available<300Mi --max-pods=30", ok: true, hard: "memory.available<300Mi"},
		// AKS Windows's --eviction-hard="": systemd removes the quotes, the kubelet gets an empty map.
		{name: "empty eviction-hard", data: `KUBELET_FLAGS=--eviction-hard="" --max-pods=30`, ok: true, hard: ""},
		// Without --config and without --eviction-hard the kubelet has no hard threshold.
		{name: "no eviction flags", data: "KUBELET_FLAGS=--max-pods=30\n", ok: true, hard: ""},
		{name: "GKE's variable, not AKS's", data: `KUBELET_OPTS="--eviction-hard=memory.available<1Gi"`, ok: false},
		{name: "malformed", data: "KUBELET_FLAGS=--eviction-hard=lots", ok: true, err: "KUBELET_FLAGS: invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok, err := ParseFlagsEnvironment([]byte(tt.data), "KUBELET_FLAGS")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || ok != tt.ok {
				t.Fatalf("ok %v err %v, want %v", ok, err, tt.ok)
			}
			if !ok {
				return
			}
			c, err := f.Config()
			if err != nil {
				t.Fatal(err)
			}
			if got := thresholdStrings(c.Hard); got != tt.hard {
				t.Errorf("Hard = %s, want %s", got, tt.hard)
			}
		})
	}
}

// TestKubeletFlagsConfig: a kubelet on flags alone starts from the flag defaults (no
// evictionHard, 5m, 10s); flags' durations are kept as given, a file's zero defaulted.
func TestKubeletFlagsConfig(t *testing.T) {
	f, err := ParseKubeletFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Hard) != 0 || c.PressureTransitionPeriod != 5*time.Minute || c.NodeStatusUpdateFrequency != 10*time.Second || c.MaxPodGracePeriod != 0 {
		t.Errorf("no flags: %+v, want no hard thresholds, 5m, 10s", c)
	}

	f, err = ParseKubeletFlags([]string{"--eviction-pressure-transition-period=0s", "--node-status-update-frequency=0s",
		"--eviction-soft=memory.available<1Gi", "--eviction-soft-grace-period=memory.available=30s", "--eviction-max-pod-grace-period=60",
		"--eviction-minimum-reclaim=memory.available=100Mi"})
	if err != nil {
		t.Fatal(err)
	}
	if c, err = f.Config(); err != nil {
		t.Fatal(err)
	}
	if c.PressureTransitionPeriod != 0 || c.NodeStatusUpdateFrequency != 0 || thresholdStrings(c.Soft) != "memory.available<1Gi" ||
		c.SoftGracePeriod[MemoryAvailable] != 30*time.Second || c.MaxPodGracePeriod != time.Minute || c.MinimumReclaim[MemoryAvailable].Quantity.String() != "100Mi" {
		t.Errorf("got %+v", c)
	}

	for _, args := range [][]string{
		{"--eviction-soft=memory.available<1Gi"},              // no grace period: the kubelet refuses it
		{"--eviction-hard=memory.available<lots"},             // not a quantity
		{"--eviction-pressure-transition-period=-1s"},         // negative, as for the file
		{"--eviction-minimum-reclaim=memory.available=-1Mi"},  // negative
		{"--eviction-soft-grace-period=memory.available=-1s"}, // negative
	} {
		f, err := ParseKubeletFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Config(); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
