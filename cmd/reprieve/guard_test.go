package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestGuardExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"help", []string{"eviction-guard", "--help"}, nil, 0},
		{"no key pair", []string{"eviction-guard"}, nil, 2},
		{"a key pair that does not load", []string{"eviction-guard", "--tls-cert-file=guard.go", "--tls-private-key-file=guard.go"}, nil, 2},
		{"service account without namespace", []string{"eviction-guard", "--agent-service-account=reprieve", "--tls-cert-file=a", "--tls-private-key-file=b"}, nil, 2},
		{"variable that names no pair", []string{"eviction-guard", "--tls-cert-file=a"}, map[string]string{"REPRIEVE_GUARD_TLS_PRIVATE_KEY_FILE": ""}, 2},
		{"an agent flag", []string{"eviction-guard", "--node-name=n"}, nil, 2},
		{"an argument", []string{"eviction-guard", "extra"}, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := run(tc.args); got != tc.want {
				t.Errorf("run(%q) = %d, want %d", tc.args, got, tc.want)
			}
		})
	}
}

// TestGuardHelp checks that the guard's help lists its flags, not the agent's.
func TestGuardHelp(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"eviction-guard", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, want := range []string{"reprieve eviction-guard", "--tls-cert-file", "--tls-private-key-file", "--bind-address", "--agent-service-account"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %s:\n%s", want, help)
		}
	}
	if strings.Contains(help, "--node-name") {
		t.Errorf("help lists the agent's --node-name:\n%s", help)
	}
}
