package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// requireTool returns the path of a tool that `make promtool` installs, skipping the test when it
// is missing unless the end-to-end suite is required (CI).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatalf("%s is missing: run `make promtool`", name)
		}
		t.Skipf("%s is missing: run `make promtool`", name)
	}
	return p
}

// TestPrometheusAlerts scrapes reprieve with a real Prometheus that loads the shipped alert
// rules, through an interruption: the imminent-interruption alert fires, the missed-deadline
// alert does not, and `promtool check metrics` accepts the agent's exposition.
func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	promtool := requireTool(t, "promtool")
	requireTool(t, "prometheus")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "prom", "prom-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}); err != nil {
		t.Fatal(err)
	}
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	prom, err := testenv.StartPrometheus(ctx, logDir, addr, node, filepath.Join(root, "deploy", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = prom.Stop() }()
	waitQuery(ctx, t, prom, `up{job="reprieve"} == 1`, "the first scrape")

	// promtool check metrics on a real scrape.
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	deadline := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	// The rule holds for 1m before it fires (one short notice does not page), longer than this
	// 20 s window: on the real scrape it goes pending; its firing after 1m is promtool's
	// (deploy/prometheus/tests/interruption.yaml).
	waitQuery(ctx, t, prom, `ALERTS{alertname="ReprieveInterruptionImminent",alertstate="pending",node="`+node+`"}`, "the interruption alert, pending")

	// After the window's end the agent has summarised the interruption: nothing missed.
	waitHandled(ctx, t, node, deadline.Add(-config.DefaultConfig().SafetyMargin))
	waitQuery(ctx, t, prom, `reprieve_evictions_missed_deadline_total{node="`+node+`"} == 0 and on() (time() - timestamp(reprieve_evictions_missed_deadline_total{node="`+node+`"})) < 5`, "a fresh scrape after the window")
	if v, err := prom.Query(ctx, `max_over_time(ALERTS{alertname="ReprieveEvictionMissedDeadline"}[5m])`); err != nil || len(v) != 0 {
		t.Errorf("missed-deadline alert: %v %v, want never pending or firing", v, err)
	}
	if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err == nil && p.Status.Phase != v1.PodSucceeded {
		t.Errorf("evictee still present after the window")
	}
}

func waitQuery(ctx context.Context, t *testing.T, prom *testenv.Prometheus, q, what string) {
	t.Helper()
	waitFor(ctx, t, what+" ("+q+")", func() bool {
		v, err := prom.Query(ctx, q)
		return err == nil && len(v) > 0
	})
}
