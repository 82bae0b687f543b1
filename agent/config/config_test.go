package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/pressure/replay"
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

// The replay (agent/pressure/replay) runs the series as the chart runs reprieve: its defaults
// are the agent's.
func TestReplayOptionsAreTheAgentDefaults(t *testing.T) {
	cfg := DefaultConfig()
	o := replay.DefaultOptions()
	headroom, err := parsePercent(cfg.PressureHeadroom)
	if err != nil {
		t.Fatal(err)
	}
	if o.Interval != cfg.PressureInterval || o.TransitionPeriod != cfg.PressureTransitionPeriod || o.TrendWindow != cfg.PressureTrendWindow ||
		o.SafetyMargin != cfg.SafetyMargin || o.Headroom != headroom {
		t.Fatalf("replay options %+v, the agent's %v %v %v %v %v", o, cfg.PressureInterval, cfg.PressureTransitionPeriod,
			cfg.PressureTrendWindow, cfg.SafetyMargin, headroom)
	}
}
