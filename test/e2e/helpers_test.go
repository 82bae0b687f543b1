package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// setupNode creates namespace ns (with its default ServiceAccount) and a kwok node.
func setupNode(ctx context.Context, t testing.TB, ns, node string, labels map[string]string) {
	t.Helper()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateNode(ctx, node, labels); err != nil {
		t.Fatal(err)
	}
}

// setDeadline sets the node's deadline annotation, the input of --provider none; "" removes it.
func setDeadline(ctx context.Context, t *testing.T, node, value string) {
	t.Helper()
	var v any = value
	if value == "" {
		v = nil
	}
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationReclaimDeadline: v}}}, node)
}

// waitHandled waits for the agent's InterruptionHandled event on node and returns it. The agent
// writes it at the window's end (end; the deadline less the margin) when a pod is still there,
// so the wait runs to end and then waitFor's bound for the event to arrive. A bound from the
// wait's own start alone raced the window: a test whose setup before the wait took 4.4 s under a
// cold build beside it, not the 7 s it takes on a quiet machine, gave up 0.3 s before the event
// came, written 0.95 s after its window's end (issue 52).
func waitHandled(ctx context.Context, t *testing.T, node string, end time.Time) v1.Event {
	t.Helper()
	var ev v1.Event
	what := "the " + events.ReasonInterruptionHandled + " event"
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, max(time.Until(end), 0)+waitBound, true, func(context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + node + ",reason=" + events.ReasonInterruptionHandled})
		if err != nil || len(evs.Items) == 0 {
			return false, nil
		}
		ev = evs.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s, due at the window's end %s: %v", what, end.Format("15:04:05"), err)
	}
	return ev
}

// repoRoot is the repository's root folder.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// readRepoFile reads a file of the repository, by path elements from its root.
func readRepoFile(t *testing.T, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{repoRoot(t)}, elem...)...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// createObserved creates pods on node in ns (waiting until they run) and starts watching the
// namespace; the watch stops when the test ends.
func createObserved(ctx context.Context, t testing.TB, ns, node string, taint v1.Taint, pods []scenario.Pod) *scenario.Observer {
	t.Helper()
	if err := scenario.Create(ctx, env.Client, ns, node, taint, pods); err != nil {
		t.Fatal(err)
	}
	obs, err := scenario.Observe(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(obs.Stop)
	return obs
}

// observedNode is the preamble of most tests on a node of their own: the namespace and the kwok
// node, the default interruption taint, and the pods created (tolerating that taint as each
// asks) with an observer recording their deletion.
func observedNode(ctx context.Context, t testing.TB, ns, node string, pods []scenario.Pod) (v1.Taint, *scenario.Observer) {
	t.Helper()
	setupNode(ctx, t, ns, node, nil)
	taint, err := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err != nil {
		t.Fatal(err)
	}
	return taint, createObserved(ctx, t, ns, node, taint, pods)
}

// wantCounted scrapes the agent's metrics at addr and fails the test unless the series (a name
// with its labels, as the exposition writes them) sums to more than zero.
func wantCounted(t testing.TB, addr, what, series string) {
	t.Helper()
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if sumMetric(text, series) == 0 {
		name, _, _ := strings.Cut(series, "{")
		t.Errorf("%s: %s counts nothing: %s", what, series, grep(text, name))
	}
}
