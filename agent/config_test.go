package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/pressure"
)

func parse(t *testing.T, args []string, env map[string]string) (Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := ApplyEnv(fs, "REPRIEVE_", lookup); err != nil {
		return cfg, err
	}
	cfg.ApplyFallbacks(lookup)
	return cfg, cfg.Validate()
}

func TestConfigDefaultsAndEnv(t *testing.T) {
	cfg, err := parse(t, []string{"--node-name=n1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Provider != "auto" || cfg.PollInterval != time.Second || cfg.SafetyMargin != 5*time.Second ||
		cfg.InterruptionTaint != "cloud=spot:NoExecute" || cfg.AWSIMDSEndpoint != "http://169.254.169.254" || cfg.MaintenanceLead != 10*time.Minute {
		t.Errorf("defaults = %+v", cfg)
	}

	cfg, err = parse(t, nil, map[string]string{
		"REPRIEVE_NODE_NAME": "from-env", "REPRIEVE_POLL_INTERVAL": "2s", "REPRIEVE_DRY_RUN": "true",
		"REPRIEVE_SAFETY_MARGIN": "10s", "NODE_NAME": "ignored",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "from-env" || cfg.PollInterval != 2*time.Second || !cfg.DryRun || cfg.SafetyMargin != 10*time.Second {
		t.Errorf("env values not applied: %+v", cfg)
	}

	// Issue 21: the GCP maintenance notice is unset by default (decided from the VM), the
	// figures are GCE's, and no extended preemption notice; each reads its variable.
	cfg, err = parse(t, []string{"--node-name=n1"}, nil)
	if err != nil || cfg.GCPMaintenanceNotice != 0 || cfg.GCPGPUMaintenanceNotice != time.Hour || cfg.GCPVMMaintenanceNotice != time.Minute || cfg.GCPPreemptionNotice != 0 {
		t.Errorf("GCP notice defaults: %v %v %v %v (%v)", cfg.GCPMaintenanceNotice, cfg.GCPGPUMaintenanceNotice, cfg.GCPVMMaintenanceNotice, cfg.GCPPreemptionNotice, err)
	}
	cfg, err = parse(t, []string{"--node-name=n1"}, map[string]string{"REPRIEVE_GCP_PREEMPTION_NOTICE": "120s", "REPRIEVE_GCP_MAINTENANCE_NOTICE": "5m"})
	if err != nil || cfg.GCPPreemptionNotice != 120*time.Second || cfg.GCPMaintenanceNotice != 5*time.Minute {
		t.Errorf("GCP notices from the environment: %v %v (%v)", cfg.GCPPreemptionNotice, cfg.GCPMaintenanceNotice, err)
	}

	// A flag on the command line wins over its variable.
	cfg, err = parse(t, []string{"--node-name=flag"}, map[string]string{"REPRIEVE_NODE_NAME": "env"})
	if err != nil || cfg.NodeName != "flag" {
		t.Errorf("flag should win: %q, %v", cfg.NodeName, err)
	}
	// The downward API's variables are fallbacks; KUBECONFIG is left to client-go's loading
	// rules (it may list several files).
	cfg, err = parse(t, nil, map[string]string{"NODE_NAME": "dn", "KUBECONFIG": "/k", "POD_NAME": "p", "POD_NAMESPACE": "ns"})
	if err != nil || cfg.NodeName != "dn" || cfg.Kubeconfig != "" || cfg.PodName != "p" || cfg.PodNamespace != "ns" {
		t.Errorf("fallbacks: %+v, %v", cfg, err)
	}
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"missing node name", nil, nil, []string{"--node-name"}},
		{"bad env duration", []string{"--node-name=n"}, map[string]string{"REPRIEVE_POLL_INTERVAL": "soon"}, []string{"--poll-interval", "REPRIEVE_POLL_INTERVAL", "soon"}},
		{"bad env bool", []string{"--node-name=n"}, map[string]string{"REPRIEVE_DRY_RUN": "maybe"}, []string{"--dry-run"}},
		{"unknown provider", []string{"--node-name=n", "--provider=oracle"}, nil, []string{"--provider", "oracle"}},
		{"taint syntax", []string{"--node-name=n", "--interruption-taint=cloud"}, nil, []string{"--interruption-taint", "key[=value]:Effect"}},
		{"taint effect", []string{"--node-name=n", "--interruption-taint=cloud=spot:Sometimes"}, nil, []string{"--interruption-taint", "Sometimes"}},
		{"interruption taint must evict", []string{"--node-name=n", "--interruption-taint=cloud=spot:NoSchedule"}, nil, []string{"--interruption-taint", "NoExecute"}},
		{"NoSchedule is the eviction mode's", []string{"--node-name=n", "--interruption-taint=cloud=spot:NoSchedule"}, nil, []string{"--interruption-eviction=reprieve"}},
		{"unknown eviction mode", []string{"--node-name=n"}, map[string]string{"REPRIEVE_INTERRUPTION_EVICTION": "budgets"}, []string{"--interruption-eviction", "budgets", "kube-controller-manager or reprieve"}},
		{"bad taint key", []string{"--node-name=n", "--interruption-taint=-bad-=x:NoExecute"}, nil, []string{"--interruption-taint", "key"}},
		{"soft taint outside reprieve.io", []string{"--node-name=n", "--rebalance-taint=foo=bar:PreferNoSchedule"}, nil, []string{"--rebalance-taint", "reprieve.io/"}},
		{"soft taint must not evict", []string{"--node-name=n", "--maintenance-taint=reprieve.io/m=x:NoExecute"}, nil, []string{"--maintenance-taint"}},
		{"negative margin", []string{"--node-name=n", "--safety-margin=-1s"}, nil, []string{"--safety-margin"}},
		{"lifecycle conditions need node conditions", []string{"--node-name=n", "--node-conditions=false", "--lifecycle-conditions"}, nil, []string{"--lifecycle-conditions", "--node-conditions"}},
		{"poll too fast", []string{"--node-name=n", "--poll-interval=10ms"}, nil, []string{"--poll-interval"}},
		{"negative preemption notice", []string{"--node-name=n", "--gcp-preemption-notice=-1s"}, nil, []string{"--gcp-preemption-notice"}},
		{"maintenance notice typo", []string{"--node-name=n", "--gcp-maintenance-notice=200h"}, nil, []string{"--gcp-maintenance-notice", "24h"}},
		{"zero GPU notice", []string{"--node-name=n", "--gcp-gpu-maintenance-notice=0s"}, nil, []string{"--gcp-gpu-maintenance-notice"}},
		{"every problem at once", []string{"--provider=x", "--safety-margin=-1s"}, nil, []string{"--node-name", "--provider", "--safety-margin"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.args, tc.env)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseTaint(t *testing.T) {
	got, err := ParseTaint("example.com/key=value:PreferNoSchedule")
	if err != nil {
		t.Fatal(err)
	}
	want := v1.Taint{Key: "example.com/key", Value: "value", Effect: v1.TaintEffectPreferNoSchedule}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got, err := ParseTaint("k:NoExecute"); err != nil || got.Value != "" {
		t.Errorf("key without value: %+v, %v", got, err)
	}
	if _, err := ParseTaint("k=" + strings.Repeat("v", 64) + ":NoExecute"); err == nil {
		t.Error("a value over 63 characters must be refused")
	}
}

func TestWebhookFromSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secretURL = "https://hooks.example.com/services/T000/B000/s3cr3t"
	url := write("url", secretURL+"\n")
	headers := write("headers", "# from the Secret\nAuthorization: Bearer s3cr3t\n\nX-Team: platform\n")
	cfg := DefaultConfig()
	cfg.WebhookURLFile, cfg.WebhookHeadersFile = url, headers
	cfg.WebhookHeaders = []string{"X-Source: reprieve"}
	n, ok, err := cfg.NotifyConfig()
	if err != nil || !ok {
		t.Fatalf("ok %v, err %v", ok, err)
	}
	if n.URL != secretURL || n.Headers["Authorization"] != "Bearer s3cr3t" || n.Headers["X-Team"] != "platform" || n.Headers["X-Source"] != "reprieve" {
		t.Errorf("url %q, headers %v", n.URL, n.Headers)
	}

	for name, c := range map[string]Config{
		"both url forms":         {WebhookURL: secretURL, WebhookURLFile: url},
		"unreadable url file":    {WebhookURLFile: filepath.Join(dir, "missing")},
		"empty url file":         {WebhookURLFile: write("empty", " \n")},
		"headers without url":    {WebhookHeadersFile: headers},
		"header line no colon":   {WebhookURLFile: url, WebhookHeadersFile: write("bad", "Authorization Bearer s3cr3t\n")},
		"unreadable header file": {WebhookURLFile: url, WebhookHeadersFile: filepath.Join(dir, "missing")},
	} {
		full := DefaultConfig()
		full.WebhookURL, full.WebhookURLFile, full.WebhookHeadersFile = c.WebhookURL, c.WebhookURLFile, c.WebhookHeadersFile
		_, _, err := full.NotifyConfig()
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

// TestKubeletConfigFlags: by default the known locations are searched (no path, no drop-in
// directory); each flag and its variable set one.
func TestKubeletConfigFlags(t *testing.T) {
	cfg, err := parse(t, []string{"--node-name=n1"}, nil)
	if err != nil || cfg.KubeletConfig != "" || cfg.KubeletConfigDir != "" {
		t.Errorf("defaults %q %q (%v), want both empty: search the known locations", cfg.KubeletConfig, cfg.KubeletConfigDir, err)
	}
	cfg, err = parse(t, []string{"--node-name=n1", "--kubelet-config=/etc/k/config.json"}, map[string]string{"REPRIEVE_KUBELET_CONFIG_DIR": "/etc/k/config.json.d"})
	if err != nil || cfg.KubeletConfig != "/etc/k/config.json" || cfg.KubeletConfigDir != "/etc/k/config.json.d" {
		t.Errorf("set: %q %q (%v)", cfg.KubeletConfig, cfg.KubeletConfigDir, err)
	}
}

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
	cfg := DefaultConfig()
	cfg.NodeName, cfg.HostRoot = "n1", root
	unvalidated := cfg
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, unvalidated) {
		t.Errorf("Validate changed the configuration: %+v, was %+v", cfg, unvalidated)
	}
	h := newHarness(t, func(c *Config) { c.HostRoot = root }, testNode())
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
	if kr := ReadKubeletConfig(unvalidated); kr.Err != nil || kr.Config.ShutdownGracePeriod != 0 || kr.Config.Hard[0].String() != "memory.available<900Mi" {
		t.Errorf("a new read: %+v %v, want the new file", kr.Config, kr.Err)
	}
	elsewhere := cfg
	elsewhere.KubeletConfig = "/elsewhere.yaml"
	kr := ReadKubeletConfig(elsewhere)
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
			h := newHarness(t, func(c *Config) {
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
