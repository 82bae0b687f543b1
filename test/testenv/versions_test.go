package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseKubeVersion(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want KubeVersion
		err  bool
	}{
		{in: "Kubernetes v1.30.14\n", want: KubeVersion{1, 30, 14}},
		{in: "Kubernetes v1.37.2", want: KubeVersion{1, 37, 2}},
		{in: "Kubernetes v1.33.13-rc.0", want: KubeVersion{1, 33, 13}},
		{in: "Kubernetes 1.30.14", err: true},
		{in: "Kubernetes v0.0.0-master+$Format:%H$", want: KubeVersion{0, 0, 0}},
		{in: "flag provided but not defined: --version", err: true},
		{in: "", err: true},
	} {
		got, err := parseKubeVersion(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseKubeVersion(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	v := KubeVersion{1, 30, 14}
	if !v.AtLeast(1, 30) || v.AtLeast(1, 31) || !v.AtLeast(0, 99) || v.AtLeast(2, 0) || v.String() != "v1.30.14" {
		t.Errorf("KubeVersion %v: AtLeast or String wrong", v)
	}
}

func TestK8sBinDirMissing(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, KubeAPIServerBin), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(K8sBinEnv, dir)
	_, err := k8sBinDir()
	if err == nil || !strings.Contains(err.Error(), KubeControllerMgrBin) || !strings.Contains(err.Error(), K8sBinEnv) {
		t.Fatalf("k8sBinDir() error = %v, want one naming %s and %s", err, KubeControllerMgrBin, K8sBinEnv)
	}
}

// TestK8sBinDirPicksTheAPIServer proves that Start runs the kube-apiserver of $REPRIEVE_K8S_BIN_DIR,
// not the tools folder's: the one there says it is v1.30.14 and then fails with its own message.
func TestK8sBinDirPicksTheAPIServer(t *testing.T) {
	requireTools(t)
	dir := t.TempDir()
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Kubernetes v1.30.14'; exit 0; fi\n" +
		"echo 'the v1.30.14 stand-in ran' >&2\nexit 1\n"
	for _, name := range []string{KubeAPIServerBin, KubeControllerMgrBin} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(K8sBinEnv, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env, err := Start(ctx, Options{LogDir: t.TempDir()})
	if err == nil {
		env.Stop()
		t.Fatal("Start succeeded with the failing stand-in kube-apiserver")
	}
	if !strings.Contains(err.Error(), "the v1.30.14 stand-in ran") {
		t.Errorf("Start's error does not come from %s's kube-apiserver: %v", K8sBinEnv, err)
	}
}
