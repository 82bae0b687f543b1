package record

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/reprieve-dev/reprieve/agent/metrics"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// The write check runs at start and every WriteCheckInterval, so that a refusal that begins later
// (a policy or RBAC change, a token rotated to one without the node claim) is found before the
// next interruption, not at it: one dry-run PATCH per node every 10 minutes, a twentieth of the
// kubelet's own node status updates. While the API server refuses it, it is retried with backoff
// from writeCheckBackoff to writeCheckMaxBackoff, so that --node-write-refusals is reached within
// seconds and a fix is seen within 5 minutes.
const (
	WriteCheckInterval   = 10 * time.Minute
	writeCheckBackoff    = time.Second
	writeCheckMaxBackoff = 5 * time.Minute
)

// Refusals counts writes of the agent's own node that the API server refused, and those in a
// row. Admission refuses every node write from a token without the node claim
// (authentication.kubernetes.io/node-name): the agent would otherwise stay Ready and only log,
// and the node would be unprotected at its next interruption. A refusal is any answer that says
// the write itself is not allowed, whatever its status code (IsRefusal): RBAC's 403, a policy's
// 403 or, for an expression that fails to evaluate, 422, a webhook's denial. A timeout or an
// outage says nothing about permission and does not count.
type Refusals struct {
	limit   int
	metrics *metrics.Metrics

	mu     sync.Mutex
	inARow int
	last   error
}

// NewRefusals counts refusals into m; limit in a row make the agent not ready (0: never).
func NewRefusals(limit int, m *metrics.Metrics) *Refusals { return &Refusals{limit: limit, metrics: m} }

// IsRefusal reports whether err says the API server will not allow the write: a 4xx status other
// than those that say nothing about permission (404 gone, 408 timeout, 409 conflict, 429
// throttled). 400 covers an admission webhook's denial without a code of its own, 403 RBAC and
// the policies, 422 a policy whose expression did not evaluate (failurePolicy Fail).
func IsRefusal(err error) bool {
	var st apierrors.APIStatus
	if err == nil || !errors.As(err, &st) {
		return false
	}
	switch code := st.Status().Code; code {
	case http.StatusNotFound, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return false
	default:
		return code >= 400 && code < 500
	}
}

// Observe records the outcome of one node write: nil (it passed), a refusal (IsRefusal), or
// anything else (ignored).
func (w *Refusals) Observe(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.inARow, w.last = 0, nil
	case IsRefusal(err):
		w.inARow++
		w.last = err
		w.metrics.NodeWritesRefused.Inc()
	default:
		return
	}
	w.metrics.NodeWriteRefusalsInARow.Set(float64(w.inARow))
}

// NotReady says why the agent is not ready for its refused writes ("" while it is).
func (w *Refusals) NotReady() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.limit <= 0 || w.inARow < w.limit {
		return ""
	}
	return fmt.Sprintf("%d node writes refused in a row (the node is unprotected; see reprieve doctor): %v", w.inARow, w.last)
}

// CheckWrite asks the API server, with a server-side dry run, whether the agent may write its
// node as an interruption would: probe is the desire of an interruption (its taint, the label,
// the deadline annotation and the record), and the dry run carries the change it would make to
// the node as it is now, so that a policy that refuses only taint changes refuses the check too
// (an empty patch passed such a policy and reset the count). When the node already carries it
// all, the check is an empty patch, which still goes through RBAC and validating admission. No
// resourceVersion precondition: nothing is stored, and a stale copy must not fail the check.
// With node conditions on, it also dry-runs the status patch an interruption would send.
func (w *Writer) CheckWrite(ctx context.Context, probe NodeDesire) error {
	rctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	node := w.base()
	if node == nil {
		n, err := w.client.CoreV1().Nodes().Get(rctx, w.nodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("getting node %s for the write check: %w", w.nodeName, err)
		}
		node = n
	}
	patch := []byte("{}")
	if ch := ComputeNodeChange(node, probe); !ch.Empty() {
		b, err := mergePatch(&v1.Node{}, ch)
		if err != nil {
			return err
		}
		patch = b
	}
	_, err := w.client.CoreV1().Nodes().Patch(rctx, w.nodeName, types.MergePatchType, patch,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return fmt.Errorf("checking with a dry run that node %s may be tainted: %w", w.nodeName, err)
	}
	if !w.conditions {
		return nil
	}
	// And its conditions, through nodes/status: RBAC's patch on nodes/status and the status
	// policy, with the conditions an interruption would set.
	probe.Conditions, probe.Lifecycle = true, w.lifecycle
	patch = []byte("{}")
	if conds := ComputeConditionChange(node, probe, w.clock.Now()); len(conds) > 0 {
		b, err := conditionPatch(conds)
		if err != nil {
			return err
		}
		patch = b
	}
	_, err = w.client.CoreV1().Nodes().Patch(rctx, w.nodeName, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
	if err != nil {
		return fmt.Errorf("checking with a dry run that the conditions of node %s may be set: %w", w.nodeName, err)
	}
	return nil
}

// WatchWrites runs CheckWrite at start and every WriteCheckInterval until ctx ends, and while it
// fails, again with backoff. Each refusal counts in refusals towards --node-write-refusals; a
// check that passes clears them. probe gives the desire to check, at each check.
func (w *Writer) WatchWrites(ctx context.Context, refusals *Refusals, probe func() NodeDesire) {
	logger := klog.FromContext(ctx)
	backoff := writeCheckBackoff
	for {
		err := w.CheckWrite(ctx, probe())
		refusals.Observe(err)
		wait := WriteCheckInterval
		switch {
		case err == nil:
			backoff = writeCheckBackoff
		case IsRefusal(err):
			logger.Error(err, "The API server refuses this agent's writes to its node: it cannot taint the node at an interruption. "+
				"Check the token's node claim and RBAC with `reprieve doctor`", "retryIn", backoff)
			wait, backoff = backoff, min(2*backoff, writeCheckMaxBackoff)
		default:
			logger.Info("Checking that the node may be patched failed; retrying", "err", err.Error(), "retryIn", backoff)
			wait, backoff = backoff, min(2*backoff, writeCheckMaxBackoff)
		}
		t := w.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
