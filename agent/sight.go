package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/interrupt"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/providers/none"
)

// sightCheckInterval is how often the agent looks whether it still sees the cloud, for the
// MetadataUnanswered and MetadataAnswered events (readiness and the metrics compute it when
// asked).
const sightCheckInterval = 10 * time.Second

// blind says which metadata sources have not given a good answer within
// --metadata-stale-after at now, as interrupt.Stale does; none with --provider none, whose
// input is the node's own annotation.
func (a *Agent) blind(now time.Time) []string {
	if a.provider.Name() == none.Name {
		return nil
	}
	return interrupt.Stale(a.intr.LastAnswers(), now, a.cfg.MetadataStaleAfter)
}

// watchSight reports, as node events and in the log, when the agent stops seeing the cloud and
// when it sees it again. A source that has not answered since start counts from start, so that
// an agent that never sees (a blocked IMDS hop limit, a NetworkPolicy on 169.254.169.254, the
// wrong provider) says so once --metadata-stale-after has passed.
func (a *Agent) watchSight(ctx context.Context, start time.Time) {
	if a.provider.Name() == none.Name {
		return
	}
	ticker := a.clock.NewTicker(sightCheckInterval)
	defer ticker.Stop()
	said := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		said = a.checkSight(ctx, start, said)
	}
}

// checkSight is one look of watchSight: said is what the last look found stale ("" when
// nothing); it returns what this one finds, having raised an event if that changed between
// nothing and something.
func (a *Agent) checkSight(ctx context.Context, start time.Time, said string) string {
	now := a.clock.Now()
	last := a.intr.LastAnswers()
	if now.Sub(start) <= a.cfg.MetadataStaleAfter {
		// Not yet: a source that has not answered since start has had less than the bound.
		for src, t := range last {
			if t.IsZero() {
				last[src] = start
			}
		}
	}
	stale := strings.Join(interrupt.Stale(last, now, a.cfg.MetadataStaleAfter), ", ")
	switch {
	case stale != "" && said == "":
		msg := fmt.Sprintf("Cannot see the cloud's notices: no good answer within %s from %s (provider %s). Interruptions on this node go unhandled; see reprieve doctor and docs/operations.md",
			a.cfg.MetadataStaleAfter, stale, a.provider.Name())
		klog.FromContext(ctx).Error(nil, "Metadata sources unanswered; the agent is not Ready", "provider", a.provider.Name(), "sources", stale,
			"bound", a.cfg.MetadataStaleAfter)
		a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeWarning, events.ReasonMetadataUnanswered, "%s", msg)
	case stale == "" && said != "":
		klog.FromContext(ctx).Info("Every metadata source answers again", "provider", a.provider.Name())
		a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeNormal, events.ReasonMetadataAnswered,
			"Every metadata source of provider %s answers again", a.provider.Name())
	}
	return stale
}

// newSightCollector is the agent's metrics.Sight.
func newSightCollector(a *Agent) *metrics.Sight {
	s := metrics.Sight{Provider: a.provider.Name(), Ready: a.Ready}
	if a.provider.Name() != none.Name {
		s.LastAnswers = func() map[string]time.Time { return a.intr.LastAnswers() }
		s.Stale = func() int { return len(a.blind(a.clock.Now())) }
	}
	return metrics.NewSight(s)
}
