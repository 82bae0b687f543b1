package e2e

import (
	"os"
	"testing"
)

// wantK8sVersionEnv names the Kubernetes version the version matrix (make test-versions) means
// to test, e.g. v1.30.14; unset in make test, which runs the pinned version.
const wantK8sVersionEnv = "REPRIEVE_WANT_K8S_VERSION"

// TestServerVersion checks that the API server the tests run against is the one asked for: its
// discovery /version agrees with its binary's --version and, in the version matrix, with the
// version under test. Without it a matrix run that fell back to the pinned binaries would pass
// and prove nothing about the older version.
func TestServerVersion(t *testing.T) {
	t.Parallel()
	info, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if info.GitVersion != env.Version().String() {
		t.Errorf("kube-apiserver serves version %s; its binary says %s", info.GitVersion, env.Version())
	}
	if want := os.Getenv(wantK8sVersionEnv); want != "" && info.GitVersion != want {
		t.Errorf("kube-apiserver serves version %s; %s=%s", info.GitVersion, wantK8sVersionEnv, want)
	}
	t.Logf("kube-apiserver %s", info.GitVersion)
}
