package azure

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
)

var _ providers.Readiness = (*Provider)(nil)

// canceled is the context of a poll whose few seconds are over.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func waitRequests(t *testing.T, s *scripted, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return s.count(http.MethodGet, eventsPath) >= n, nil
	}); err != nil {
		t.Fatalf("%d requests for scheduled events, want %d", s.count(http.MethodGet, eventsPath), n)
	}
}

func withTimers(clk *clocktesting.FakeClock) func(*Options) {
	return func(o *Options) { o.Timers = clk }
}

// TestFirstCallOutlivesPoll: Azure may hold the first call for up to two minutes while it
// enables Scheduled Events. A poll's short context must not abort it (the old code did, at
// every poll, and a Preempt in those minutes was missed): the request goes on, polls meanwhile
// report no error and ask nothing more, the provider is not ready, and the answer is used.
func TestFirstCallOutlivesPoll(t *testing.T) {
	s := newScripted(t)
	gate := make(chan struct{})
	s.script(eventsPath, reply{gate: gate, body: "@preempt_this_instance.json"}, reply{body: "@preempt_this_instance.json"})
	timers := clocktesting.NewFakeClock(t0)
	p, _ := newProvider(t, s.srv.URL, withTimers(timers))

	if err := p.Ready(); err == nil || !strings.Contains(err.Error(), "not answered yet") {
		t.Errorf("Ready before any poll = %v, want not ready", err)
	}
	for i := range 3 {
		got, err := p.Poll(canceled())
		if err != nil || got != nil {
			t.Fatalf("poll %d while the first call is outstanding: got %q, %v; want nothing and no error", i, summaries(got), err)
		}
		waitRequests(t, s, 1)
		if err := p.Ready(); err == nil || !strings.Contains(err.Error(), "first answer of Azure Scheduled Events") {
			t.Errorf("Ready while outstanding = %v, want the reason", err)
		}
	}
	if n := s.count(http.MethodGet, eventsPath); n != 1 {
		t.Errorf("%d requests while the first call was outstanding, want 1", n)
	}
	close(gate)
	got, err := p.Poll(context.Background())
	checkErr(t, err, "")
	checkNotices(t, got, "preemption Preempt "+idPreempt+" deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z")
	if n := s.count(http.MethodGet, eventsPath); n != 1 {
		t.Errorf("%d requests, want the first call's answer used", n)
	}
	if err := p.Ready(); err != nil {
		t.Errorf("Ready after the answer = %v", err)
	}
	// From now on a poll's context bounds each request.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := p.Poll(ctx); err != nil {
		t.Errorf("second poll: %v", err)
	}
	if n := s.count(http.MethodGet, eventsPath); n != 2 {
		t.Errorf("%d requests after a second poll, want 2", n)
	}
}

// TestFirstCallTimeout: the first call is bounded by FirstCallTimeout, not forever; the poll
// after reports the failure, and the next one starts another first call.
func TestFirstCallTimeout(t *testing.T) {
	s := newScripted(t)
	s.script(eventsPath, reply{hang: true}, reply{body: "@preempt_this_instance.json"})
	timers := clocktesting.NewFakeClock(t0)
	p, _ := newProvider(t, s.srv.URL, withTimers(timers))
	if _, err := p.Poll(canceled()); err != nil {
		t.Fatalf("first poll: %v", err)
	}
	waitRequests(t, s, 1)
	timers.Step(DefaultFirstCallTimeout - time.Second)
	if _, err := p.Poll(canceled()); err != nil {
		t.Fatalf("poll before the bound: %v", err)
	}
	timers.Step(time.Second)
	_, err := p.Poll(context.Background())
	checkErr(t, err, "reading scheduled events (first call): no answer within 2m10s")
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap the context's", err)
	}
	got, err := p.Poll(context.Background())
	checkErr(t, err, "")
	if len(got) != 1 {
		t.Errorf("after a new first call: got %q, want the preemption", summaries(got))
	}
}

// TestNotFoundMakesNextCallFirst: a 404 or 503 after the service answered means it is being
// enabled again: the next request gets the long bound too.
func TestNotFoundMakesNextCallFirst(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			s := newScripted(t)
			s.events("@preempt_this_instance.json")
			p, _ := newProvider(t, s.srv.URL, withTimers(clocktesting.NewFakeClock(t0)))
			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			gate := make(chan struct{})
			s.script(eventsPath, reply{status: status}, reply{gate: gate, body: "@preempt_this_instance.json"})
			if _, err := p.Poll(context.Background()); err == nil {
				t.Fatalf("HTTP %d: no error", status)
			}
			if err := p.Ready(); err == nil {
				t.Errorf("Ready after HTTP %d = nil, want not ready", status)
			}
			got, err := p.Poll(canceled())
			if err != nil || len(got) != 1 {
				t.Fatalf("poll during the new first call: got %q, %v; want the last notices and no error", summaries(got), err)
			}
			waitRequests(t, s, 3)
			close(gate)
			if _, err := p.Poll(context.Background()); err != nil {
				t.Errorf("after the answer: %v", err)
			}
			if err := p.Ready(); err != nil {
				t.Errorf("Ready after the answer = %v", err)
			}
		})
	}
}
