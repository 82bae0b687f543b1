package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers/aws"
	"github.com/reprieve-dev/reprieve/providers/azure"
	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/fakes/faultproxy"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// Issue 20 on the real control plane: the interruption record on the node (the taint with its
// timeAdded, the deadline annotation, reprieve.io/interruption) is what every agent process
// resumes. The agent is killed mid-window and restarted while a source fails or its first call
// is outstanding; node writes are held by a slow admission webhook; SIGTERM comes mid-window;
// another NoExecute taint appears; a policy refuses only taint changes. Times are logged
// relative to the interruption taint's timeAdded (T).

// agentUser is the identity agentKubeconfig authenticates as (the shipped ServiceAccount).
const agentUser = "system:serviceaccount:" + scenario.AgentNamespace + ":" + scenario.AgentServiceAccount

// evictionSlack is how late an eviction may be seen by a test's watch after its planned time:
// the agent's timer, the request and the watch's delivery on a loaded 2-core machine. The
// tests of this file time evictions by the API server's receipt instead (evictedAt).
const evictionSlack = 1500 * time.Millisecond

// recordState is what a restart must leave alone: the interruption taint's timeAdded, the
// deadline annotation and the interruption record.
type recordState struct {
	TimeAdded time.Time
	Deadline  string
	Record    string
}

func recordOf(n *v1.Node, taint v1.Taint) recordState {
	s := recordState{Deadline: n.Annotations[record.AnnotationReclaimDeadline], Record: n.Annotations[record.AnnotationInterruption]}
	for _, t := range n.Spec.Taints {
		if t.Key == taint.Key && t.Effect == taint.Effect && t.TimeAdded != nil {
			s.TimeAdded = t.TimeAdded.Time
		}
	}
	return s
}

// recordWatch reads the node every 100 ms from now until stop and keeps the first state that
// differs from want, so that a withdrawal that is undone a second later is still seen.
type recordWatch struct {
	mu      sync.Mutex
	changed *recordState
	at      time.Time
	reads   int
	stop    context.CancelFunc
	done    chan struct{}
}

func watchRecord(ctx context.Context, node string, taint v1.Taint, want recordState) *recordWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &recordWatch{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err == nil {
				got := recordOf(n, taint)
				w.mu.Lock()
				w.reads++
				if got != want && w.changed == nil {
					w.changed, w.at = &got, time.Now()
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

// check stops the watch and fails the test if the record changed.
func (w *recordWatch) check(t *testing.T, T time.Time, want recordState) {
	t.Helper()
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reads < 5 {
		t.Errorf("the node was read only %d times while the record was watched", w.reads)
	}
	if w.changed != nil {
		t.Errorf("the record changed at T%+.2fs:\n got %+v\nwant %+v", w.at.Sub(T).Seconds(), *w.changed, want)
	}
}

// waitRecord waits (up to bound) until the node carries the interruption taint, the deadline
// annotation and a record that names every source in sources, and returns the node.
func waitRecord(ctx context.Context, t *testing.T, node string, bound time.Duration, taint v1.Taint, sources ...string) *v1.Node {
	t.Helper()
	var n *v1.Node
	waitLong(ctx, t, bound, "the interruption record", func() bool {
		got, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		s := recordOf(got, taint)
		if s.TimeAdded.IsZero() || s.Deadline == "" || s.Record == "" {
			return false
		}
		for _, src := range sources {
			if !strings.Contains(s.Record, `"source":"`+src+`"`) {
				return false
			}
		}
		n = got
		return true
	})
	return n
}

// startUnready starts the reprieve binary as StartReprieve does but returns as soon as it serves
// /healthz, not /readyz: an agent whose provider has not answered (Azure's first call held, a
// write check refused) is not ready and must still be observed. Its log is reprieve-<logName>.log.
func startUnready(ctx context.Context, t *testing.T, logName, node string, args ...string) (*testenv.Process, string) {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// The NoExecute mode unless args say otherwise, as StartReprieve.
	all := append([]string{"--node-name=" + node, "--poll-interval=1s", "--metrics-bind-address=" + addr, "-v=2", "--pressure-source=off", scenario.NoExecuteMode}, args...)
	p, err := testenv.StartProcess(ctx, "reprieve", filepath.Join(logDir, "reprieve-"+logName+".log"), reprieveBin, all, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("reprieve exited: %s", p.ExitDescription())
		}
		code, _ := probe(addr, "/healthz")
		return code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("waiting for reprieve's /healthz: %v\n%s", err, p.LogTail(30))
	}
	return p, addr
}

// sleepUntil waits until at (the e2e clock is the wall clock).
func sleepUntil(ctx context.Context, t *testing.T, at time.Time) {
	t.Helper()
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// eventually polls cond every 50 ms until it holds or timeout passes, and reports which: the
// caller goes on to check what happened either way, so that a failure says what changed.
func eventually(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	}) == nil
}

// evictedAt checks when the API server received the agent's first accepted request for pod
// against its plan (timing.checkSent: never before it, nor later than slack plus the time the
// agent's other requests were in the server's hands) and logs it. obs is the test's watch: the
// pod must have been seen terminating. agents are the agent processes of the run (their logs
// hold the margin a deadline-bound pod leaves before its plan).
func evictedAt(ctx context.Context, t *testing.T, obs *scenario.Observer, ns, pod string, planned, T time.Time, byDeadline bool, agents ...*testenv.Process) {
	t.Helper()
	if obs.Records()[pod].DeletedAt.IsZero() {
		t.Errorf("pod %s never evicted, planned T%+.2fs", pod, planned.Sub(T).Seconds())
		return
	}
	var logs []string
	for _, a := range agents {
		logs = append(logs, a.LogPath())
	}
	a := auditTiming(ctx, t, env, ns, agentUser, logs, pod).checkSent(t, pod, planned, time.Time{}, time.Time{}, byDeadline)
	t.Logf("pod %s: the API server received its %s at T%+.2fs, planned T%+.2fs (%+.0f ms)", pod, what(a),
		a.Received.Sub(T).Seconds(), planned.Sub(T).Seconds(), float64(a.Received.Sub(planned).Milliseconds()))
}

// noTaintRemoved fails the test if the agent recorded a TaintRemoved event for node that names
// the interruption taint, or any TaintRemoved event from since on (the restart): the soft taint
// that an interruption replaces (scheduled maintenance far ahead) goes before it, by design.
func noTaintRemoved(ctx context.Context, t *testing.T, node string, interruption v1.Taint, since time.Time) {
	t.Helper()
	evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + node + ",reason=" + events.ReasonTaintRemoved})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if strings.Contains(e.Message, interruption.Key+"=") || !at.Before(since.Truncate(time.Second)) {
			t.Errorf("TaintRemoved event at %v: %q", at, e.Message)
		}
	}
}

// failPath answers 500 for GETs whose path ends with suffix while failing is set, and hands
// every other request to next (the fault proxy in Pass mode): one source of a cloud fails
// while the others answer.
type failPath struct {
	next    http.Handler
	suffix  string
	failing atomic.Bool
	failed  atomic.Int32
}

func (f *failPath) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.failing.Load() && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, f.suffix) {
		f.failed.Add(1)
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	f.next.ServeHTTP(w, r)
}

// TestRecordRestartAWSPartialAnswer (issue 20 case 1): a spot notice and amazon-ec2-metadata-mock's
// rebalance recommendation; the agent is killed (SIGKILL) at T+3 and restarted while
// spot/instance-action answers 500 and the rebalance and scheduled-events paths answer. The
// taint's timeAdded, the deadline annotation and the record stay as they were, nothing is
// removed, and a pod tolerating 8 s is evicted at T+8 by the new agent.
func TestRecordRestartAWSPartialAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node, tolerate = "rr-aws", "rr-aws-node", 8
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{{Name: "tol-8", Kind: scenario.Plain, Tolerate: ptr64(tolerate), Grace: ptr64(1)}})

	deadline := time.Now().Add(45 * time.Second).UTC().Truncate(time.Second)
	mock, backend, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2", "spot", "--action=terminate", "--time="+deadline.Format(time.RFC3339))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mock.Stop() }()
	proxy, err := faultproxy.New(backend)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	fault := &failPath{next: proxy, suffix: "/" + aws.PathSpotInstanceAction}
	srv := httptest.NewServer(fault)
	defer srv.Close()

	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=aws", "--aws-imds-endpoint=" + srv.URL}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	n := waitRecord(ctx, t, node, 30*time.Second, taint, aws.PathSpotInstanceAction, aws.PathRebalance)
	before := recordOf(n, taint)
	T := before.TimeAdded
	t.Logf("record before the restart: %+v", before)

	sleepUntil(ctx, t, T.Add(3*time.Second))
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	fault.failing.Store(true)
	watch := watchRecord(ctx, node, taint, before)
	// The metadata service fails from the restart on: the new agent is up, not Ready (it cannot see).
	second, addr, err := scenario.StartReprieveBlind(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()
	restarted := time.Now()
	eventually(ctx, time.Until(T.Add(tolerate*time.Second))+10*time.Second, func() bool {
		return !obs.Records()["tol-8"].DeletedAt.IsZero()
	})
	// The spot source answers again: the same notice, nothing moves.
	fault.failing.Store(false)
	answered := fault.failed.Load()
	time.Sleep(2 * time.Second) // two polls with every source answering
	watch.check(t, T, before)

	t.Logf("killed at T%+.2fs; the new agent ready at T%+.2fs with %s failing (%d answers of 500 to it); the spot source answered again at T+%.0fs",
		killed.Sub(T).Seconds(), restarted.Sub(T).Seconds(), aws.PathSpotInstanceAction, answered, float64(tolerate))
	evictedAt(ctx, t, obs, ns, "tol-8", T.Add(tolerate*time.Second), T, false, first, second)
	noTaintRemoved(ctx, t, node, taint, killed)
	if answered == 0 {
		t.Error("no request of the new agent met the failing spot source")
	}
	wantCounted(t, addr, "the restarted agent's failed polls", `reprieve_metadata_polls_total{outcome="error",provider="aws"}`)
}

// TestRecordRestartAzureFirstCallOutstanding (issue 20 case 2): a Preempt from the Scheduled
// Events fake; the agent is killed at T+2 and the new one's first Scheduled Events call is held
// for 8 s (the fake's documented first-call delay: Azure enables the service). While it is
// outstanding, the taint, the deadline annotation and the record stay, and a pod tolerating 5 s
// is evicted at T+5; once the call answers, nothing moves either.
func TestRecordRestartAzureFirstCallOutstanding(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node, tolerate = "rr-azure", "rr-azure-node", 5
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{{Name: "tol-5", Kind: scenario.Plain, Tolerate: ptr64(tolerate), Grace: ptr64(1)}})
	srv := azureevents.New(node)
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=azure", "--azure-imds-endpoint=" + url, "--azure-resource-name=" + node}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	srv.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{node},
		NotBefore: time.Now().Add(40 * time.Second).Truncate(time.Second), DurationInSeconds: -1})
	n := waitRecord(ctx, t, node, 30*time.Second, taint, azure.SourceScheduledEvents)
	before := recordOf(n, taint)
	T := before.TimeAdded
	t.Logf("record before the restart: %+v", before)

	sleepUntil(ctx, t, T.Add(2*time.Second))
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The first process's calls had no delay, so the fake has not enabled the service with one
	// yet: the new process's first GET is held for the whole delay.
	const held = 8 * time.Second
	srv.SetFirstAnswerDelay(held)
	watch := watchRecord(ctx, node, taint, before)
	second, addr := startUnready(ctx, t, node+"-2", node, args...)
	restarted := time.Now()
	waitFor(ctx, t, "the new agent's first call held", func() bool { return !srv.FirstAnswerAt().IsZero() })
	answerAt := srv.FirstAnswerAt()
	if code, body := probe(addr, "/readyz"); code == http.StatusOK {
		t.Errorf("the new agent is ready while its first Scheduled Events call is outstanding: %s", body)
	}
	eventually(ctx, time.Until(T.Add(tolerate*time.Second))+10*time.Second, func() bool {
		return !obs.Records()["tol-5"].DeletedAt.IsZero()
	})
	evicted := obs.Records()["tol-5"].DeletedAt
	evictedBeforeAnswer := !evicted.IsZero() && evicted.Before(answerAt)
	sleepUntil(ctx, t, answerAt.Add(3*time.Second)) // the answer, then a few polls
	watch.check(t, T, before)
	if code, body := probe(addr, "/readyz"); code != http.StatusOK {
		t.Errorf("the new agent is not ready 3 s after the first answer: %d %s\n%s", code, body, second.LogTail(20))
	}
	t.Logf("killed at T%+.2fs; the new agent serving at T%+.2fs; its first call answered at T%+.2fs", killed.Sub(T).Seconds(), restarted.Sub(T).Seconds(), answerAt.Sub(T).Seconds())
	evictedAt(ctx, t, obs, ns, "tol-5", T.Add(tolerate*time.Second), T, false, first, second)
	if !evictedBeforeAnswer {
		t.Errorf("tol-5 was not evicted before the first call answered (T%+.2fs): the record alone must drive the plan", answerAt.Sub(T).Seconds())
	}
	noTaintRemoved(ctx, t, node, taint, killed)
}

// TestRecordRestartGCPPreemption (issue 20 case 3, and case 1 on GCP): preempted=TRUE gives the
// VM 30 s from when the value changed, which the metadata server does not say: the agent counts
// from when it first saw it. Killed at T+9 and restarted, the new agent must keep the deadline
// at first sight + 30 s, not restart + 30 s, whether instance/preempted answers TRUE to it
// ("answering") or fails with 500 while the other values answer ("preempted-failing"; a host
// maintenance six hours ahead is the other source in the record, so that the new agent has
// something to report). A pod
// tolerating 15 s is evicted at T+15; a pod tolerating 600 s with a 5 s grace at its latest
// start, D - margin - 5 s, as the first agent planned it.
func TestRecordRestartGCPPreemption(t *testing.T) {
	t.Parallel()
	for _, failing := range []bool{false, true} {
		name := "answering"
		if failing {
			name = "preempted-failing"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ns, node := "rr-gcp-"+name, "rr-gcp-"+name+"-node"
			taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
				{Name: "tol-15", Kind: scenario.Plain, Tolerate: ptr64(15), Grace: ptr64(1)},
				{Name: "latest", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(5)},
			})
			srv := gcpmeta.New()
			// Host maintenance scheduled six hours ahead, beyond --maintenance-lead: it only keeps
			// new pods off the node. It is a second source in the record, one that answers while
			// instance/preempted fails.
			window := time.Now().Add(6 * time.Hour).Truncate(time.Second)
			srv.Set(gcpmeta.PathOnHostMaintenance, "TERMINATE")
			srv.SetUpcomingMaintenance(gcpmeta.UpcomingMaintenance{Status: "PENDING", Type: "SCHEDULED", WindowStart: window, WindowEnd: window.Add(4 * time.Hour)})
			url, err := srv.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = srv.Close() }()
			args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://")}
			first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = first.Stop() }()
			srv.Set(gcpmeta.PathPreempted, "TRUE")
			posted := time.Now()
			n := waitRecord(ctx, t, node, 30*time.Second, taint, gcpmeta.PathPreempted, gcpmeta.PathUpcomingMaintenance)
			before := recordOf(n, taint)
			T := before.TimeAdded
			D, err := time.Parse(time.RFC3339, before.Deadline)
			if err != nil {
				t.Fatal(err)
			}
			if d := D.Sub(posted); d < 28*time.Second || d > 31*time.Second {
				t.Fatalf("the first agent's deadline is %v after the value changed, want about 30 s", d)
			}
			t.Logf("record before the restart: %+v (deadline T%+.0fs)", before, D.Sub(T).Seconds())

			sleepUntil(ctx, t, T.Add(9*time.Second))
			if err := first.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if failing {
				// Every read of instance/preempted fails (the client library retries 5xx on
				// its own); maintenance-event and upcoming-maintenance answer.
				srv.SetError(gcpmeta.PathPreempted, http.StatusInternalServerError, 1<<30)
			}
			watch := watchRecord(ctx, node, taint, before)
			start := scenario.StartReprieve
			if failing {
				// instance/preempted fails from the restart on: the new agent is up, not Ready
				// (it cannot see).
				start = scenario.StartReprieveBlind
			}
			second, addr, err := start(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = second.Stop() }()
			restarted := time.Now()
			latest := lastStart(D.Add(-margin), 5*time.Second)
			eventually(ctx, time.Until(latest)+10*time.Second, func() bool {
				r := obs.Records()
				return !r["tol-15"].DeletedAt.IsZero() && !r["latest"].DeletedAt.IsZero()
			})
			watch.check(t, T, before)
			t.Logf("killed at T%+.2fs; the new agent ready at T%+.2fs: its own first sight + 30 s would be after T%+.2fs",
				killed.Sub(T).Seconds(), restarted.Sub(T).Seconds(), killed.Add(30*time.Second).Sub(T).Seconds())
			evictedAt(ctx, t, obs, ns, "tol-15", T.Add(15*time.Second), T, false, first, second)
			evictedAt(ctx, t, obs, ns, "latest", latest, T, true, first, second)
			noTaintRemoved(ctx, t, node, taint, killed)
			if failing {
				if got := srv.Count(gcpmeta.PathPreempted); got == 0 {
					t.Error("the new agent never read instance/preempted")
				}
				wantCounted(t, addr, "the new agent's 5xx answers", `reprieve_metadata_requests_total{outcome="server_error",provider="gcp"}`)
			}
		})
	}
}

// TestRecordRestartGCPMaintenance (issue 20 case 3, first bullet, shortened): a GPU VM's
// TERMINATE_ON_HOST_MAINTENANCE without an upcoming-maintenance window stops the VM
// --gcp-maintenance-notice (30 s here) after the value was first seen; with --maintenance-lead
// 20 s the interruption taint goes on 10 s in. The agent restarted 15 s in must keep the first
// sighting: restart + 40 s would be further away than the lead, and the interruption would be
// withdrawn, as it was 56 minutes into a one-hour notice.
func TestRecordRestartGCPMaintenance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "rr-gcp-maint", "rr-gcp-maint-node"
	const notice, lead = 30 * time.Second, 20 * time.Second
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{{Name: "latest", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(5)}})
	srv := gcpmeta.New()
	srv.Set(gcpmeta.PathOnHostMaintenance, "TERMINATE")
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://"),
		"--gcp-maintenance-notice=" + notice.String(), "--maintenance-lead=" + lead.String()}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	srv.Set(gcpmeta.PathMaintenanceEvent, "TERMINATE_ON_HOST_MAINTENANCE")
	posted := time.Now()
	n := waitRecord(ctx, t, node, notice, taint, gcpmeta.PathMaintenanceEvent)
	before := recordOf(n, taint)
	T := before.TimeAdded
	D, err := time.Parse(time.RFC3339, before.Deadline)
	if err != nil {
		t.Fatal(err)
	}
	if d := D.Sub(posted); d < notice-2*time.Second || d > notice+time.Second {
		t.Fatalf("the first agent's deadline is %v after the value changed, want about %v", d, notice)
	}
	t.Logf("value changed at T%+.2fs; record before the restart: %+v (deadline T%+.0fs)", posted.Sub(T).Seconds(), before, D.Sub(T).Seconds())

	sleepUntil(ctx, t, posted.Add(15*time.Second))
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	watch := watchRecord(ctx, node, taint, before)
	second, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()
	restarted := time.Now()
	latest := lastStart(D.Add(-margin), 5*time.Second)
	eventually(ctx, time.Until(latest)+10*time.Second, func() bool { return !obs.Records()["latest"].DeletedAt.IsZero() })
	watch.check(t, T, before)
	t.Logf("killed %v after the value changed, the new agent ready %v after it: its own first sight + %v would be after T%+.2fs, %v further than the lead",
		killed.Sub(posted).Round(time.Millisecond), restarted.Sub(posted).Round(time.Millisecond), notice, killed.Add(notice).Sub(T).Seconds(), notice-lead)
	evictedAt(ctx, t, obs, ns, "latest", latest, T, true, first, second)
	noTaintRemoved(ctx, t, node, taint, killed)
}

// holdingWebhook is a validating admission webhook (failurePolicy Ignore, timeoutSeconds 10, as
// a slow or dead webhook in a real cluster is configured) for UPDATEs of one node: it holds
// every write of the agent's identity until release is called, and answers everything else
// (dry runs, the test's own patches) at once.
type holdingWebhook struct {
	held, others atomic.Int32
	release      func()
}

func startHoldingWebhook(ctx context.Context, t *testing.T, node string) *holdingWebhook {
	t.Helper()
	h := &holdingWebhook{}
	released := make(chan struct{})
	var once sync.Once
	h.release = func() { once.Do(func() { close(released) }) }
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		req := review.Request
		if req.UserInfo.Username == agentUser && (req.DryRun == nil || !*req.DryRun) {
			h.held.Add(1)
			select {
			case <-released:
			case <-r.Context().Done():
				return
			}
		} else {
			h.others.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta,
			Response: &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}})
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	t.Cleanup(h.release) // before srv.Close: held requests answer
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	url := srv.URL + "/validate"
	ignore, none, timeout, scope := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNone, int32(10), admissionregistrationv1.ClusterScope
	hook := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "rr-hold-" + node},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "hold.rr.reprieve-e2e.example.com",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}, Scope: &scope},
			}},
			// This test's node only: the other tests' nodes and kwok's status updates pass.
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "this-node", Expression: fmt.Sprintf("object.metadata.name == %q", node)}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
	})
	// In force once a dry-run patch of the node reaches it.
	waitFor(ctx, t, "the holding webhook in force", func() bool {
		_, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"annotations":{"rr-probe":"x"}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && h.others.Load() > 0
	})
	return h
}

// TestRecordSlowNodeWrite (issue 20 case 4): a validating webhook holds every node write of the
// agent. At the notice, the pod without a toleration is evicted within a second and the pod
// tolerating 3 s at T+3, while the taint's PATCH is still held; once the webhook answers, the
// taint lands with the notice's time as timeAdded.
func TestRecordSlowNodeWrite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "rr-slow-write", "rr-slow-write-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "now", Kind: scenario.Plain, Grace: ptr64(1)},
		{Name: "tol-3", Kind: scenario.Plain, Tolerate: ptr64(3), Grace: ptr64(1)},
	})
	// The agent starts (and runs its start-up write check) before the webhook is registered. It
	// reads the annotation every 200 ms, so that the second measured is the eviction's, not the
	// poll's.
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "--poll-interval=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	hook := startHoldingWebhook(ctx, t, node)

	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second)
	noticeAt := time.Now()
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	waitLong(ctx, t, 10*time.Second, "both pods evicted", func() bool {
		r := obs.Records()
		return !r["now"].DeletedAt.IsZero() && !r["tol-3"].DeletedAt.IsZero()
	})
	n := getNode(ctx, t, node)
	heldThen := hook.held.Load()
	if hasTaint(n, taint.Key, taint.Effect) {
		t.Errorf("the taint is on the node before the webhook answered (%d writes held): the test held nothing", heldThen)
	}
	if heldThen == 0 {
		t.Errorf("no node write of the agent reached the webhook\n%s", p.LogTail(20))
	}
	releasedAt := time.Now()
	hook.release()
	n = waitNode(ctx, t, node, "the taint after the webhook answered", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	landed := time.Now()
	T := taintOf(n, taint).TimeAdded.Time
	recs := figures(t, obs, T, "now", "tol-3")
	t.Logf("notice at T%+.2fs; %d writes held; released at T%+.2fs; taint on the node at T%+.2fs",
		noticeAt.Sub(T).Seconds(), heldThen, releasedAt.Sub(T).Seconds(), landed.Sub(T).Seconds())
	// From when the API server had written the deadline to when it received the eviction (its
	// audit log): on a loaded machine the server took up to 0.9 s to answer either, and this
	// process's watch saw the eviction later still (issue 52).
	tm := auditTiming(ctx, t, env, ns, agentUser, nil, "now")
	now, _ := tm.first("now")
	notice, ok := tm.nodeWrite(testenv.AdminUser, node, noticeAt)
	if !ok {
		t.Fatalf("the API server's audit log has no write of the deadline to %s", node)
	}
	if d := now.Received.Sub(notice.Answered); recs["now"].DeletedAt.IsZero() || d > time.Second {
		t.Errorf("the eviction of the pod without a toleration reached the API server %v after the notice was written, want within 1 s while the node write is held", d.Round(time.Millisecond))
	} else {
		t.Logf("the eviction of the pod without a toleration reached the API server %v after the notice was written (the server took %v to write the notice, %v to answer the eviction), the taint's PATCH held",
			d.Round(time.Millisecond), notice.Answered.Sub(notice.Received).Round(time.Millisecond), now.Answered.Sub(now.Received).Round(time.Millisecond))
	}
	// timeAdded is when the agent saw the notice, in whole seconds: within a second of it, not
	// when the write finally went through.
	if d := T.Sub(noticeAt); d < -time.Second || d > time.Second {
		t.Errorf("timeAdded T is %v after the notice; want the notice's second, not the write's", d)
	}
	evictedAt(ctx, t, obs, ns, "tol-3", T.Add(3*time.Second), T, false, p)
}

// TestRecordSIGTERMSummary (issue 20 case 6): SIGTERM at T+3 in a 20 s window whose end is
// within --stop-grace: the agent works to the window's end (the pod tolerating 6 s is evicted
// at T+6) and, before it exits 0, emits InterruptionHandled, a MissedDeadline event for the pod a
// finalizer keeps, and the "handled" webhook message.
func TestRecordSIGTERMSummary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "rr-sigterm", "rr-sigterm-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "stuck", Kind: scenario.Plain, Grace: ptr64(1)},
		{Name: "tol-6", Kind: scenario.Plain, Tolerate: ptr64(6), Grace: ptr64(1)},
	})
	// A finalizer nobody removes: kwok, like a kubelet, cannot finish the pod, so it misses the
	// deadline.
	patchPod(ctx, t, ns, "stuck", map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/hold"}}})
	defer patchPod(context.Background(), t, ns, "stuck", map[string]any{"metadata": map[string]any{"finalizers": nil}})
	hook := newReceiver(t)
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none",
		"--webhook-url="+hook.URL, "--webhook-allow-http")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	deadline := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time
	end := deadline.Add(-margin)
	sleepUntil(ctx, t, T.Add(3*time.Second))
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	code, err := p.Wait(time.Until(end) + 15*time.Second)
	exited := time.Now()
	if err != nil || code != 0 {
		t.Fatalf("after SIGTERM: exit %d, %v\n%s", code, err, p.LogTail(30))
	}
	t.Logf("SIGTERM at T%+.2fs; exit 0 at T%+.2fs; window end T%+.2fs", signalled.Sub(T).Seconds(), exited.Sub(T).Seconds(), end.Sub(T).Seconds())
	if exited.Before(end) {
		t.Errorf("exited at T%+.2fs, before the window's end T%+.2fs", exited.Sub(T).Seconds(), end.Sub(T).Seconds())
	}
	// What the agent sent before it exited.
	var texts []string
	for _, m := range hook.bodies() {
		var body struct{ Text string }
		_ = json.Unmarshal([]byte(m.body), &body)
		texts = append(texts, body.Text)
	}
	handledMsg := false
	for _, txt := range texts {
		handledMsg = handledMsg || strings.HasPrefix(txt, "Node "+node+": Interruption handled")
	}
	if !handledMsg {
		t.Errorf("no handled webhook message before the exit; received %q", texts)
	}
	summary := waitHandled(ctx, t, node, end)
	t.Logf("summary: %s", summary.Message)
	if !strings.HasSuffix(summary.Message, ", 1 still present") {
		t.Errorf("summary %q, want the stuck pod as the one still present", summary.Message)
	}
	evs, err := env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + events.ReasonMissedDeadline})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "stuck" {
		t.Errorf("MissedDeadline events: %+v, %v; want one, on the stuck pod", evs, err)
	}
	evictedAt(ctx, t, obs, ns, "tol-6", T.Add(6*time.Second), T, false, p)
}

// recordForeverIgnoresOtherTaints (issue 20 case 9; TestWithTaintEvictionController runs it):
// with kube-controller-manager's node lifecycle and taint-eviction controllers, the node goes
// NotReady mid-window and the controller adds node.kubernetes.io/not-ready:NoExecute. A pod that
// tolerates the interruption taint forever (and not-ready for the default 300 s) has said it
// stays until the machine goes: reprieve must not pull it in to its latest start; only
// upstream's own timing (300 s) applies.
func recordForeverIgnoresOtherTaints(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	const ns, node = "rr-forever", "rr-forever-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "forever", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(5)},
		{Name: "tol-5", Kind: scenario.Plain, Tolerate: ptr64(5), Grace: ptr64(1)},
	})
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, "forever", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	notReady300 := false
	for _, tol := range pod.Spec.Tolerations {
		notReady300 = notReady300 || (tol.Key == v1.TaintNodeNotReady && tol.TolerationSeconds != nil && *tol.TolerationSeconds == 300)
	}
	if !notReady300 {
		t.Fatalf("the pod lacks the default 300 s toleration of %s (DefaultTolerationSeconds admission): %+v", v1.TaintNodeNotReady, pod.Spec.Tolerations)
	}
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	deadline := time.Now().Add(25 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time

	// The node's kubelet stops: kwok no longer manages it, and its last status says NotReady.
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{testenv.KwokNodeAnnotationKey: nil}}}, node)
	notReady := func() {
		n := getNode(ctx, t, node)
		for i := range n.Status.Conditions {
			if c := &n.Status.Conditions[i]; c.Type == v1.NodeReady && c.Status != v1.ConditionFalse {
				c.Status, c.Reason, c.Message = v1.ConditionFalse, "KubeletNotReady", "container runtime is down (e2e)"
				c.LastHeartbeatTime, c.LastTransitionTime = metav1.Now(), metav1.Now()
				if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Logf("setting the node NotReady: %v", err)
				}
			}
		}
	}
	notReady()
	n = waitNode(ctx, t, node, "the node lifecycle controller's not-ready:NoExecute taint", func(n *v1.Node) bool {
		notReady() // in case a heartbeat of kwok's was in flight
		return hasTaint(n, v1.TaintNodeNotReady, v1.TaintEffectNoExecute)
	})
	nr := taintOf(n, v1.Taint{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoExecute})
	at := time.Now()
	if nr.TimeAdded != nil {
		at = nr.TimeAdded.Time
	}
	end := deadline.Add(-margin)
	latest := lastStart(end, 5*time.Second) // the forever pod's grace
	t.Logf("not-ready:NoExecute added at T%+.2fs (timeAdded); window end T%+.2fs; the forever pod's latest start would be T%+.2fs",
		at.Sub(T).Seconds(), end.Sub(T).Seconds(), latest.Sub(T).Seconds())
	if !time.Now().Before(latest.Add(-time.Second)) {
		t.Fatalf("the not-ready taint came at T%+.2fs, too late to pull the pod in before its latest start T%+.2fs: the test proves nothing",
			time.Since(T).Seconds(), latest.Sub(T).Seconds())
	}
	sleepUntil(ctx, t, deadline) // the machine goes: only upstream acts after that
	recs := figures(t, obs, T, "forever", "tol-5")
	if r := recs["forever"]; !r.DeletedAt.IsZero() {
		t.Errorf("the pod that tolerates the interruption forever was deleted at T%+.2fs (grace %d s)", r.DeletedAt.Sub(T).Seconds(), r.Grace)
	}
	evictedAt(ctx, t, obs, ns, "tol-5", T.Add(5*time.Second), T, false, p)
}

// TestRecordWriteCheckTaintPolicy (issue 20 case 10, the write check): a ValidatingAdmissionPolicy
// refuses only changes to spec.taints by the agent's identity, on this test's node. An empty
// patch and a label change pass it, so a check that sends an empty dry-run patch would pass too;
// the agent's check must carry the taint an interruption writes, be refused, and turn the agent
// NotReady after --node-write-refusals (3) refusals, though no interruption ever came.
func TestRecordWriteCheckTaintPolicy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const node = "rr-write-check-node"
	if _, err := env.CreateNode(ctx, node, nil); err != nil {
		t.Fatal(err)
	}
	name := "rr-no-taints-" + node
	fail := admissionregistrationv1.Fail
	const refusal = "e2e policy: this agent may not change the node's taints"
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "the-agent-on-this-node",
				Expression: fmt.Sprintf("request.userInfo.username == %q && object.metadata.name == %q", agentUser, node)}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "object.spec.?taints.orValue([]) == oldObject.spec.?taints.orValue([])",
				Message:    refusal,
			}},
		},
	}
	c := env.Client.AdmissionregistrationV1()
	if _, err := c.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{}) }()
	if _, err := c.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	}()

	// As the agent (the admin impersonates it): a taint is refused, an empty patch and a label pass.
	as := impersonate(t, scenario.AgentServiceAccount, scenario.AgentNamespace, node)
	dry := func(patch string) error {
		_, err := as.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	waitFor(ctx, t, "the policy in force", func() bool {
		err := dry(`{"spec":{"taints":[{"key":"cloud","value":"spot","effect":"NoExecute"}]}}`)
		return err != nil && strings.Contains(err.Error(), refusal)
	})
	for _, patch := range []string{`{}`, `{"metadata":{"labels":{"` + v1.LabelNodeExcludeBalancers + `":"true"}}}`} {
		if err := dry(patch); err != nil {
			t.Fatalf("the policy refuses %s too (it must refuse only taint changes): %v", patch, err)
		}
	}

	p, addr := startUnready(ctx, t, node, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "--node-write-refusals=3")
	started := time.Now()
	var text, body string
	var code int
	waitFor(ctx, t, "three refusals in a row and /readyz failing", func() bool {
		var err error
		if text, err = scenario.Scrape(addr); err != nil {
			return false
		}
		code, body = probe(addr, "/readyz")
		return sumMetric(text, "reprieve_node_write_refusals_in_a_row") >= 3 && code == http.StatusServiceUnavailable
	})
	t.Logf("NotReady %v after start: %s", time.Since(started).Round(time.Millisecond), strings.TrimSpace(body))
	if !strings.Contains(body, "refused in a row") {
		t.Errorf("/readyz says %q, want the refusals", body)
	}
	if n := getNode(ctx, t, node); hasTaint(n, "cloud", v1.TaintEffectNoExecute) {
		t.Errorf("the node carries the interruption taint without an interruption: %+v", n.Spec.Taints)
	}
	if log := p.LogTail(200); !strings.Contains(log, refusal) {
		t.Errorf("the agent's log does not carry the policy's refusal")
	}
}
