package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
)

// noClient fails the test if a command that should stop at its flags asks for a client.
func noClient(t *testing.T) func(config.Config) (kube.Interface, error) {
	return func(config.Config) (kube.Interface, error) {
		t.Error("a client was made")
		return nil, errors.New("no client")
	}
}

// rootOutput runs the root command with args and returns what it wrote, stdout and stderr.
func rootOutput(t *testing.T, args ...string) string {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return out.String()
}

// TestSubcommandHelpListsItsOwnFlags: plan's and doctor's --help (and `reprieve help plan`) list
// their own flags, and the agent's in one line, not one by one.
func TestSubcommandHelpListsItsOwnFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		own  []string
		run  func(stderr *bytes.Buffer) int
	}{
		{"plan", []string{"--node", "--deadline", "--notice-time", "--output"}, func(stderr *bytes.Buffer) int {
			return runPlan(context.Background(), []string{"--help"}, &bytes.Buffer{}, stderr, time.Now(), noClient(t))
		}},
		{"doctor", []string{"--node"}, func(stderr *bytes.Buffer) int {
			return runDoctor(context.Background(), []string{"--help"}, &bytes.Buffer{}, stderr, noClient(t))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := tc.run(&stderr); code != 0 {
				t.Fatalf("--help: exit %d", code)
			}
			for name, help := range map[string]string{"--help": stderr.String(), "help " + tc.name: rootOutput(t, "help", tc.name)} {
				for _, want := range append([]string{"Usage: reprieve " + tc.name, "also accepts every agent flag (reprieve --help)"}, tc.own...) {
					if !strings.Contains(strings.ToLower(help), strings.ToLower(want)) {
						t.Errorf("%s lacks %s:\n%s", name, want, help)
					}
				}
				for _, agentOnly := range []string{"--eviction-workers", "--safety-margin", "--interruption-taint", "--gcp-gpu-maintenance-notice"} {
					if strings.Contains(help, agentOnly) {
						t.Errorf("%s lists the agent's %s:\n%s", name, agentOnly, help)
					}
				}
			}
		})
	}
}

// TestSubcommandsStillTakeAgentFlags: the agent's flags parse in plan and doctor (the chart's
// `kubectl exec ... /reprieve doctor` relies on them and on $REPRIEVE_*), hidden from the help.
func TestSubcommandsStillTakeAgentFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("REPRIEVE_EVICTION_WORKERS", "7")
	sc := newSubcommand("plan", "", &bytes.Buffer{})
	if code, ok := sc.parse([]string{"--node=n1", "--safety-margin=9s", "--gcp-vm-maintenance-notice=2m"}); !ok {
		t.Fatalf("exit %d", code)
	}
	if sc.cfg.NodeName != "n1" || sc.cfg.SafetyMargin != 9*time.Second || sc.cfg.EvictionWorkers != 7 || sc.cfg.GCPVMMaintenanceNotice != 2*time.Minute {
		t.Errorf("node %q, margin %v, workers %d, VM notice %v", sc.cfg.NodeName, sc.cfg.SafetyMargin, sc.cfg.EvictionWorkers, sc.cfg.GCPVMMaintenanceNotice)
	}
}

// TestSubcommandNamesItsNodeFlag: without a node, plan and doctor name their own --node, not the
// agent's --node-name, beside any other problem.
func TestSubcommandNamesItsNodeFlag(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("REPRIEVE_NODE_NAME", "")
	for name, run := range map[string]func(stderr *bytes.Buffer) int{
		"plan": func(stderr *bytes.Buffer) int {
			return runPlan(context.Background(), []string{"--deadline=120s", "--safety-margin=-1s"}, &bytes.Buffer{}, stderr, planNow, noClient(t))
		},
		"doctor": func(stderr *bytes.Buffer) int {
			return runDoctor(context.Background(), []string{"--safety-margin=-1s"}, &bytes.Buffer{}, stderr, noClient(t))
		},
	} {
		var stderr bytes.Buffer
		code := run(&stderr)
		got := stderr.String()
		if code != 2 || !strings.Contains(got, "reprieve "+name+": invalid configuration:\n--node (or $NODE_NAME) is required\n") ||
			!strings.Contains(got, "--safety-margin -1s") || strings.Contains(got, "--node-name") {
			t.Errorf("%s: exit %d, stderr %q; want 2 naming --node and the margin, not --node-name", name, code, got)
		}
	}
	// The agent itself names its own --node-name.
	cfg := config.DefaultConfig()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("the agent's Validate: %v; want it naming --node-name", err)
	}
}

// TestUsageListsEveryCommand: the top-level usage names every command, among them
// eviction-guard, which the chart's guard Deployment runs.
func TestUsageListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}} {
		help := rootOutput(t, args...)
		for _, c := range newRootCommand().Commands() {
			if c.IsAvailableCommand() && !strings.Contains(help, "reprieve "+c.Name()) {
				t.Errorf("%q lacks the command %s:\n%s", args, c.Name(), help)
			}
		}
		for _, want := range []string{"reprieve eviction-guard", "reprieve plan", "reprieve doctor", "reprieve audit", "reprieve version", "reprieve completion"} {
			if !strings.Contains(help, want) {
				t.Errorf("%q lacks %s", args, want)
			}
		}
	}
	// Other commands show their own usage, not the agent's flags.
	if help := rootOutput(t, "help", "version"); strings.Contains(help, "--node-name") || !strings.Contains(help, "reprieve version") {
		t.Errorf("help version:\n%s", help)
	}
}

// TestTestOnlyFlagsHidden: the GCE notice flags that only tests change are not in the agent's
// help (nor docs/flags.md), yet parse, from the command line and from $REPRIEVE_*.
func TestTestOnlyFlagsHidden(t *testing.T) {
	help := rootOutput(t, "--help")
	for _, name := range testOnlyFlags {
		// A line of its own; --gcp-maintenance-notice's text may still name it.
		listed := regexp.MustCompile(`(?m)^\s+--` + name + `\s`)
		if listed.MatchString(help) {
			t.Errorf("--help lists --%s:\n%s", name, help)
		}
		if listed.MatchString(flagsDoc()) {
			t.Errorf("docs/flags.md lists --%s", name)
		}
	}
	cfg := config.DefaultConfig()
	fs := agentFlagSet(&cfg)
	if err := fs.Parse([]string{"--gcp-gpu-maintenance-notice=5m"}); err != nil {
		t.Fatal(err)
	}
	if err := config.ApplyEnv(fs, "REPRIEVE_", func(k string) (string, bool) {
		return "90s", k == "REPRIEVE_GCP_VM_MAINTENANCE_NOTICE"
	}); err != nil {
		t.Fatal(err)
	}
	if cfg.GCPGPUMaintenanceNotice != 5*time.Minute || cfg.GCPVMMaintenanceNotice != 90*time.Second {
		t.Errorf("GPU notice %v, VM notice %v; want 5m and 90s", cfg.GCPGPUMaintenanceNotice, cfg.GCPVMMaintenanceNotice)
	}
	// Through the binary's entry point: a value the agent refuses proves the flag was read.
	t.Setenv("NODE_NAME", "")
	if code := run([]string{"--node-name=n", "--gcp-vm-maintenance-notice=0s"}); code != 2 {
		t.Errorf("--gcp-vm-maintenance-notice=0s: exit %d, want 2 (invalid configuration)", code)
	}
}
