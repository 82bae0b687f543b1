package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is the module whose root holds .cache/bin.
const modulePath = "github.com/reprieve-dev/reprieve"

// ToolsBinEnv names the environment variable that overrides where the tools live.
const ToolsBinEnv = "REPRIEVE_TOOLS_BIN"

// Names of the programs test/tools/build.sh builds, relative to ToolsBin.
const (
	EtcdBin              = "etcd"
	KubeAPIServerBin     = "kube-apiserver"
	KubeControllerMgrBin = "kube-controller-manager"
	KubeSchedulerBin     = "kube-scheduler"
	KwokBin              = "kwok"
	IMDSMockBin          = "ec2-metadata-mock"
	KwokStagesDir        = "kwok-stages"
)

// requiredTools lists every file ToolsBin checks, relative to the tools folder: what every
// environment and the demo run (`make demo-tools` builds exactly these). kube-scheduler, which
// only some tests start, is checked when they start it (StartScheduler).
var requiredTools = []string{
	EtcdBin,
	KubeAPIServerBin,
	KubeControllerMgrBin,
	KwokBin,
	IMDSMockBin,
}

// ToolsBin returns the folder holding the built tools: $REPRIEVE_TOOLS_BIN if set, else
// <repository root>/.cache/bin, where the repository root is the nearest folder at or above
// the working directory whose go.mod declares module github.com/reprieve-dev/reprieve. It
// returns an error naming the first missing program (or stage file) when the folder is
// incomplete.
func ToolsBin() (string, error) {
	dir := os.Getenv(ToolsBinEnv)
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", fmt.Errorf("finding the tools folder: %w (or set %s)", err, ToolsBinEnv)
		}
		dir = filepath.Join(root, ".cache", "bin")
	}
	for _, name := range requiredTools {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is missing from %s: run `make tools` (test/tools/build.sh)", name, dir)
		}
	}
	for _, f := range kwokStockStages {
		if _, err := os.Stat(filepath.Join(dir, KwokStagesDir, f)); err != nil {
			return "", fmt.Errorf("kwok stage %s is missing from %s: run `make tools` (test/tools/build.sh)",
				f, filepath.Join(dir, KwokStagesDir))
		}
	}
	return dir, nil
}

// RepoRoot returns the nearest folder at or above the working directory whose go.mod
// declares module github.com/reprieve-dev/reprieve.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("getting the working directory: %w", err)
	}
	for {
		mod, err := moduleOf(filepath.Join(dir, "go.mod"))
		if err == nil && mod == modulePath {
			return dir, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("reading %s: %w", filepath.Join(dir, "go.mod"), err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s at or above the working directory", modulePath)
		}
		dir = parent
	}
}

// moduleOf returns the module path that the go.mod file at path declares.
func moduleOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "module"); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", sc.Err()
}

// K8sBinEnv names the environment variable that points at a folder holding kube-apiserver,
// kube-controller-manager and kube-scheduler of another Kubernetes version
// (test/tools/build-versions.sh builds them into <tools folder>/k8s-vX.Y.Z): the version matrix
// (make test-versions) runs the same tests against each. etcd, kwok and the peers still come
// from ToolsBin. Without a kube-scheduler in the folder, StartScheduler fails rather than run a
// newer scheduler than the API server, a skew upstream does not support.
const K8sBinEnv = "REPRIEVE_K8S_BIN_DIR"

// k8sBinDir returns $REPRIEVE_K8S_BIN_DIR ("" when unset) after checking that it holds an
// executable kube-apiserver and kube-controller-manager.
func k8sBinDir() (string, error) {
	dir := os.Getenv(K8sBinEnv)
	if dir == "" {
		return "", nil
	}
	for _, name := range []string{KubeAPIServerBin, KubeControllerMgrBin} {
		if !executable(filepath.Join(dir, name)) {
			return "", fmt.Errorf("%s is missing from %s=%s: run `make test-versions` (test/tools/build-versions.sh)", name, K8sBinEnv, dir)
		}
	}
	return dir, nil
}

// executable reports whether path is an executable regular file.
func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// KubeVersion is a Kubernetes release as a program reports it with --version.
type KubeVersion struct {
	Major, Minor, Patch int
}

// String returns the version as vMAJOR.MINOR.PATCH.
func (v KubeVersion) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or later.
func (v KubeVersion) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// parseKubeVersion reads the output of `kube-apiserver --version` ("Kubernetes v1.30.14").
func parseKubeVersion(out string) (KubeVersion, error) {
	s := strings.TrimSpace(out)
	s = strings.TrimPrefix(s, "Kubernetes ")
	var v KubeVersion
	core, _, _ := strings.Cut(strings.TrimPrefix(s, "v"), "-")
	if n, err := fmt.Sscanf(core, "%d.%d.%d", &v.Major, &v.Minor, &v.Patch); err != nil || n != 3 || !strings.HasPrefix(s, "v") {
		return KubeVersion{}, fmt.Errorf("reading the version from %q: want \"Kubernetes vX.Y.Z\"", strings.TrimSpace(out))
	}
	return v, nil
}
