package scenario

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// ReleaseBuild is how the Makefile's build target and the Dockerfile build the binary: static,
// trimmed, with the version baked in (ReleaseVersion here).
var ReleaseBuild = []string{"CGO_ENABLED=0", "-trimpath", "-s -w -X main.version="}

// ReleaseVersion is the version BuildReprieve bakes in.
const ReleaseVersion = "v0.0.0-e2e"

// BinEnv names the environment variable through which the Makefile hands the tests a reprieve
// binary it has built already (`make e2e-bin`, the same ReleaseBuild with ReleaseVersion), so
// that no test compiles anything under its own deadline.
const BinEnv = "REPRIEVE_BIN"

// BuildReprieve returns the reprieve binary the tests run: the one named by $REPRIEVE_BIN when
// set, else one it builds into dir as a release is built (ReleaseBuild), so that the tests run
// what ships. A cold build takes minutes on two cores: pass a ctx without a deadline, and start
// the clock of whatever is timed only after this returns.
func BuildReprieve(ctx context.Context, dir string) (string, error) {
	if bin := os.Getenv(BinEnv); bin != "" {
		st, err := os.Stat(bin)
		if err != nil {
			return "", fmt.Errorf("$%s: %w", BinEnv, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("$%s=%s is not an executable file", BinEnv, bin)
		}
		return bin, nil
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "reprieve")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+ReleaseVersion, "-o", out, "./cmd/reprieve")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building reprieve: %w\n%s", err, b)
	}
	return out, nil
}

// SpotOptions describes one spot-interruption run.
type SpotOptions struct {
	Env         *testenv.Env
	ReprieveBin string
	// Namespace and Node are created by the run.
	Namespace, Node string
	Pods            []Pod
	// NoticeDelay is how long after the mock starts the notice appears; Window how long after
	// that the machine is reclaimed.
	NoticeDelay, Window time.Duration
	SafetyMargin        time.Duration
	LogDir              string
	// ExtraArgs go to reprieve after the standard flags.
	ExtraArgs []string
	// Kubeconfig is what reprieve runs with; empty means the environment's admin.
	Kubeconfig string
	// Cloud simulates the cloud; nil is AWS (amazon-ec2-metadata-mock).
	Cloud Cloud
	// Eviction is reprieve's --interruption-eviction; empty is kube-controller-manager (the
	// NoExecute taint), StartReprieve's: the scenarios were written when it was the default.
	Eviction plan.Eviction
	// BinaryDefault runs reprieve with no --interruption-eviction at all, as a default install
	// does (the chart passes none): the binary's own default mode. Eviction is then ignored.
	BinaryDefault bool
	// BeforeNotice, when set, runs once the namespace, the node and Pods exist, before the
	// cloud is started: for objects whose pods must run before the notice (a real DaemonSet).
	BeforeNotice func(ctx context.Context) error
}

// Cloud is a simulated cloud that posts one interruption notice for a node.
type Cloud interface {
	// Start serves the metadata endpoint and arranges for the notice to appear after delay,
	// with the machine reclaimed window after it (where the cloud lets the notice say so).
	Start(ctx context.Context, node, logDir string, delay, window time.Duration) (*Posted, error)
}

// Posted is a started cloud simulation.
type Posted struct {
	// Args are the reprieve flags that point it at this cloud.
	Args []string
	// At returns when the notice became visible at the endpoint (zero until then).
	At func() time.Time
	// Stop ends the simulation.
	Stop func()
}

// AWS is amazon-ec2-metadata-mock posting a spot notice.
type AWS struct{}

// Start implements Cloud. The deadline is fixed up front (the mock's default recomputes it on
// every request), and the mock shows the notice delay seconds after it starts.
func (AWS) Start(ctx context.Context, _, logDir string, delay, window time.Duration) (*Posted, error) {
	start := time.Now()
	deadline := start.Add(delay + window).Truncate(time.Second).Add(time.Second)
	mock, endpoint, err := testenv.StartIMDSMock(ctx, logDir,
		"--imdsv2", "--mock-delay-sec="+strconv.Itoa(int(delay/time.Second)),
		"spot", "--action=terminate", "--time="+deadline.UTC().Format(time.RFC3339))
	if err != nil {
		return nil, err
	}
	return &Posted{
		Args: []string{"--provider=aws", "--aws-imds-endpoint=" + endpoint},
		At:   func() time.Time { return start.Add(delay) },
		Stop: func() { _ = mock.Stop() },
	}, nil
}

// SpotResult is what happened.
type SpotResult struct {
	// TimeAdded is the interruption taint's timeAdded; TaintSeenAt when the watcher saw it;
	// NoticePostedAt when the cloud made the notice visible.
	TimeAdded, TaintSeenAt, NoticePostedAt time.Time
	Deadline                               time.Time
	Window                                 plan.Window
	// Node is the node as it was right after the taint appeared.
	Node *v1.Node
	Rows []Row
	// Metrics is reprieve's /metrics text, scraped at the end.
	Metrics string
	// ExitCode is reprieve's exit status after SIGTERM.
	ExitCode int
	// NodeEvents and PodEvents are the Kubernetes Events reprieve recorded, as the API server
	// holds them.
	NodeEvents, PodEvents []v1.Event
	// LogPath is reprieve's log file, for a failing test to quote (AgentLines).
	LogPath string
	// Namespace holds the run's pods.
	Namespace string
}

// AgentLines returns the last n lines of reprieve's log that name a pod or an error: what a
// failing timing assertion needs to tell a slow server from a wrong plan.
func (r *SpotResult) AgentLines(n int) string {
	b, err := os.ReadFile(r.LogPath)
	if err != nil {
		return fmt.Sprintf("reading reprieve's log: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "pod=") || strings.Contains(l, "err=") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// EventReasons returns "object reason" for every event that reprieve recorded (kwok records
// events of its own), for assertions.
func (r *SpotResult) EventReasons() map[string]int {
	out := map[string]int{}
	for _, e := range append(append([]v1.Event{}, r.NodeEvents...), r.PodEvents...) {
		if e.Source.Component != "reprieve" {
			continue
		}
		out[e.InvolvedObject.Name+" "+e.Reason] += int(max(e.Count, 1))
	}
	return out
}

// ReasonTaintManagerEviction is the event kube-controller-manager's taint-eviction controller
// records on a pod it deletes ("Marking for deletion Pod ns/name", emitPodDeletionEvent in
// pkg/controller/tainteviction/taint_eviction.go), and on one whose deletion it cancels
// ("Cancelling deletion of Pod ...").
const ReasonTaintManagerEviction = "TaintManagerEviction"

// MarkedByTaintEviction returns the pods, by name, that kube-controller-manager's taint-eviction
// controller marked for deletion, from events.
func MarkedByTaintEviction(events []v1.Event) map[string]bool {
	out := map[string]bool{}
	for _, e := range events {
		if e.Reason == ReasonTaintManagerEviction && e.InvolvedObject.Kind == "Pod" && strings.HasPrefix(e.Message, "Marking for deletion") {
			out[e.InvolvedObject.Name] = true
		}
	}
	return out
}

// Row returns the row of pod name.
func (r *SpotResult) Row(name string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Pod == name {
			return row, true
		}
	}
	return Row{}, false
}

// RunSpot creates the workload, starts amazon-ec2-metadata-mock with a spot notice and the
// reprieve binary against it, waits until every pod reprieve plans to evict is gone (or the
// deadline passed), then stops reprieve with SIGTERM and reports.
func RunSpot(ctx context.Context, o SpotOptions) (*SpotResult, error) {
	c := o.Env.Client
	taint, err := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err != nil {
		return nil, err
	}
	ts := plan.TaintSet{Interruption: taint}
	var modeArgs []string
	start := StartReprieve
	mode := o.Eviction
	if o.BinaryDefault {
		start, mode = StartReprieveDefault, plan.Eviction(config.DefaultConfig().InterruptionEviction)
	} else if o.Eviction == plan.EvictionReprieve {
		modeArgs = []string{"--interruption-eviction=" + string(o.Eviction)}
	}
	if mode == plan.EvictionReprieve {
		// The node gets the taint NoSchedule; the pods tolerate it as NoExecute all the same.
		ts.Interruption.Effect = v1.TaintEffectNoSchedule
	}
	if err := o.Env.CreateNamespace(ctx, o.Namespace); err != nil {
		return nil, err
	}
	if _, err := o.Env.CreateNode(ctx, o.Node, nil); err != nil {
		return nil, err
	}
	if err := Create(ctx, c, o.Namespace, o.Node, taint, o.Pods); err != nil {
		return nil, err
	}
	obs, err := Observe(ctx, c, o.Namespace)
	if err != nil {
		return nil, err
	}
	defer obs.Stop()
	if o.BeforeNotice != nil {
		if err := o.BeforeNotice(ctx); err != nil {
			return nil, err
		}
	}

	cloud := o.Cloud
	if cloud == nil {
		cloud = AWS{}
	}
	posted, err := cloud.Start(ctx, o.Node, o.LogDir, o.NoticeDelay, o.Window)
	if err != nil {
		return nil, err
	}
	defer posted.Stop()

	rp, metricsAddr, err := start(ctx, o.ReprieveBin, o.LogDir, o.Node, append(append([]string{
		"--kubeconfig=" + o.kubeconfig(),
		"--safety-margin=" + o.SafetyMargin.String(),
	}, posted.Args...), append(modeArgs, o.ExtraArgs...)...)...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rp.Stop() }()
	fail := func(err error) (*SpotResult, error) {
		return nil, fmt.Errorf("%w\nreprieve log (%s):\n%s", err, rp.LogPath(), rp.LogTail(40))
	}

	res := &SpotResult{Namespace: o.Namespace}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, o.NoticeDelay+30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, t := range n.Spec.Taints {
			if t.Key == taint.Key && t.Effect == ts.Interruption.Effect && t.TimeAdded != nil {
				res.TaintSeenAt, res.TimeAdded, res.Node = time.Now(), t.TimeAdded.Time, n
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fail(fmt.Errorf("waiting for the interruption taint on %s: %w", o.Node, err))
	}
	res.NoticePostedAt = posted.At()
	// The deadline as the agent wrote it (whole seconds, as every cloud's deadline is planned).
	deadline, err := time.Parse(time.RFC3339, res.Node.Annotations[record.AnnotationReclaimDeadline])
	if err != nil {
		return fail(fmt.Errorf("reading the deadline annotation: %w", err))
	}
	res.Deadline, res.Window = deadline, plan.Window{Deadline: deadline, SafetyMargin: o.SafetyMargin}

	// Plan every pod as the agent does, from the node as written.
	pods, err := c.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(fmt.Errorf("listing pods: %w", err))
	}
	noExec := plan.EvictingTaints(res.Node.Spec.Taints, ts, true)
	specs := map[string]Pod{}
	for _, p := range o.Pods {
		specs[p.Name] = p
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		spec := specs[p.Name]
		pl := plan.PlanPod(p, noExec, res.Window, plan.PodFilter{}, false)
		row := Row{Pod: p.Name, Toleration: spec.Toleration(), Grace: spec.GraceSeconds(), End: res.Window.End(), PDB: spec.PDB}
		if pl.Skip != plan.SkipNone {
			row.Note = "left alone: " + string(pl.Skip)
		} else {
			row.Planned, row.ByDeadline = pl.EvictAt, pl.ByDeadline
		}
		res.Rows = append(res.Rows, row)
	}

	// Wait until every planned pod is gone, or until a little after the deadline.
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Until(deadline)+5*time.Second, true, func(context.Context) (bool, error) {
		recs := obs.Records()
		for _, row := range res.Rows {
			if !row.Planned.IsZero() && recs[row.Pod].GoneAt.IsZero() {
				return false, nil
			}
		}
		return true, nil
	})
	// The agent summarises the interruption at the first poll after the window's end.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Until(res.Window.End())+15*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + o.Node})
		if err != nil {
			return false, nil
		}
		res.NodeEvents = evs.Items
		for _, e := range evs.Items {
			if e.Reason == events.ReasonInterruptionHandled {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fail(fmt.Errorf("waiting for the %s event: %w", events.ReasonInterruptionHandled, err))
	}
	podEvents, err := c.CoreV1().Events(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(fmt.Errorf("listing events: %w", err))
	}
	res.PodEvents = podEvents.Items
	marked := MarkedByTaintEviction(res.PodEvents)
	recs := obs.Records()
	for i := range res.Rows {
		res.Rows[i].Record = recs[res.Rows[i].Pod]
		res.Rows[i].KubeControllerManager = marked[res.Rows[i].Pod]
	}
	res.LogPath = rp.LogPath()
	if res.Metrics, err = Scrape(metricsAddr); err != nil {
		return fail(err)
	}
	if err := rp.Stop(); err != nil {
		return fail(err)
	}
	if res.ExitCode, err = rp.Wait(time.Second); err != nil {
		return fail(fmt.Errorf("waiting for reprieve to exit: %w", err))
	}
	return res, nil
}

func (o SpotOptions) kubeconfig() string {
	if o.Kubeconfig != "" {
		return o.Kubeconfig
	}
	return o.Env.Kubeconfig
}

// StartReprieve starts the reprieve binary for node with args (which must include
// --kubeconfig and --provider), a 1 s poll interval, -v=2 and metrics on a free loopback
// port, and waits until /readyz answers 200 (at most 2.5 min). Its log is reprieve-<node>.log in logDir.
//
// It runs the NoExecute mode, --interruption-eviction=kube-controller-manager, unless args say
// otherwise (a later flag wins): the tests that start agents here were written when that mode
// was the default, and assert its NoExecute taint. The default mode, reprieve's budget mode, has
// tests of its own: StartReprieveDefault, and SpotOptions.Eviction.
func StartReprieve(ctx context.Context, bin, logDir, node string, args ...string) (*testenv.Process, string, error) {
	return startReprieve(ctx, bin, logDir, node, false, append([]string{NoExecuteMode}, args...)...)
}

// NoExecuteMode is the flag of the mode StartReprieve runs unless told otherwise.
const NoExecuteMode = "--interruption-eviction=" + string(plan.EvictionKubeControllerManager)

// StartReprieveDefault is StartReprieve with the binary's own --interruption-eviction, as a
// default install runs it (the chart passes none).
func StartReprieveDefault(ctx context.Context, bin, logDir, node string, args ...string) (*testenv.Process, string, error) {
	return startReprieve(ctx, bin, logDir, node, false, args...)
}

// StartReprieveBlind is StartReprieve for an agent started while its metadata service does not
// answer: it waits until the agent has synced and polled, which /readyz then says with a 503
// that names the silent sources ("cannot see the cloud's notices"). An agent that answers 200
// instead is an error: it would be Ready while blind.
func StartReprieveBlind(ctx context.Context, bin, logDir, node string, args ...string) (*testenv.Process, string, error) {
	return startReprieve(ctx, bin, logDir, node, true, append([]string{NoExecuteMode}, args...)...)
}

// blindReason is what /readyz says of an agent that has synced but whose metadata sources have
// not answered (agent.notReady).
const blindReason = "cannot see the cloud's notices"

func startReprieve(ctx context.Context, bin, logDir, node string, blind bool, args ...string) (*testenv.Process, string, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Local pressure is off unless a test turns it on (a later flag wins): the host's own
	// signals would otherwise taint every simulated node of this machine alike.
	all := append([]string{"--node-name=" + node, "--poll-interval=1s", "--metrics-bind-address=" + addr, "-v=2", "--pressure-source=off"}, args...)
	logPath := filepath.Join(logDir, "reprieve-"+node+".log")
	p, err := testenv.StartProcess(ctx, "reprieve", logPath, bin, all, os.Environ())
	if err != nil {
		return nil, "", err
	}
	// Up to 2.5 min: an agent is not Ready while Azure's first Scheduled Events call is still
	// outstanding, which may take two minutes (the caller's ctx may bound it sooner).
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 150*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("reprieve exited: %s", p.ExitDescription())
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if blind {
			if resp.StatusCode == http.StatusOK {
				return false, fmt.Errorf("/readyz answered 200 while the metadata service does not answer; want 503 saying %q", blindReason)
			}
			return strings.Contains(string(body), blindReason), nil
		}
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		_ = p.Stop()
		return nil, "", fmt.Errorf("waiting for reprieve to be ready: %w\n%s", err, p.LogTail(30))
	}
	return p, addr, nil
}

// Scrape returns the text of a metrics endpoint.
func Scrape(addr string) (string, error) { return scrape("http://" + addr + "/metrics") }

func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("scraping %s: status %d: %v", url, resp.StatusCode, err)
	}
	return string(b), nil
}
