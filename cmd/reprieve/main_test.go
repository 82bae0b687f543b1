package main

import (
	"runtime/debug"
	"testing"
)

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"version", []string{"version"}, nil, 0},
		{"--version", []string{"--version"}, nil, 0},
		{"help", []string{"--help"}, nil, 0},
		{"plan help", []string{"plan", "--help"}, nil, 0},
		{"doctor help", []string{"doctor", "--help"}, nil, 0},
		{"completion", []string{"completion", "bash"}, nil, 0},
		{"plan flag that does not parse", []string{"plan", "--safety-margin=lots"}, nil, 2},
		{"argument to the agent", []string{"--node-name=n", "extra"}, nil, 2},
		{"flag that does not parse", []string{"--poll-interval=often"}, nil, 2},
		{"unknown flag", []string{"--no-such-flag"}, nil, 2},
		{"variable that does not parse", []string{"--node-name=n"}, map[string]string{"REPRIEVE_SAFETY_MARGIN": "lots"}, 2},
		{"missing node name", nil, nil, 2},
		{"invalid taint", []string{"--node-name=n", "--interruption-taint=cloud"}, nil, 2},
		{"unknown command", []string{"drain"}, nil, 2},
		{"unreadable kubeconfig", []string{"--node-name=n", "--kubeconfig=/nonexistent"}, nil, 2},
		{"kubeconfig that does not parse", []string{"--node-name=n", "--kubeconfig=main_test.go"}, nil, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			t.Setenv("KUBECONFIG", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := run(tc.args); got != tc.want {
				t.Errorf("run(%q) = %d, want %d", tc.args, got, tc.want)
			}
		})
	}
}

func TestSetGCPercentUnlessGOGCIsSet(t *testing.T) {
	restore := debug.SetGCPercent(100)
	defer debug.SetGCPercent(restore)
	for name, tc := range map[string]struct {
		env  map[string]string
		want int
	}{
		"unset":       {nil, agentGCPercent},
		"set":         {map[string]string{"GOGC": "200"}, 100},
		"set, off":    {map[string]string{"GOGC": "off"}, 100},
		"set, empty":  {map[string]string{"GOGC": ""}, 100},
		"other names": {map[string]string{"GOMEMLIMIT": "100MiB"}, agentGCPercent},
	} {
		t.Run(name, func(t *testing.T) {
			debug.SetGCPercent(100)
			setGCPercent(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			// With $GOGC set, the runtime's own value (100 here, as this test set it) stays.
			if got := debug.SetGCPercent(100); got != tc.want {
				t.Errorf("GC percent = %d, want %d", got, tc.want)
			}
		})
	}
}
