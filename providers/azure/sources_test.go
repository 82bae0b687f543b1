package azure

import (
	"context"
	"net/http"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
)

var _ providers.SourceReporter = (*Provider)(nil)

func wantAnswered(t *testing.T, p *Provider, step string, want bool) {
	t.Helper()
	got := p.Answered()
	if len(got) != 1 || got[SourceScheduledEvents] != want {
		t.Errorf("%s: Answered() = %v, want {%s: %v}", step, got, SourceScheduledEvents, want)
	}
}

// TestAnsweredFirstCall is issue 20's case 2 against the fake Scheduled Events server, which
// holds the first call as Azure does while it enables the service ("expect a delayed response
// in your first call of up to two minutes"): while that call is outstanding Poll keeps its
// contract (what it knows, no error) and Answered says the source is unknown, so that an agent
// restarted mid-window does not read "nothing" as "no notice".
func TestAnsweredFirstCall(t *testing.T) {
	fake := azureevents.New(self)
	fake.SetFirstAnswerDelay(500 * time.Millisecond)
	endpoint, err := fake.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	preempt := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{self},
		NotBefore: t0.Add(30 * time.Second), DurationInSeconds: -1})
	p, _ := newProvider(t, endpoint)
	wantAnswered(t, p, "before any poll", false)

	ns, err := p.Poll(canceled())
	if ns != nil || err != nil {
		t.Fatalf("poll while the first call is outstanding: got %q, %v; want nothing and no error", summaries(ns), err)
	}
	wantAnswered(t, p, "first call outstanding", false)
	if p.Ready() == nil {
		t.Error("Ready while the first call is outstanding: nil")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err = p.Poll(ctx) // waits for the first answer
	checkErr(t, err, "")
	checkNotices(t, ns, "preemption Preempt "+preempt+" deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z")
	if ns[0].Source != SourceScheduledEvents || ns[0].FromFirstSeen {
		t.Errorf("notice Source %q, FromFirstSeen %v; want %q and the document's deadline", ns[0].Source, ns[0].FromFirstSeen, SourceScheduledEvents)
	}
	wantAnswered(t, p, "after the first answer", true)
	if c := fake.Counts(); c.BadRequests > 0 {
		t.Errorf("the fake refused a request: %s", c.LastRejected)
	}
}

// TestAnsweredFailures: 404, 503 (Azure enabling the service again), other statuses, a body
// that is no document, a first call that times out, and a compute.name that cannot be read
// are no answer. Once a document was read, a later failure does not take the answer back.
func TestAnsweredFailures(t *testing.T) {
	tests := []struct {
		name    string
		events  []reply
		compute *reply
		timeout bool // step the timers past FirstCallTimeout
	}{
		{name: "404", events: []reply{{status: http.StatusNotFound}}},
		{name: "503", events: []reply{{status: http.StatusServiceUnavailable}}},
		{name: "500", events: []reply{{status: http.StatusInternalServerError}}},
		{name: "HTML from a proxy", events: []reply{{body: "@html_error.html"}}},
		{name: "no DocumentIncarnation", events: []reply{{body: "@no_incarnation.json"}}},
		{name: "first call times out", events: []reply{{hang: true}}, timeout: true},
		{name: "compute.name unreadable", events: []reply{{body: "@preempt_this_instance.json"}}, compute: &reply{status: http.StatusInternalServerError}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t)
			s.script(eventsPath, append(tc.events, reply{body: "@preempt_this_instance.json"})...)
			mod := []func(*Options){}
			if tc.compute != nil {
				s.script(computePath, *tc.compute, reply{body: "@compute_vmss_uniform.json"})
				mod = append(mod, func(o *Options) { o.ResourceName = "" })
			}
			timers := clocktesting.NewFakeClock(t0)
			p, _ := newProvider(t, s.srv.URL, append(mod, withTimers(timers))...)
			if tc.timeout {
				if _, err := p.Poll(canceled()); err != nil {
					t.Fatal(err)
				}
				waitRequests(t, s, 1)
				wantAnswered(t, p, "first call outstanding", false)
				timers.Step(DefaultFirstCallTimeout)
			}
			if _, err := p.Poll(context.Background()); err == nil {
				t.Fatal("no error")
			}
			wantAnswered(t, p, tc.name, false)

			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatalf("the document: %v", err)
			}
			wantAnswered(t, p, "after a document", true)

			s.script(eventsPath, reply{status: http.StatusServiceUnavailable})
			if _, err := p.Poll(context.Background()); err == nil {
				t.Fatal("503 after the document: no error")
			}
			wantAnswered(t, p, "503 after a document", true)
		})
	}
}
