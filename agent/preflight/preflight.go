// Package preflight checks the eviction path before an interruption needs it: a server-side
// dry-run eviction, as the agent's evictions go, through RBAC, the admission policies and the
// eviction guard. The agent runs it as a loop (Check); `reprieve doctor` posts the same dry run
// (DryRunEvict) and reads its answer the same way (Verdict).
package preflight

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// The eviction check: a server-side dry-run eviction of the agent's own pod, at start and every
// record.WriteCheckInterval, and with backoff from evictionCheckBackoff to
// evictionCheckMaxBackoff while it does not pass. It goes through what the agent's evictions go
// through (RBAC's create on pods/eviction, the admission policies, the eviction guard's webhook),
// so that an eviction guard that is down, or a role without the eviction, is seen before the next
// interruption rather than at it. It says so in /readyz's detail and in
// reprieve_evictions_check_status; it does not make the agent not Ready: with the guard down the
// agent still protects the node (each pod is deleted at its last safe moment, docs/eviction-guard.md),
// and failing the readiness of every agent of the fleet for one Deployment's outage would stop
// their rollouts and page once per node.
const (
	evictionCheckBackoff    = time.Second
	evictionCheckMaxBackoff = 5 * time.Minute
)

// The check's statuses (the metric's status label).
const (
	StatusUnknown          = "unknown"
	StatusOK               = "ok"
	StatusGuardUnreachable = "guard_unreachable"
	StatusRefused          = "refused"
)

var statuses = []string{StatusUnknown, StatusOK, StatusGuardUnreachable, StatusRefused}

// Check keeps the last verdict on the eviction path.
type Check struct {
	client kube.Interface
	// uid gives the agent's own pod's UID (the node's pod cache); the shipped policy admits
	// only evictions with a UID precondition, as the agent's are.
	uid            func() (types.UID, error)
	clock          clock.Clock
	pod, namespace string
	gauge          *prometheus.GaugeVec

	mu     sync.Mutex
	status string
	since  time.Time
	last   error
}

// New is the check of the eviction path with the agent's own pod (namespace/pod, its UID from
// uid), exported in gauge by status.
func New(client kube.Interface, clk clock.Clock, pod, namespace string, uid func() (types.UID, error), gauge *prometheus.GaugeVec) *Check {
	c := &Check{client: client, clock: clk, pod: pod, namespace: namespace, uid: uid, gauge: gauge, status: StatusUnknown, since: clk.Now()}
	c.export()
	return c
}

// try posts the dry-run eviction as the agent's evictions go: a grace and the UID precondition.
func (c *Check) try(ctx context.Context) error {
	if c.pod == "" || c.namespace == "" {
		return errNoOwnPod
	}
	uid, err := c.uid()
	if err != nil {
		return fmt.Errorf("finding the agent's own pod %s/%s for the eviction check: %w", c.namespace, c.pod, err)
	}
	rctx, cancel := context.WithTimeout(ctx, record.WriteTimeout)
	defer cancel()
	if err := DryRunEvict(rctx, c.client, c.namespace, c.pod, uid); err != nil {
		return fmt.Errorf("evicting the agent's own pod %s/%s (server-side dry run): %w", c.namespace, c.pod, err)
	}
	return nil
}

// DryRunEvict posts a server-side dry-run eviction of the pod namespace/name as the agent's
// evictions go: a grace and the UID precondition, which the shipped admission policy requires.
func DryRunEvict(ctx context.Context, client kube.Interface, namespace, name string, uid types.UID) error {
	grace := int64(30)
	return client.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid},
			DryRun: []string{metav1.DryRunAll}},
	})
}

var errNoOwnPod = errors.New("no --pod-name and --pod-namespace ($POD_NAME, $POD_NAMESPACE) to try a dry-run eviction of")

// BudgetRefuses says whether err is a PodDisruptionBudget's refusal of the eviction: the
// eviction path itself answered.
func BudgetRefuses(err error) bool {
	return (apierrors.IsTooManyRequests(err) || apierrors.IsForbidden(err)) && apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause)
}

// Verdict sorts the check's answer: the status it gives, and whether it is one (a time-out or a
// server error other than the guard's says nothing about the path and keeps the last status).
func Verdict(err error) (string, bool) {
	switch {
	case err == nil:
		return StatusOK, true
	case BudgetRefuses(err):
		// A budget refuses the agent's own pod now: the path itself answered.
		return StatusOK, true
	case guard.Unreachable(err):
		return StatusGuardUnreachable, true
	case errors.Is(err, errNoOwnPod) || apierrors.IsNotFound(err):
		// No pod of its own to try (or the name is wrong): the path cannot be told.
		return StatusUnknown, true
	case record.IsRefusal(err):
		return StatusRefused, true
	}
	return "", false
}

// observe records the answer err and says whether to check again soon: while the path fails,
// or the check got no answer about it.
func (c *Check) observe(ctx context.Context, err error) (again bool) {
	status, ok := Verdict(err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		klog.FromContext(ctx).Info("Checking the eviction path failed; retrying", "err", err.Error())
		return true
	}
	if status != c.status {
		c.since = c.clock.Now()
		switch status {
		case StatusOK:
			klog.FromContext(ctx).Info("The eviction path passes a dry-run eviction", "was", c.status)
		case StatusUnknown:
			klog.FromContext(ctx).Info("The eviction path cannot be checked", "err", err.Error())
		default:
			klog.FromContext(ctx).Error(err, "The agent's evictions would fail: at an interruption each pod is deleted at its last safe moment, past its PodDisruptionBudget. Check with `reprieve doctor`", "status", status)
		}
	}
	c.status, c.last = status, err
	c.export()
	return status == StatusGuardUnreachable || status == StatusRefused
}

func (c *Check) export() {
	for _, s := range statuses {
		v := 0.0
		if s == c.status {
			v = 1
		}
		c.gauge.WithLabelValues(s).Set(v)
	}
}

// Detail is the check's line in /readyz ("" while the path passes).
func (c *Check) Detail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	since := c.since.UTC().Format(time.RFC3339)
	switch c.status {
	case StatusOK:
		return ""
	case StatusGuardUnreachable:
		return fmt.Sprintf("the eviction guard is unreachable since %s (evictions fall back to a DELETE at each pod's last safe moment, past budgets): %v", since, c.last)
	case StatusRefused:
		return fmt.Sprintf("evictions are refused since %s (evictions fall back to a DELETE at each pod's last safe moment, past budgets): %v", since, c.last)
	}
	if c.last == nil {
		return "the eviction path is unknown: not checked yet"
	}
	return fmt.Sprintf("the eviction path is unknown: %v", c.last)
}

// Run checks at once, then every record.WriteCheckInterval, and with backoff while the check
// does not pass, until ctx ends.
func (c *Check) Run(ctx context.Context) {
	backoff := evictionCheckBackoff
	for {
		wait := record.WriteCheckInterval
		if c.observe(ctx, c.try(ctx)) {
			wait, backoff = backoff, min(2*backoff, evictionCheckMaxBackoff)
		} else {
			backoff = evictionCheckBackoff
		}
		t := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
