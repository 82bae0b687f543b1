// Package testenv runs a real Kubernetes control plane on loopback for end-to-end tests,
// demos and benchmarks: etcd, kube-apiserver, kwok (fake kubelets) and, on request,
// kube-controller-manager, all built by test/tools/build.sh. It also starts helper programs
// such as amazon-ec2-metadata-mock.
//
// A control plane costs a few seconds and about 300 MB, so start one per test package (for
// example in TestMain) and give each test its own namespace and node names.
package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultControllers are the kube-controller-manager controllers started when Options or
// StartControllerManager name none: taint-based eviction (which in v1.37 does nothing
// unless the node-lifecycle controller runs too, as that one registers the pod index it
// needs), node lifecycle (not-ready taints) and the disruption controller that computes PDB
// status. kube-controller-manager also accepts the old short names (nodelifecycle,
// disruption).
var DefaultControllers = []string{"taint-eviction-controller", "node-lifecycle-controller", "disruption-controller"}

// controllerAliases maps kube-controller-manager's old short controller names to the
// current ones.
var controllerAliases = map[string]string{
	"nodelifecycle":        "node-lifecycle-controller",
	"disruption":           "disruption-controller",
	"serviceaccount":       "serviceaccount-controller",
	"serviceaccount-token": "serviceaccount-token-controller",
	"podgc":                "pod-garbage-collector-controller",
	"garbagecollector":     "garbage-collector-controller",
	"namespace":            "namespace-controller",
	"replicaset":           "replicaset-controller",
	"deployment":           "deployment-controller",
	"daemonset":            "daemonset-controller",
	"statefulset":          "statefulset-controller",
	"job":                  "job-controller",
}

// canonicalController returns the current name of a kube-controller-manager controller.
func canonicalController(name string) string {
	if c, ok := controllerAliases[name]; ok {
		return c
	}
	return name
}

// Admin identity written to the static token file.
const (
	adminUser  = "testenv-admin"
	adminGroup = "system:masters"
)

// kcmUser is kube-controller-manager's own user name, which the default FlowSchema
// kube-controller-manager matches.
const kcmUser = "system:kube-controller-manager"

// kwokUser and kwokGroup are the identity kwok takes after RestartKwok(ctx, true): in the
// group system:nodes, so that APF classifies its requests as a cluster classifies the
// kubelets' (the system-nodes FlowSchema, node-high), not as the exempt system:masters.
const (
	kwokUser  = "testenv-kwok"
	kwokGroup = "system:nodes"
)

// Readiness deadlines for each program.
const (
	etcdReadyTimeout      = 30 * time.Second
	apiserverReadyTimeout = 60 * time.Second
	kwokReadyTimeout      = 30 * time.Second
	kcmReadyTimeout       = 60 * time.Second
)

// Options configure Start.
type Options struct {
	// ControllerManager also starts kube-controller-manager with Controllers.
	ControllerManager bool
	// Controllers lists the kube-controller-manager controllers to run; DefaultControllers
	// when empty.
	Controllers []string
	// FastPods makes kwok turn pods Running and Ready as soon as it sees them (its
	// pod/fast stages) instead of going through Pending with kwok's general stages, which
	// take 2-12 s per pod. Deletion works the same either way (see PodDeleteStage).
	FastPods bool
	// LogDir receives one log file per program. When empty a new temporary folder is made.
	// Logs are kept after Stop for debugging; errors from Start name the folder.
	LogDir string
	// Logf, when set, receives progress messages (for example t.Logf).
	Logf func(format string, args ...any)
	// APF, when set, runs kube-apiserver with API Priority and Fairness on and these seats;
	// nil keeps it off (--enable-priority-and-fairness=false), as every test but the pool
	// scenario wants.
	APF *APF
}

// APF is kube-apiserver's API Priority and Fairness with a number of seats: APF shares
// --max-requests-inflight + --max-mutating-requests-inflight among its priority levels by their
// nominalConcurrencyShares (the defaults are 400 and 200).
type APF struct {
	MaxRequestsInflight, MaxMutatingRequestsInflight int
}

// Seats is the total APF shares among the priority levels.
func (a APF) Seats() int { return a.MaxRequestsInflight + a.MaxMutatingRequestsInflight }

// flags are kube-apiserver's flags for a (nil: APF off).
func (a *APF) flags() []string {
	if a == nil {
		return []string{"--enable-priority-and-fairness=false"}
	}
	return []string{"--enable-priority-and-fairness=true",
		"--max-requests-inflight=" + strconv.Itoa(a.MaxRequestsInflight),
		"--max-mutating-requests-inflight=" + strconv.Itoa(a.MaxMutatingRequestsInflight)}
}

// Env is a running control plane. Its exported fields are read-only.
type Env struct {
	// Kubeconfig is the path of an admin kubeconfig file (bearer token, serving CA).
	Kubeconfig string
	// Config is the admin REST config (QPS 1000, Burst 2000). Copy it with rest.CopyConfig
	// before changing it.
	Config *rest.Config
	// Client is an admin clientset built from Config.
	Client kubernetes.Interface
	// LogDir holds one log file per program.
	LogDir string
	// Host is the API server's URL, https://127.0.0.1:<port>.
	Host string
	// Token is the admin bearer token (user testenv-admin, group system:masters).
	Token string
	// CAData is the PEM CA that signed the API server's serving certificate.
	CAData []byte
	// EtcdURL is etcd's client URL, http://127.0.0.1:<port>.
	EtcdURL string

	toolsBin string
	// k8sBin holds kube-apiserver, kube-controller-manager and kube-scheduler: toolsBin, or
	// $REPRIEVE_K8S_BIN_DIR for another Kubernetes version (K8sBinEnv).
	k8sBin  string
	version KubeVersion // kube-apiserver's, from --version
	dataDir string      // removed by Stop
	pki     *pkiFiles
	logf    func(format string, args ...any)

	kcmMu          sync.Mutex // serialises StartControllerManager and StopControllerManager
	mu             sync.Mutex // guards the fields below
	stopped        bool
	etcd           *Process
	apiserver      *Process
	apiserverArgs  []string
	apf            *APF
	tokenFile      string
	kcmToken       string
	kwokToken      string
	peers          []*APIServer // further API servers on the same etcd (StartAPIServer, StartPeerAPIServer)
	kwok           *Process
	fastPods       bool // kwok's stages, for RestartKwok
	kcm            *Process
	scheduler      *Process
	kcmControllers []string
}

// Start starts etcd, kube-apiserver, kwok and, when opts.ControllerManager is set,
// kube-controller-manager, waiting until each is ready. On failure it stops whatever it
// started and returns an error that carries the tail of the failing program's log and the
// log folder. Call Stop when done.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	begin := time.Now()
	bin, err := ToolsBin()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	k8sBin, err := k8sBinDir()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	if k8sBin == "" {
		k8sBin = bin
	}
	e := &Env{toolsBin: bin, k8sBin: k8sBin, logf: opts.Logf, LogDir: opts.LogDir, apf: opts.APF}
	if e.logf == nil {
		e.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			e.Stop()
			err = fmt.Errorf("starting the control plane: %w (logs in %s)", err, e.LogDir)
		}
	}()
	if e.LogDir == "" {
		if e.LogDir, err = os.MkdirTemp("", "reprieve-testenv-logs-"); err != nil {
			return nil, fmt.Errorf("creating the log folder: %w", err)
		}
	} else if err := os.MkdirAll(e.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the log folder: %w", err)
	}
	if e.dataDir, err = os.MkdirTemp("", "reprieve-testenv-data-"); err != nil {
		return nil, fmt.Errorf("creating the data folder: %w", err)
	}
	if e.pki, err = writePKI(e.dataDir); err != nil {
		return nil, fmt.Errorf("writing certificates and keys: %w", err)
	}
	e.CAData = e.pki.caPEM

	if err := e.startEtcd(ctx); err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	if err := e.startAPIServer(ctx); err != nil {
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	e.fastPods = opts.FastPods
	if err := e.startKwok(ctx, opts.FastPods, e.Kubeconfig); err != nil {
		return nil, fmt.Errorf("starting kwok: %w", err)
	}
	if opts.ControllerManager {
		if err := e.StartControllerManager(ctx, opts.Controllers...); err != nil {
			return nil, err
		}
	}
	e.logf("testenv: control plane at %s ready in %s (logs in %s)", e.Host, time.Since(begin).Round(time.Millisecond), e.LogDir)
	return e, nil
}

// Stop stops every program the Env started (SIGTERM, then SIGKILL after 5 s) and removes
// its data folder; the logs stay. It is safe to call more than once and on a nil Env.
func (e *Env) Stop() {
	if e == nil {
		return
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.stopped = true
	kcm, sched, kwok, apiserver, etcd := e.kcm, e.scheduler, e.kwok, e.apiserver, e.etcd
	e.kcm, e.scheduler = nil, nil
	peers := e.peers
	e.mu.Unlock()

	// The clients of the API server go first, in parallel, then the API servers, then etcd.
	var wg sync.WaitGroup
	procs := []*Process{kcm, sched, kwok}
	for _, a := range peers {
		procs = append(procs, a.Process())
	}
	for _, p := range procs {
		if p != nil {
			wg.Go(func() { e.stopProcess(p) })
		}
	}
	wg.Wait()
	for _, p := range []*Process{apiserver, etcd} {
		if p != nil {
			e.stopProcess(p)
		}
	}
	if e.dataDir != "" {
		if err := os.RemoveAll(e.dataDir); err != nil {
			e.logf("testenv: removing %s: %v", e.dataDir, err)
		}
	}
}

// runAPIServer starts kube-apiserver with the flags startAPIServer chose and waits until it is
// ready.
func (e *Env) runAPIServer(ctx context.Context) error {
	begin := time.Now()
	p, err := StartProcess(ctx, "kube-apiserver", filepath.Join(e.LogDir, "kube-apiserver.log"),
		filepath.Join(e.k8sBin, KubeAPIServerBin), e.apiserverArgs, nil)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.apiserver = p
	e.mu.Unlock()
	client := e.httpClient()
	if err := waitReady(ctx, p, apiserverReadyTimeout, func(ctx context.Context) error {
		return httpOK(ctx, client, e.Host+"/readyz", e.Token)
	}); err != nil {
		return err
	}
	e.logf("testenv: kube-apiserver ready at %s in %s", e.Host, time.Since(begin).Round(time.Millisecond))
	return nil
}

// StopAPIServer stops kube-apiserver; etcd, kwok and kube-controller-manager keep running.
// RestartAPIServerWith brings it back. (An outage that only the agent should see is a
// StartPeerAPIServer's Stop and Restart.)
func (e *Env) StopAPIServer() error {
	e.mu.Lock()
	p := e.apiserver
	e.mu.Unlock()
	if p == nil {
		return errors.New("stopping kube-apiserver: not running")
	}
	if err := p.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	return nil
}

func (e *Env) stopProcess(p *Process) {
	if err := p.Stop(); err != nil {
		e.logf("testenv: %v", err)
	}
}

// StartControllerManager starts kube-controller-manager with the given controllers
// (DefaultControllers when none) and waits until it answers /healthz. It fails when one is
// already running.
func (e *Env) StartControllerManager(ctx context.Context, controllers ...string) error {
	if len(controllers) == 0 {
		controllers = DefaultControllers
	}
	e.kcmMu.Lock()
	defer e.kcmMu.Unlock()
	e.mu.Lock()
	stopped, running := e.stopped, e.kcm != nil && !e.kcm.Exited()
	e.mu.Unlock()
	if stopped {
		return errors.New("starting kube-controller-manager: the environment is stopped")
	}
	if running {
		return errors.New("starting kube-controller-manager: already running")
	}
	ports, err := freePorts(1)
	if err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	begin := time.Now()
	kubeconfig := e.Kubeconfig
	e.mu.Lock()
	asItself := e.apf != nil
	e.mu.Unlock()
	if asItself {
		// With APF on it runs as itself, as in a cluster: the admin is exempt from APF.
		if kubeconfig, err = e.controllerManagerKubeconfig(ctx); err != nil {
			return fmt.Errorf("starting kube-controller-manager: %w", err)
		}
	}
	p, err := e.startComponent(ctx, "kube-controller-manager", KubeControllerMgrBin, ports[0],
		"--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--service-account-private-key-file="+e.pki.saKey,
		"--root-ca-file="+e.pki.caCert,
		"--use-service-account-credentials=false")
	if err != nil {
		return err
	}
	e.mu.Lock()
	stopped = e.stopped
	if !stopped {
		e.kcm = p
		e.kcmControllers = slices.Clone(controllers)
	}
	e.mu.Unlock()
	if stopped {
		_ = p.Stop()
		return errors.New("starting kube-controller-manager: the environment was stopped meanwhile")
	}
	e.logf("testenv: kube-controller-manager (%s) ready in %s", strings.Join(controllers, ","), time.Since(begin).Round(time.Millisecond))
	return nil
}

// startComponent starts a control-plane component (kube-controller-manager, kube-scheduler)
// against the API server, serving on port with the environment's certificate, and waits until it
// answers /healthz. extra are its own flags.
func (e *Env) startComponent(ctx context.Context, name, bin string, port int, extra ...string) (*Process, error) {
	args := append([]string{
		"--kubeconfig=" + e.Kubeconfig, // a later --kubeconfig in extra wins
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + e.pki.servingCert,
		"--tls-private-key-file=" + e.pki.servingKey,
		"--v=2",
	}, extra...)
	path := filepath.Join(e.k8sBin, bin)
	if !executable(path) {
		// A tools folder built for the demo alone (make demo-tools) has no kube-scheduler; with
		// K8sBinEnv, one of ToolsBin's newer version would be a skew upstream does not support.
		return nil, fmt.Errorf("starting %s: %s is missing from %s: run `make tools` (test/tools/build.sh)", name, bin, e.k8sBin)
	}
	p, err := StartProcess(ctx, name, filepath.Join(e.LogDir, name+".log"), path, args, nil)
	if err != nil {
		return nil, err
	}
	client := e.httpClient()
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	if err := waitReady(ctx, p, kcmReadyTimeout, func(ctx context.Context) error {
		return httpOK(ctx, client, url, "")
	}); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

// StartScheduler starts kube-scheduler and waits until it answers /healthz. Tests that need
// pods placed by a controller (a DaemonSet's, since the DaemonSet controller leaves binding to
// the scheduler) start it; kwok nodes are schedulable like any other. Stop it with
// StopScheduler.
func (e *Env) StartScheduler(ctx context.Context) error {
	e.mu.Lock()
	stopped, running := e.stopped, e.scheduler != nil && !e.scheduler.Exited()
	e.mu.Unlock()
	if stopped || running {
		return errors.New("starting kube-scheduler: the environment is stopped, or it already runs")
	}
	ports, err := freePorts(1)
	if err != nil {
		return fmt.Errorf("starting kube-scheduler: %w", err)
	}
	begin := time.Now()
	p, err := e.startComponent(ctx, "kube-scheduler", KubeSchedulerBin, ports[0],
		"--authentication-kubeconfig="+e.Kubeconfig,
		"--authorization-kubeconfig="+e.Kubeconfig)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.scheduler = p
	e.mu.Unlock()
	e.logf("testenv: kube-scheduler ready in %s", time.Since(begin).Round(time.Millisecond))
	return nil
}

// StopScheduler stops kube-scheduler if it runs.
func (e *Env) StopScheduler() { e.stopSlot(&e.scheduler) }

// stopSlot stops the process that *slot (a field of e, guarded by mu) holds, if any, and
// empties the slot.
func (e *Env) stopSlot(slot **Process) {
	e.mu.Lock()
	p := *slot
	*slot = nil
	e.mu.Unlock()
	if p != nil {
		e.stopProcess(p)
	}
}

// StopControllerManager stops kube-controller-manager if it runs.
func (e *Env) StopControllerManager() {
	e.kcmMu.Lock()
	defer e.kcmMu.Unlock()
	e.mu.Lock()
	p := e.kcm
	e.kcm = nil
	e.kcmControllers = nil
	e.mu.Unlock()
	if p != nil {
		e.stopProcess(p)
	}
}

// ControllerManagerRunning reports whether kube-controller-manager runs with the named
// controller (current or old short name; any controller when name is empty). "*" in the
// controller list counts as every controller not disabled with "-name".
func (e *Env) ControllerManagerRunning(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kcm == nil || e.kcm.Exited() {
		return false
	}
	if name == "" {
		return true
	}
	name = canonicalController(name)
	enabled := false
	for _, c := range e.kcmControllers {
		switch {
		case c == "*":
			enabled = true
		case strings.HasPrefix(c, "-") && canonicalController(c[1:]) == name:
			return false
		case canonicalController(c) == name:
			enabled = true
		}
	}
	return enabled
}

// Processes returns the control-plane programs that run now, for example to check their
// logs.
func (e *Env) Processes() []*Process {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ps []*Process
	for _, p := range []*Process{e.etcd, e.apiserver, e.kwok, e.kcm, e.scheduler} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

func (e *Env) startEtcd(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name=default",
		"--data-dir=" + filepath.Join(e.dataDir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync",
		"--quota-backend-bytes=" + strconv.Itoa(4<<30),
		"--log-level=warn",
	}
	begin := time.Now()
	p, err := StartProcess(ctx, "etcd", filepath.Join(e.LogDir, "etcd.log"), filepath.Join(e.toolsBin, EtcdBin), args, nil)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.etcd = p
	e.mu.Unlock()
	e.EtcdURL = client
	httpc := &http.Client{Timeout: 2 * time.Second}
	if err := waitReady(ctx, p, etcdReadyTimeout, func(ctx context.Context) error {
		body, err := httpGet(ctx, httpc, client+"/health", "")
		if err != nil {
			return err
		}
		if !strings.Contains(body, `"health":"true"`) {
			return fmt.Errorf("unhealthy: %s", body)
		}
		return nil
	}); err != nil {
		return err
	}
	e.logf("testenv: etcd ready at %s in %s", client, time.Since(begin).Round(time.Millisecond))
	return nil
}

func (e *Env) startAPIServer(ctx context.Context) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	if e.Token, err = randomToken(); err != nil {
		return err
	}
	tokenFile := filepath.Join(e.dataDir, "tokens.csv")
	if e.kcmToken, err = randomToken(); err != nil {
		return err
	}
	if e.kwokToken, err = randomToken(); err != nil {
		return err
	}
	// kube-controller-manager's own identity (no group): under APF it is classified as a
	// cluster classifies it (the kube-controller-manager FlowSchema, workload-high), not as
	// the exempt system:masters.
	if err := os.WriteFile(tokenFile, fmt.Appendf(nil, "%s,%s,%s,%s\n%s,%s,%s\n%s,%s,%s,%s\n", e.Token, adminUser, adminUser, adminGroup,
		e.kcmToken, kcmUser, kcmUser, e.kwokToken, kwokUser, kwokUser, kwokGroup), 0o600); err != nil {
		return fmt.Errorf("writing the token file: %w", err)
	}
	e.tokenFile = tokenFile
	// Its flags depend on its version (apiserverFlags).
	if e.version, err = programVersion(ctx, filepath.Join(e.k8sBin, KubeAPIServerBin)); err != nil {
		return err
	}
	e.Host = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	if err := e.writeAuditPolicy(); err != nil {
		return err
	}
	e.apiserverArgs = e.apiserverFlags("kube-apiserver", ports[0], "apiserver-certs", e.apf)
	if err := e.runAPIServer(ctx); err != nil {
		return err
	}

	e.Config = &rest.Config{
		Host:            e.Host,
		BearerToken:     e.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.CAData},
		// Client is shared by every test of a package, and tests that run in parallel each
		// poll at up to 50 requests/s while they wait: client-go's token bucket must not
		// delay those polls, or its wait reads as a late reaction in their timing assertions.
		// The admin (system:masters) is exempt from the API server's own flow control.
		QPS:   1000,
		Burst: 2000,
	}
	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		return fmt.Errorf("creating the admin client: %w", err)
	}
	e.Kubeconfig = filepath.Join(e.dataDir, "admin.kubeconfig")
	if err := writeKubeconfig(e.Kubeconfig, e.Host, e.CAData, adminUser, e.Token); err != nil {
		return err
	}
	return nil
}

// apiserverFlags are kube-apiserver's flags for the server name (its process and log name) on
// port, with its generated certificates in certDir under the data folder, its audit log
// (audit.go), and APF as apf says.
func (e *Env) apiserverFlags(name string, port int, certDir string, apf *APF) []string {
	args := []string{
		"--etcd-servers=" + e.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(e.dataDir, certDir),
		"--tls-cert-file=" + e.pki.servingCert,
		"--tls-private-key-file=" + e.pki.servingKey,
		"--client-ca-file=" + e.pki.caCert,
		"--token-auth-file=" + e.tokenFile,
		"--authorization-mode=RBAC,Node",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + e.pki.saKey,
		"--service-account-signing-key-file=" + e.pki.saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
	}
	args = append(args, e.auditFlags(e.auditLog(name))...)
	return append(args, apf.flags()...)
}

// controllerManagerKubeconfig writes a kubeconfig for kube-controller-manager's own user and
// binds that user to cluster-admin (its controllers all run on this one identity:
// --use-service-account-credentials=false).
func (e *Env) controllerManagerKubeconfig(ctx context.Context) (string, error) {
	return e.adminKubeconfigFor(ctx, "kube-controller-manager", kcmUser, e.kcmToken)
}

// adminKubeconfigFor binds user to cluster-admin (RBAC: what it may do) and writes a
// kubeconfig for it with token into the data folder as <name>.kubeconfig. Its groups, which
// APF classifies by, are the token file's.
func (e *Env) adminKubeconfigFor(ctx context.Context, name, user, token string) (string, error) {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testenv-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := e.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("binding %s to cluster-admin: %w", user, err)
	}
	path := filepath.Join(e.dataDir, name+".kubeconfig")
	if err := writeKubeconfig(path, e.Host, e.CAData, user, token); err != nil {
		return "", err
	}
	return path, nil
}

// APIServer is a further kube-apiserver on the Env's etcd (StartAPIServer, StartPeerAPIServer):
// a peer of the first, serving the same objects to the same credentials (the Env's admin and
// service-account tokens work on it unchanged; a ServiceAccount kubeconfig of the Env once its
// server is changed to Host), with flags of its own. The Env's Stop stops it with the rest.
type APIServer struct {
	// Host is its URL, https://127.0.0.1:<port>.
	Host string
	// Config is the admin REST config for it (QPS 200, Burst 400).
	Config *rest.Config
	// Client is an admin clientset for it.
	Client kubernetes.Interface

	env     *Env
	name    string
	args    []string
	mu      sync.Mutex
	process *Process
}

// StartAPIServer starts one more kube-apiserver on the Env's etcd, named kube-apiserver-name,
// with APF as apf says: a test can measure API Priority and Fairness without changing the
// server every other test shares. It writes no audit log: a flood's tens of thousands of
// requests would each cost it a line to write while it is measured (one run wrote 21 MB).
func (e *Env) StartAPIServer(ctx context.Context, name string, apf *APF) (*APIServer, error) {
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver %s: %w", name, err)
	}
	e.mu.Lock()
	args := slices.DeleteFunc(e.apiserverFlags("kube-apiserver-"+name, port, "apiserver-certs-"+name, apf),
		func(a string) bool { return strings.HasPrefix(a, "--audit-") })
	e.mu.Unlock()
	return e.startPeer(ctx, "kube-apiserver-"+name, port, args)
}

// StartPeerAPIServer starts an APIServer named name (its log is <name>.log in LogDir) with the
// Env's flags and extra after them (a later flag wins: --feature-gates=Gate=true), and waits
// until it is ready.
func (e *Env) StartPeerAPIServer(ctx context.Context, name string, extra ...string) (*APIServer, error) {
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	var args []string
	for _, a := range e.apiserverArgs {
		switch {
		case strings.HasPrefix(a, "--secure-port="):
			a = "--secure-port=" + strconv.Itoa(port)
		case strings.HasPrefix(a, "--cert-dir="):
			a = "--cert-dir=" + filepath.Join(e.dataDir, name+"-certs")
		case strings.HasPrefix(a, "--audit-log-path="):
			a = "--audit-log-path=" + e.auditLog(name)
		}
		args = append(args, a)
	}
	return e.startPeer(ctx, name, port, append(args, extra...))
}

// startPeer starts the APIServer name on port with args and waits until it is ready.
func (e *Env) startPeer(ctx context.Context, name string, port int, args []string) (*APIServer, error) {
	host := fmt.Sprintf("https://127.0.0.1:%d", port)
	cfg := rest.CopyConfig(e.Config)
	cfg.Host = host
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the admin client of %s: %w", name, err)
	}
	a := &APIServer{Host: host, Config: cfg, Client: cs, env: e, name: name, args: args}
	e.mu.Lock()
	e.peers = append(e.peers, a)
	e.mu.Unlock()
	if err := a.run(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// run starts the server's process and waits until it answers /readyz.
func (a *APIServer) run(ctx context.Context) error {
	e := a.env
	begin := time.Now()
	p, err := StartProcess(ctx, a.name, filepath.Join(e.LogDir, a.name+".log"), filepath.Join(e.k8sBin, KubeAPIServerBin), a.args, nil)
	if err != nil {
		return fmt.Errorf("starting %s: %w", a.name, err)
	}
	a.mu.Lock()
	a.process = p
	a.mu.Unlock()
	client := e.httpClient()
	if err := waitReady(ctx, p, apiserverReadyTimeout, func(ctx context.Context) error {
		return httpOK(ctx, client, a.Host+"/readyz", e.Token)
	}); err != nil {
		_ = p.Stop()
		return fmt.Errorf("starting %s: %w", a.name, err)
	}
	e.logf("testenv: %s ready at %s in %s", a.name, a.Host, time.Since(begin).Round(time.Millisecond))
	return nil
}

// Process is the server's current process (for its log).
func (a *APIServer) Process() *Process {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.process
}

// Stop stops the server (SIGTERM, then SIGKILL after 5 s); a no-op once it is stopped.
func (a *APIServer) Stop() error {
	if p := a.Process(); p != nil {
		return p.Stop()
	}
	return nil
}

// Restart starts the stopped server again on the same address, flags and certificates, as a
// kube-apiserver back from an outage (etcd kept every object; its watch cache starts anew), and
// waits until it is ready.
func (a *APIServer) Restart(ctx context.Context) error {
	if p := a.Process(); p != nil && !p.Exited() {
		return fmt.Errorf("restarting %s: it is still running", a.name)
	}
	return a.run(ctx)
}

// RestartAPIServerWith stops kube-apiserver and starts it again on the same address and
// credentials with APF as apf says (nil: off), for a benchmark that measures several seat
// counts on one control plane. Clients reconnect.
func (e *Env) RestartAPIServerWith(ctx context.Context, apf *APF) error {
	if e.apiserverArgs == nil {
		return errors.New("restarting kube-apiserver: it was never started")
	}
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	e.mu.Lock()
	e.apf = apf
	port, err := strconv.Atoi(e.Host[strings.LastIndex(e.Host, ":")+1:])
	if err == nil {
		e.apiserverArgs = e.apiserverFlags("kube-apiserver", port, "apiserver-certs", apf)
	}
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("restarting kube-apiserver: reading the port of %s: %w", e.Host, err)
	}
	if err := e.runAPIServer(ctx); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	return nil
}

// Version is kube-apiserver's version (as its --version says), for a test whose expectation
// depends on the Kubernetes version under test (K8sBinEnv).
func (e *Env) Version() KubeVersion { return e.version }

// programVersion runs bin --version and reads the Kubernetes version it prints.
func programVersion(ctx context.Context, bin string) (KubeVersion, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return KubeVersion{}, fmt.Errorf("running %s --version: %w: %s", bin, err, strings.TrimSpace(string(out)))
	}
	return parseKubeVersion(string(out))
}

// WriteKubeconfig writes a kubeconfig file at path for this API server that authenticates
// with the bearer token. user names the credentials entry.
func (e *Env) WriteKubeconfig(path, user, token string) error {
	return writeKubeconfig(path, e.Host, e.CAData, user, token)
}

func writeKubeconfig(path, host string, caData []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: caData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// httpClient returns an HTTP client that trusts the environment's CA.
func (e *Env) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.CAData)
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

// waitReady polls check every 100 ms until it succeeds, p exits, timeout passes or ctx ends.
// Errors carry the tail of p's log.
func waitReady(ctx context.Context, p *Process, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if p.Exited() {
			return p.failure(fmt.Errorf("%s exited before it was ready", p.Name()))
		}
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-p.Done():
		case <-ctx.Done():
			return p.failure(fmt.Errorf("waiting for %s to be ready: %w (last check: %v)", p.Name(), ctx.Err(), last))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// httpGet returns the body of a GET that answered 200, with an optional bearer token.
func httpGet(ctx context.Context, c *http.Client, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

func httpOK(ctx context.Context, c *http.Client, url, token string) error {
	_, err := httpGet(ctx, c, url, token)
	return err
}
