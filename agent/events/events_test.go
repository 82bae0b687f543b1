package events

import (
	"testing"

	v1 "k8s.io/api/core/v1"

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
