package events

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/reprieve-dev/reprieve/providers"
)

// TestNoticeReasonsDistinct: each notice kind has its own reason, none the fallback.
func TestNoticeReasonsDistinct(t *testing.T) {
	seen := map[string]providers.Kind{}
	for _, k := range providers.Kinds {
		r := NoticeReason(k)
		if r == ReasonNoticeReceived {
			t.Errorf("kind %s falls back to %s", k, r)
		}
		if other, dup := seen[r]; dup {
			t.Errorf("kinds %s and %s share reason %s", k, other, r)
		}
		seen[r] = k
	}
	if NoticeReason("future-kind") != ReasonNoticeReceived {
		t.Error("an unknown kind does not fall back")
	}
}

// TestSpamKeyHasTheReason: two reasons on one object are throttled apart.
func TestSpamKeyHasTheReason(t *testing.T) {
	a := &v1.Event{Reason: ReasonEvictionScheduled, InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "p"}}
	b := a.DeepCopy()
	b.Reason = ReasonInterruptionHandled
	if spamKey(a) == spamKey(b) {
		t.Error("the spam key ignores the reason")
	}
}

// TestDeliveryWaitsForTheQueue: Wait returns once every recorded event was written, and, when
// the broadcaster has dropped some (spam), once it has been idle, not only at the timeout.
func TestDeliveryWaitsForTheQueue(t *testing.T) {
	var d Delivery
	rec := d.Recorder(record.NewFakeRecorder(10))
	sink := d.Sink(nopSink{})
	rec.Eventf(&v1.Pod{}, v1.EventTypeWarning, ReasonMissedDeadline, "x")
	written := make(chan struct{})
	go func() { _, _ = sink.Create(&v1.Event{}); close(written) }()
	if !d.Wait(5 * time.Second) {
		t.Fatal("Wait timed out with every event written")
	}
	<-written
	rec.Eventf(&v1.Pod{}, v1.EventTypeWarning, ReasonMissedDeadline, "dropped as spam, never written")
	start := time.Now()
	if !d.Wait(5 * time.Second) {
		t.Fatal("Wait ran into its timeout with an idle broadcaster")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("Wait took %v with nothing in flight", time.Since(start))
	}
}

type nopSink struct{}

func (nopSink) Create(e *v1.Event) (*v1.Event, error)          { return e, nil }
func (nopSink) Update(e *v1.Event) (*v1.Event, error)          { return e, nil }
func (nopSink) Patch(e *v1.Event, _ []byte) (*v1.Event, error) { return e, nil }
