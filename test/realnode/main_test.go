// Package realnode runs reprieve on one real node: a kubelet with containerd, runc and CNI
// (test/nodeenv) registered with testenv's control plane beside its kwok nodes. What kwok
// cannot show is proven here: the chart's DaemonSet starting with its securityContext and
// reading the host, a real SIGTERM at the planned moment with the whole planned grace, the
// notice endpoint answering a pod through a hostPort, and the pressure loop against the
// kubelet's own eviction.
//
// It is a package of its own, not part of test/e2e, because the node changes the host (addresses,
// a bridge, mounts, cgroups) and its memory test needs the machine's memory to itself for a
// few seconds: the Makefile runs it after the other packages, alone. Without root, cgroups or
// the packages it needs, its one test TestRealNodeAvailable skips with the reason;
// REPRIEVE_E2E_REQUIRED=1 makes that a failure.
package realnode

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The node's name and labels: the chart's AWS nodeSelector picks spot nodes.
const nodeName = "real-node-1"

var nodeLabels = map[string]string{"karpenter.sh/capacity-type": "spot", "type": "real"}

// Images built on this machine and imported into the node's containerd.
const (
	workloadImage = "reprieve.test/workload:1"
	curlImage     = "reprieve.test/curl:1"
)

// controllers are the kube-controller-manager controllers the package runs (a test that needs
// more restarts it with these and its own, and back).
var controllers = []string{"daemonset-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller"}

var (
	env         *testenv.Env
	node        *nodeenv.Node
	reprieveBin string
	workloadBin string
	logDir      string
	// outDir is the hostPath the test pods record their moments in.
	outDir string
	// imdsPort is where the agent polls its metadata service, on the node's address; the
	// forwarder there goes to the mock of the moment (imdsTarget), so that each scenario can
	// start a fresh mock (PEERS.md: -w does not work) without a new agent.
	imdsPort   int
	imdsTarget atomic.Value // string, host:port
	// started is when TestMain began, for the run's duration.
	started time.Time
)

// skipReason says why the real node cannot run here ("" when it can).
var skipReason string

// TestRealNodeAvailable is the package's one test when the machine cannot run the node: it
// skips with the reason (REPRIEVE_E2E_REQUIRED=1 makes it a failure).
func TestRealNodeAvailable(t *testing.T) {
	if skipReason != "" {
		t.Skipf("the real-node tests need a machine that runs containers (REPRIEVE_E2E_REQUIRED=1 makes this a failure): %s", skipReason)
	}
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	started = time.Now()
	flag.Parse()
	if why := nodeenv.Check(); why != "" {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			fmt.Fprintf(os.Stderr, "realnode: %s\n", why)
			return 1
		}
		skipReason = why
		_ = flag.Set("test.run", "^TestRealNodeAvailable$")
		return m.Run()
	}
	var err error
	if logDir, err = os.MkdirTemp("", "reprieve-realnode-"); err != nil {
		fmt.Fprintf(os.Stderr, "realnode: %v\n", err)
		return 1
	}
	code := setUpAndRun(m)
	if code != 0 || os.Getenv("REPRIEVE_E2E_KEEP_LOGS") == "1" {
		fmt.Fprintf(os.Stderr, "realnode: logs kept in %s (node: %s)\n", logDir, nodeLogs())
	} else {
		_ = os.RemoveAll(logDir)
	}
	fmt.Fprintf(os.Stderr, "realnode: the whole run took %s\n", time.Since(started).Round(time.Second))
	return code
}

func nodeLogs() string {
	if node == nil {
		return "none"
	}
	return node.LogDir
}

func setUpAndRun(m *testing.M) (code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "realnode: %v\n", err)
		return 1
	}
	var err error
	if reprieveBin, err = scenario.BuildReprieve(ctx, logDir); err != nil {
		return fail(err)
	}
	workloadBin = filepath.Join(logDir, "workload")
	if err := nodeenv.GoBuild(ctx, workloadBin, "./test/realnode/workload"); err != nil {
		return fail(err)
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	if env, err = testenv.Start(ctx, testenv.Options{LogDir: filepath.Join(logDir, "control-plane"), Logf: logf}); err != nil {
		return fail(err)
	}
	defer env.Stop()
	// The DaemonSet's pods come from its controller and the scheduler; namespaces get their
	// default ServiceAccount and the kube-root-ca.crt ConfigMap that in-cluster clients read.
	// No taint-eviction controller: reprieve alone acts on the interruption taint.
	if err := env.StartControllerManager(ctx, controllers...); err != nil {
		return fail(err)
	}
	if err := env.StartScheduler(ctx); err != nil {
		return fail(err)
	}
	if imdsPort, err = testenv.FreePort(); err != nil {
		return fail(err)
	}
	begin := time.Now()
	opts := nodeenv.Options{Env: env, Name: nodeName, Labels: nodeLabels, Logf: logf}
	if os.Getenv("REPRIEVE_PRESSURE_SOAK") == "1" || os.Getenv("REPRIEVE_RECORD_SERIES") != "" {
		// An image filesystem of its own, small enough for image pulls to fill (issue 47).
		opts.ImageFsSize = soakImageFsSize
	}
	node, err = nodeenv.Start(ctx, opts)
	if err != nil {
		return fail(err)
	}
	defer func() {
		// Without its DaemonSet first, the controller puts the agent's pod back as fast as
		// Stop deletes it, and Stop waits its full minute for the node's containers to go.
		_ = env.Client.AppsV1().DaemonSets("kube-system").Delete(context.Background(), "reprieve", metav1.DeleteOptions{})
		node.Stop()
		if code == 0 && os.Getenv("REPRIEVE_E2E_KEEP_LOGS") != "1" {
			_ = os.RemoveAll(node.Dir)
		}
	}()
	fwd, err := nodeenv.Forward(net.JoinHostPort(nodeenv.NodeIP, strconv.Itoa(imdsPort)), func() string {
		s, _ := imdsTarget.Load().(string)
		return s
	})
	if err != nil {
		return fail(err)
	}
	defer fwd.Close()
	// No notice and no rebalance recommendation for a day, until a test starts a mock of its own.
	if imdsMock, err = startQuietIMDS(ctx); err != nil {
		return fail(err)
	}
	defer func() {
		imdsMu.Lock()
		defer imdsMu.Unlock()
		_ = imdsMock.Stop()
	}()
	if err := importImages(ctx); err != nil {
		return fail(err)
	}
	outDir = filepath.Join(node.Dir, "out")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fail(err)
	}
	logf("realnode: the real node and its images ready in %s", time.Since(begin).Round(time.Millisecond))
	// The memory tests' record of the memory outside the pods (quiet_test.go), from now, so
	// that the first of them has its last seconds to tell whether the machine is quiet.
	machineMemory()
	return m.Run()
}
