package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reprieve-dev/reprieve/agent/metrics"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// The write check runs at start and every writeCheckInterval, so that a refusal that begins later
// (a policy or RBAC change, a token rotated to one without the node claim) is found before the
// next interruption, not at it: one dry-run PATCH per node every 10 minutes, a twentieth of the
// kubelet's own node status updates. While the API server refuses it, it is retried with backoff
// from writeCheckBackoff to writeCheckMaxBackoff, so that --node-write-refusals is reached within
// seconds and a fix is seen within 5 minutes.
const (
	writeCheckInterval   = 10 * time.Minute
	writeCheckBackoff    = time.Second
	writeCheckMaxBackoff = 5 * time.Minute
)

// writeRefusals counts writes of the agent's own node that the API server refused (403), and
// those in a row. Admission refuses every node write from a token without the node claim
// (authentication.kubernetes.io/node-name): the agent would otherwise stay Ready and only log,
// and the node would be unprotected at its next interruption. A refusal counts only a 403, not a
// timeout or an outage, which say nothing about permission.
type writeRefusals struct {
	limit   int
	metrics *metrics.Metrics

	mu     sync.Mutex
	inARow int
	last   error
}

// observe records the outcome of one node write: nil (it passed), a 403 (refused), or anything
// else (ignored).
func (w *writeRefusals) observe(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.inARow, w.last = 0, nil
	case apierrors.IsForbidden(err):
		w.inARow++
		w.last = err
		w.metrics.NodeWritesRefused.Inc()
	default:
		return
	}
	w.metrics.NodeWriteRefusalsInARow.Set(float64(w.inARow))
}

// notReady says why the agent is not ready for its refused writes ("" while it is).
func (w *writeRefusals) notReady() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.limit <= 0 || w.inARow < w.limit {
		return ""
	}
	return fmt.Sprintf("%d node writes refused in a row (the node is unprotected; see reprieve doctor): %v", w.inARow, w.last)
}

// checkNodeWrite asks the API server, with a server-side dry run, whether the agent may write
// its node: the same RBAC check and admission (the node-bound policy) as a real patch, and no
// change. An empty merge patch is enough: the API server authorizes the PATCH and runs
// validating admission on the resulting update, unchanged or not, before it would store it.
func (a *Agent) checkNodeWrite(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := a.client.CoreV1().Nodes().Patch(rctx, a.cfg.NodeName, types.MergePatchType, []byte("{}"),
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return fmt.Errorf("checking with a dry run that node %s may be patched: %w", a.cfg.NodeName, err)
	}
	return nil
}

// watchNodeWrite runs checkNodeWrite at start and every writeCheckInterval until ctx ends, and
// while it fails, again with backoff. Each refusal counts towards --node-write-refusals; a check
// that passes clears them.
func (a *Agent) watchNodeWrite(ctx context.Context) {
	logger := klog.FromContext(ctx)
	backoff := writeCheckBackoff
	for {
		err := a.checkNodeWrite(ctx)
		a.refusals.observe(err)
		wait := writeCheckInterval
		switch {
		case err == nil:
			backoff = writeCheckBackoff
		case apierrors.IsForbidden(err):
			logger.Error(err, "The API server refuses this agent's writes to its node: it cannot taint the node at an interruption. "+
				"Check the token's node claim and RBAC with `reprieve doctor`", "retryIn", backoff)
			wait, backoff = backoff, min(2*backoff, writeCheckMaxBackoff)
		default:
			logger.Info("Checking that the node may be patched failed; retrying", "err", err.Error(), "retryIn", backoff)
			wait, backoff = backoff, min(2*backoff, writeCheckMaxBackoff)
		}
		t := a.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
