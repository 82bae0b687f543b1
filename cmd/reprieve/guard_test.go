package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/reprieve-dev/reprieve/agent/guard"
)

// writeServingPair writes a self-signed certificate and its key that load, so that the checks
// after them run.
func writeServingPair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "guard"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestGuardExitCodes(t *testing.T) {
	pairCert, pairKey := writeServingPair(t)
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
		{"allowed names without a client CA", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--client-allowed-names=kube-apiserver"}, nil, 2},
		{"no pod reads", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--source-pod-reads-per-second=0"}, nil, 2},
		{"no reviews in flight", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--source-reviews-in-flight=0"}, nil, 2},
		{"fewer reviews in all than from one source", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--source-reviews-in-flight=300", "--reviews-in-flight=200"}, nil, 2},
		{"fewer connections in all than from one source", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--source-connections=300", "--connections=200"}, nil, 2},
		{"no connections", []string{"eviction-guard", "--tls-cert-file=a", "--tls-private-key-file=b", "--source-connections=0"}, nil, 2},
		{"a client CA file that does not load", []string{"eviction-guard", "--tls-cert-file=" + pairCert, "--tls-private-key-file=" + pairKey, "--client-ca-file=guard.go"}, nil, 2},
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
	for _, want := range []string{"reprieve eviction-guard", "--tls-cert-file", "--tls-private-key-file", "--bind-address", "--agent-service-account",
		"--client-ca-file", "--client-allowed-names", "--source-reviews-in-flight", "--reviews-in-flight", "--source-pod-reads-per-second",
		"--source-connections", "--connections"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %s:\n%s", want, help)
		}
	}
	if strings.Contains(help, "--node-name") {
		t.Errorf("help lists the agent's --node-name:\n%s", help)
	}
}

// TestGuardTLSFlags: the guard serves from files or keeps its own certificate, and says which
// flags are missing or do not go together.
func TestGuardTLSFlags(t *testing.T) {
	for _, c := range []struct {
		cfg  guardConfig
		want string // "" for valid
	}{
		{guardConfig{TLSCertFile: "c", TLSKeyFile: "k"}, ""},
		{guardConfig{TLSSecret: "kube-system/g-tls", TLSWebhookConfiguration: "g", TLSHosts: []string{"g.kube-system.svc"}, TLSSyncInterval: time.Minute}, ""},
		{guardConfig{}, "--tls-cert-file and --tls-private-key-file are required"},
		{guardConfig{TLSCertFile: "c", TLSKeyFile: "k", TLSSecret: "kube-system/g-tls"}, "not both"},
		{guardConfig{TLSSecret: "g-tls", TLSWebhookConfiguration: "g", TLSHosts: []string{"h"}, TLSSyncInterval: time.Minute}, `--tls-secret "g-tls" (NAMESPACE/NAME)`},
		{guardConfig{TLSSecret: "kube-system/g-tls", TLSHosts: []string{"h"}, TLSSyncInterval: time.Minute}, "all three are needed"},
		{guardConfig{TLSSecret: "kube-system/g-tls", TLSWebhookConfiguration: "g", TLSSyncInterval: time.Minute}, "all three are needed"},
		{guardConfig{TLSSecret: "kube-system/g-tls", TLSWebhookConfiguration: "g", TLSHosts: []string{"h"}}, "--tls-sync-interval 0s: want at least 1s"},
	} {
		err := c.cfg.checkTLS()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v; want %q", c.cfg, err, c.want)
		}
	}
}

// TestGuardLimitFlags: each limit flag (the chart's evictionGuard.limits) sets its limit, and the
// read burst is twice the rate.
func TestGuardLimitFlags(t *testing.T) {
	var cfg guardConfig
	fs := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	cfg.addFlags(fs)
	if err := fs.Parse([]string{"--source-reviews-in-flight=600", "--reviews-in-flight=1200", "--source-pod-reads-per-second=20",
		"--source-connections=700", "--connections=1400"}); err != nil {
		t.Fatal(err)
	}
	l, err := cfg.limits()
	if err != nil {
		t.Fatal(err)
	}
	want := guard.DefaultLimits()
	want.InFlightPerSource, want.InFlight, want.PodReadsPerSecond, want.PodReadBurst, want.ConnsPerSource, want.Conns = 600, 1200, 20, 40, 700, 1400
	if l != want {
		t.Errorf("limits %+v; want %+v", l, want)
	}
}
