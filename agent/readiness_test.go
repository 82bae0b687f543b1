package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers/providertest"
)

// slowProvider is a provider whose first call to the metadata service is still outstanding, as
// Azure's may be for two minutes while the platform enables Scheduled Events.
type slowProvider struct {
	*providertest.Fake
	err error
}

func (p *slowProvider) Ready() error { return p.err }

// TestProviderReadiness: the agent is not Ready while its provider says it is not
// (providers.Readiness), whatever its own state, and the reason is the provider's.
func TestProviderReadiness(t *testing.T) {
	h := newHarness(t, nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	slow := &slowProvider{Fake: h.prov, err: errors.New("azure: the first Scheduled Events call is still outstanding")}
	h.build(slow)
	h.a.ready.Store(true)
	h.a.intr.PollOnce(context.Background()) // every source has answered
	if h.a.Ready() {
		t.Error("Ready while the provider's first call is outstanding")
	}
	if why := h.a.notReady(); why != slow.err.Error() {
		t.Errorf("notReady() = %q, want the provider's reason", why)
	}
	slow.err = nil
	if !h.a.Ready() {
		t.Errorf("not Ready once the provider is: %q", h.a.notReady())
	}
	h.a.ready.Store(false)
	if h.a.Ready() {
		t.Error("Ready before the agent's own caches and first poll")
	}
}

// answerTimesProvider is a provider whose sources say when each last answered
// (providers.AnswerTimes), as a watching provider does: it publishes only changes.
type answerTimesProvider struct {
	*providertest.Fake
	last map[string]time.Time
}

func (p *answerTimesProvider) Answered() map[string]bool {
	out := map[string]bool{}
	for s, t := range p.last {
		out[s] = !t.IsZero()
	}
	return out
}
func (p *answerTimesProvider) LastAnswers() map[string]time.Time { return maps.Clone(p.last) }

// TestReadyMeansItCanSee (issue 35 item 4): the agent is Ready only once every metadata source
// has answered and while each has answered within --metadata-stale-after; the reason names the
// silent sources, the metrics show each source's last answer and the count of stale ones, and
// the agent's sight check raises MetadataUnanswered once past the bound and MetadataAnswered
// once the sources answer again.
func TestReadyMeansItCanSee(t *testing.T) {
	h := newHarness(t, nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	h.a.ready.Store(true)
	// A first poll that fails (a blocked IMDS hop limit, a NetworkPolicy on 169.254.169.254).
	h.prov.SetError(errors.New("dial tcp 169.254.169.254:80: i/o timeout"))
	h.a.intr.PollOnce(context.Background())
	if h.a.Ready() {
		t.Fatal("Ready after a first poll that failed")
	}
	if why := h.a.notReady(); !strings.Contains(why, "aws (no answer since start)") {
		t.Errorf("notReady() = %q, want it to name the source that never answered", why)
	}
	h.prov.SetError(nil)
	h.a.intr.PollOnce(context.Background())
	if !h.a.Ready() {
		t.Fatalf("not Ready once the provider answered: %q", h.a.notReady())
	}
	answeredAt := h.clock.Now()
	h.prov.SetError(errors.New("metadata: 503"))
	h.clock.Step(h.a.cfg.MetadataStaleAfter)
	h.a.intr.PollOnce(context.Background())
	if !h.a.Ready() {
		t.Fatalf("not Ready with the last answer exactly --metadata-stale-after ago: %q", h.a.notReady())
	}
	h.clock.Step(time.Second)
	if h.a.Ready() {
		t.Fatal("Ready with the last answer past --metadata-stale-after")
	}
	if why := h.a.notReady(); !strings.Contains(why, "last answer 2m1s ago") {
		t.Errorf("notReady() = %q, want how long the source has been silent", why)
	}
	got := gather(t, h)
	if v := got[`reprieve_ready`]; v != 0 {
		t.Errorf("reprieve_ready = %v, want 0", v)
	}
	if v := got[`reprieve_metadata_sources_stale{provider="aws"}`]; v != 1 {
		t.Errorf("reprieve_metadata_sources_stale = %v, want 1", v)
	}
	if v := got[`reprieve_metadata_last_answer_timestamp_seconds{provider="aws",source="aws"}`]; v != float64(answeredAt.Unix()) {
		t.Errorf("reprieve_metadata_last_answer_timestamp_seconds = %v, want %d", v, answeredAt.Unix())
	}

	// A watching provider reports its sources' own times: one silent source is enough.
	now := h.clock.Now()
	p := &answerTimesProvider{Fake: h.prov, last: map[string]time.Time{"instance/preempted": now, "instance/maintenance-event": now.Add(-3 * time.Minute)}}
	h.build(p)
	h.a.ready.Store(true)
	if why := h.a.notReady(); !strings.Contains(why, "instance/maintenance-event (last answer 3m0s ago)") || strings.Contains(why, "preempted") {
		t.Errorf("notReady() = %q, want only the silent source named", why)
	}
	p.last["instance/maintenance-event"] = now
	if !h.a.Ready() {
		t.Errorf("not Ready with every source fresh: %q", h.a.notReady())
	}
}

// TestSightEvents: an agent whose provider never answers says so once, as a Warning event,
// when --metadata-stale-after has passed since start (not before), and once more when it
// answers again.
func TestSightEvents(t *testing.T) {
	h := newHarness(t, nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	ctx := context.Background()
	start := h.clock.Now()
	said := ""
	look := func() {
		said = h.a.checkSight(ctx, start, said)
		h.clock.Step(sightCheckInterval)
	}
	for h.clock.Now().Sub(start) <= h.a.cfg.MetadataStaleAfter {
		look()
	}
	noEvent(t, h)
	look()
	ev := waitEvent(t, h, "MetadataUnanswered")
	if !strings.Contains(ev, "Warning") || !strings.Contains(ev, "aws (no answer since start)") {
		t.Errorf("event %q: want a Warning naming the source", ev)
	}
	look()
	noEvent(t, h)
	h.a.intr.PollOnce(ctx)
	look()
	if ev := waitEvent(t, h, "MetadataAnswered"); !strings.Contains(ev, "Normal") {
		t.Errorf("event %q: want Normal", ev)
	}
	look()
	noEvent(t, h)
}

// noEvent checks that the harness's recorder holds no event.
func noEvent(t *testing.T, h *harness) {
	t.Helper()
	select {
	case ev := <-h.events.Events:
		t.Errorf("unexpected event %q", ev)
	default:
	}
}

// waitEvent returns the next event of the harness's recorder, which must have reason.
func waitEvent(t *testing.T, h *harness, reason string) string {
	t.Helper()
	select {
	case ev := <-h.events.Events:
		if !strings.Contains(ev, reason) {
			t.Fatalf("event %q, want %s", ev, reason)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s event", reason)
	}
	return ""
}

// gather reads the agent's registry as "name{labels}" -> value.
func gather(t *testing.T, h *harness) map[string]float64 {
	t.Helper()
	mfs, err := h.a.gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
