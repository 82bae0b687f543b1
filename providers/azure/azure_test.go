package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// self is this machine's resource name in the testdata.
const self = "aks-spotpool-38290525-vmss_3"

// Event IDs of the testdata.
const (
	idPreempt   = "9A5C2E1B-4F0D-4C1E-8D7A-3B6E2F1A0C94"
	idFreeze    = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
	idReboot    = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
	idStarted   = "F020BA2E-3BC0-4C40-A10B-86575A9EABD5"
	idTerminate = "602D9444-D2CD-49C7-8624-8643E7171297"
	idRedeploy  = "0B3F7C52-1D2E-4A61-9F80-7E5D4C3B2A10"
)

// summary renders what a test cares about on one line, so that tables stay readable.
func summary(n providers.Notice) string {
	return fmt.Sprintf("%s %s %s deadline=%s noticed=%s", n.Kind, n.Action, n.ID, rfc3339(n.Deadline), rfc3339(n.NoticeTime))
}

func summaries(ns []providers.Notice) []string {
	out := []string{}
	for _, n := range ns {
		out = append(out, summary(n))
	}
	return out
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("got no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func checkNotices(t *testing.T, got []providers.Notice, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if s := summaries(got); !slices.Equal(s, want) {
		t.Fatalf("notices:\n got %q\nwant %q", s, want)
	}
	for _, n := range got {
		if n.Provider != Name || n.ID == "" || n.NoticeTime.IsZero() {
			t.Errorf("notice %+v: want provider %q, an ID and a notice time", n, Name)
		}
	}
}

// newProvider returns a provider for endpoint with this machine's name and a fake clock at t0.
func newProvider(t *testing.T, endpoint string, mod ...func(*Options)) (*Provider, *clocktesting.FakePassiveClock) {
	t.Helper()
	clk := clocktesting.NewFakePassiveClock(t0)
	opts := Options{Endpoint: endpoint, ResourceName: self, Clock: clk}
	for _, m := range mod {
		m(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p, clk
}

func freezeInterrupts(o *Options) { o.FreezeInterrupts = true }

func TestParseDocument(t *testing.T) {
	tests := []struct {
		name      string
		body      string // a testdata file when it starts with "@"
		wantInc   int
		wantTypes []string
		wantErr   string
	}{
		{name: "preempt", body: "@preempt_this_instance.json", wantInc: 5, wantTypes: []string{"Preempt"}},
		{name: "several", body: "@several.json", wantInc: 14, wantTypes: []string{"Redeploy", "Reboot", "Freeze", "Preempt"}},
		{name: "Microsoft's example, scheduled", body: "@docs_example_scheduled.json", wantInc: 2, wantTypes: []string{"Freeze"}},
		{name: "Microsoft's example, empty", body: "@docs_example_empty.json", wantInc: 4, wantTypes: []string{}},
		{name: "compact empty", body: "@empty_compact.json", wantInc: 1, wantTypes: []string{}},
		{name: "quoted integers", body: "@quoted_integers.json", wantInc: 7, wantTypes: []string{"Preempt"}},
		{name: "Events null", body: `{"DocumentIncarnation": 3, "Events": null}`, wantInc: 3, wantTypes: []string{}},
		{name: "truncated", body: "@truncated.json", wantErr: `decoding scheduled events "{\n    \"DocumentIncarnation\": 5`},
		{name: "no Events", body: "@no_events.json", wantErr: "no Events"},
		{name: "no DocumentIncarnation", body: "@no_incarnation.json", wantErr: "no DocumentIncarnation"},
		{name: "null", body: "@null.json", wantErr: "no DocumentIncarnation and no Events"},
		{name: "IMDS error object", body: "@error_missing_header.json", wantErr: "Required metadata header not specified"},
		{name: "array", body: "@array.json", wantErr: "decoding scheduled events"},
		{name: "HTML", body: "@html_error.html", wantErr: "decoding scheduled events"},
		{name: "empty body", body: "", wantErr: "decoding scheduled events"},
		{name: "fractional incarnation", body: `{"DocumentIncarnation": 1.5, "Events": []}`, wantErr: "want an integer"},
		{name: "Events not a list", body: `{"DocumentIncarnation": 1, "Events": {}}`, wantErr: "Events"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := ParseDocument([]byte(body(t, tc.body)))
			checkErr(t, err, tc.wantErr)
			if err != nil {
				return
			}
			if doc.DocumentIncarnation != tc.wantInc {
				t.Errorf("DocumentIncarnation = %d, want %d", doc.DocumentIncarnation, tc.wantInc)
			}
			types := []string{}
			for _, ev := range doc.Events {
				types = append(types, ev.EventType)
			}
			if !slices.Equal(types, tc.wantTypes) {
				t.Errorf("event types %q, want %q", types, tc.wantTypes)
			}
		})
	}

	t.Run("every field", func(t *testing.T) {
		doc, err := ParseDocument([]byte(body(t, "@freeze_scale_set.json")))
		if err != nil {
			t.Fatal(err)
		}
		want := Event{
			EventId: idFreeze, EventType: "Freeze", ResourceType: "VirtualMachine",
			Resources:   []string{"aks-spotpool-38290525-vmss_0", "aks-spotpool-38290525-vmss_1", "AKS-SPOTPOOL-38290525-VMSS_3", "aks-spotpool-38290525-vmss_4"},
			EventStatus: "Scheduled", NotBefore: "Sun, 29 Nov 2026 10:15:00 GMT",
			Description: "Host server is undergoing maintenance.", EventSource: "Platform", DurationInSeconds: 9,
		}
		if len(doc.Events) != 1 || fmt.Sprint(doc.Events[0]) != fmt.Sprint(want) {
			t.Errorf("got %+v, want %+v", doc.Events, want)
		}
	})

	t.Run("the exported types encode as Azure spells the keys", func(t *testing.T) {
		b, err := json.Marshal(ScheduledEventsDocument{DocumentIncarnation: 1, Events: []Event{{EventId: "x"}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{`"DocumentIncarnation"`, `"Events"`, `"EventId"`, `"EventType"`, `"ResourceType"`, `"Resources"`,
			`"EventStatus"`, `"NotBefore"`, `"Description"`, `"EventSource"`, `"DurationInSeconds"`} {
			if !strings.Contains(string(b), key) {
				t.Errorf("%s lacks %s", b, key)
			}
		}
	})
}

// TestPollMapping polls one recorded document and checks the notices made of it.
func TestPollMapping(t *testing.T) {
	noticed := rfc3339(t0)
	tests := []struct {
		name     string
		body     string
		resource string // default self
		freeze   bool
		want     []string
		wantErr  string
	}{
		{name: "Preempt for this instance", body: "@preempt_this_instance.json",
			want: []string{"preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=" + noticed}},
		{name: "resource name in another case", body: "@preempt_this_instance.json", resource: strings.ToUpper(self),
			want: []string{"preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=" + noticed}},
		{name: "Freeze for the scale set is soft by default", body: "@freeze_scale_set.json",
			want: []string{"scheduled-maintenance Freeze " + idFreeze + " deadline=- noticed=" + noticed}},
		{name: "Freeze with FreezeInterrupts", body: "@freeze_scale_set.json", freeze: true,
			want: []string{"scheduled-maintenance Freeze " + idFreeze + " deadline=2026-11-29T10:15:00Z noticed=" + noticed}},
		{name: "Reboot of another machine only", body: "@reboot_other_machine.json", want: []string{}},
		{name: "Reboot of another machine, asked as that machine", body: "@reboot_other_machine.json", resource: "aks-spotpool-38290525-vmss_1",
			want: []string{"scheduled-maintenance Reboot " + idReboot + " deadline=2026-11-29T10:15:00Z noticed=" + noticed}},
		{name: "Started with empty NotBefore: deadline now", body: "@started_empty_notbefore.json",
			want: []string{"scheduled-maintenance Reboot " + idStarted + " deadline=" + noticed + " noticed=" + noticed}},
		{name: "Terminate", body: "@terminate.json",
			want: []string{"termination Terminate " + idTerminate + " deadline=2026-11-29T10:10:00Z noticed=" + noticed}},
		{name: "several, sorted by deadline, soft last", body: "@several.json", want: []string{
			"preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=" + noticed,
			"scheduled-maintenance Redeploy " + idRedeploy + " deadline=2026-12-03T09:00:00Z noticed=" + noticed,
			"scheduled-maintenance Freeze " + idFreeze + " deadline=- noticed=" + noticed,
		}},
		{name: "several with FreezeInterrupts", body: "@several.json", freeze: true, want: []string{
			"preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=" + noticed,
			"scheduled-maintenance Freeze " + idFreeze + " deadline=2026-11-29T10:20:00Z noticed=" + noticed,
			"scheduled-maintenance Redeploy " + idRedeploy + " deadline=2026-12-03T09:00:00Z noticed=" + noticed,
		}},
		{name: "Microsoft's example, with its wrong weekday", body: "@docs_example_scheduled.json", resource: "WestNO_1", freeze: true,
			want: []string{"scheduled-maintenance Freeze " + idFreeze + " deadline=2026-04-11T22:26:58Z noticed=" + noticed}},
		{name: "Microsoft's example, started", body: "@docs_example_started.json", resource: "westno_0", freeze: true,
			want: []string{"scheduled-maintenance Freeze " + idFreeze + " deadline=" + noticed + " noticed=" + noticed}},
		{name: "Microsoft's example, empty", body: "@docs_example_empty.json", want: []string{}},
		{name: "quoted integers", body: "@quoted_integers.json",
			want: []string{"preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=" + noticed}},
		{name: "unknown type: the others plus an error", body: "@unknown_type.json",
			want:    []string{"termination Terminate " + idTerminate + " deadline=2026-11-29T10:10:00Z noticed=" + noticed},
			wantErr: `unknown event type "Hibernate"`},
		{name: "RFC 3339 NotBefore: an error for the Preempt, the soft Freeze stands", body: "@notbefore_rfc3339.json",
			want:    []string{"scheduled-maintenance Freeze " + idFreeze + " deadline=- noticed=" + noticed},
			wantErr: `parsing NotBefore "2026-11-29T10:00:30Z"`},
		{name: "RFC 3339 NotBefore with FreezeInterrupts: nothing dated", body: "@notbefore_rfc3339.json", freeze: true,
			want: []string{}, wantErr: `parsing NotBefore "2026-11-29T10:15:00Z"`},
		{name: "no EventId", body: "@no_event_id.json", want: []string{}, wantErr: "Reboot event for " + self + " without an EventId"},
		{name: "an event listed twice", body: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "A", "EventType": "Reboot", "Resources": ["` + self + `"], "EventStatus": "Scheduled", "NotBefore": "Sun, 29 Nov 2026 10:15:00 GMT"},
			{"EventId": "A", "EventType": "Reboot", "Resources": ["` + self + `"], "EventStatus": "Scheduled", "NotBefore": "Sun, 29 Nov 2026 10:16:00 GMT"}]}`,
			want:    []string{"scheduled-maintenance Reboot A deadline=2026-11-29T10:15:00Z noticed=" + noticed},
			wantErr: `event "A" listed twice`},
		{name: "Scheduled without NotBefore: deadline now", body: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "B", "EventType": "Preempt", "Resources": ["` + self + `"], "EventStatus": "Scheduled", "NotBefore": ""}]}`,
			want: []string{"preemption Preempt B deadline=" + noticed + " noticed=" + noticed}},
		{name: "Started with a later NotBefore still present: deadline now", body: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "C", "EventType": "Terminate", "Resources": ["` + self + `"], "EventStatus": "Started", "NotBefore": "Sun, 29 Nov 2026 10:10:00 GMT"}]}`,
			want: []string{"termination Terminate C deadline=" + noticed + " noticed=" + noticed}},
		{name: "Started with an earlier NotBefore: that one", body: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "D", "EventType": "Terminate", "Resources": ["` + self + `"], "EventStatus": "Started", "NotBefore": "Sun, 29 Nov 2026 09:58:00 GMT"}]}`,
			want: []string{"termination Terminate D deadline=2026-11-29T09:58:00Z noticed=" + noticed}},
		{name: "event types and statuses in another case", body: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "E", "EventType": "preempt", "Resources": ["` + self + `"], "EventStatus": "scheduled", "NotBefore": "Sun, 29 Nov 2026 10:00:30 GMT"}]}`,
			want: []string{"preemption preempt E deadline=2026-11-29T10:00:30Z noticed=" + noticed}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t)
			s.events(tc.body)
			p, _ := newProvider(t, s.srv.URL, func(o *Options) {
				if tc.resource != "" {
					o.ResourceName = tc.resource
				}
				o.FreezeInterrupts = tc.freeze
			})
			got, err := p.Poll(context.Background())
			checkErr(t, err, tc.wantErr)
			if got == nil {
				t.Error("got nil notices for a parsed document: the agent would keep its previous state")
			}
			checkNotices(t, got, tc.want...)
		})
	}

	t.Run("unknown type error is ErrUnknownEventType", func(t *testing.T) {
		s := newScripted(t)
		s.events("@unknown_type.json")
		p, _ := newProvider(t, s.srv.URL)
		_, err := p.Poll(context.Background())
		if !errors.Is(err, ErrUnknownEventType) {
			t.Errorf("error %v is not ErrUnknownEventType", err)
		}
	})

	t.Run("descriptions", func(t *testing.T) {
		s := newScripted(t)
		s.events("@several.json")
		p, _ := newProvider(t, s.srv.URL)
		got, err := p.Poll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, n := range got {
			ds = append(ds, n.Description)
		}
		want := []string{"Azure scheduled event Preempt", "Virtual machine is going to be redeployed as requested by authorized user.",
			"Virtual machine is being paused because of a memory-preserving Live Migration operation."}
		if !slices.Equal(ds, want) {
			t.Errorf("descriptions %q, want %q", ds, want)
		}
	})
}

// TestFakeLifecycle runs a machine's life against the fake Scheduled Events server: compute.name
// lookup, resource filtering, approval, a started event, withdrawal, throttling.
func TestFakeLifecycle(t *testing.T) {
	fake := azureevents.New(self)
	fake.SetCompute(azureevents.Compute{Name: self, VMScaleSetName: "aks-spotpool-38290525-vmss", Priority: "Spot", EvictionPolicy: "Delete"})
	endpoint, err := fake.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	p, clk := newProvider(t, endpoint, func(o *Options) { o.ResourceName = "" })
	ctx := context.Background()
	poll := func() ([]providers.Notice, error) {
		t.Helper()
		ns, err := p.Poll(ctx)
		if c := fake.Counts(); c.BadRequests > 0 {
			t.Fatalf("the fake refused a request: %s", c.LastRejected)
		}
		return ns, err
	}

	got, err := poll()
	checkErr(t, err, "")
	checkNotices(t, got)

	preempt := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{self},
		NotBefore: t0.Add(30 * time.Second), DurationInSeconds: -1})
	other := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeReboot, Resources: []string{"aks-spotpool-38290525-vmss_1"},
		NotBefore: t0.Add(15 * time.Minute), EventSource: azureevents.SourceUser, DurationInSeconds: -1})
	freeze := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeFreeze,
		Resources: []string{"aks-spotpool-38290525-vmss_1", self}, NotBefore: t0.Add(15 * time.Minute), DurationInSeconds: 9})
	got, err = poll()
	checkErr(t, err, "")
	checkNotices(t, got,
		"preemption Preempt "+preempt+" deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z",
		"scheduled-maintenance Freeze "+freeze+" deadline=- noticed=2026-11-29T10:00:00Z")
	for range 3 {
		if _, err := poll(); err != nil {
			t.Fatal(err)
		}
	}
	if c := fake.Counts(); c.ComputeGets != 1 {
		t.Errorf("compute.name asked %d times, want once", c.ComputeGets)
	}

	// Approving the preemption starts it: the deadline becomes the time reprieve saw it start.
	if err := p.Approve(ctx, got[0]); err != nil {
		t.Fatalf("Approve: %v", err)
	}
	if a := fake.Approvals(); !slices.Equal(a, []string{preempt}) {
		t.Fatalf("the fake received approvals %q, want %q", a, preempt)
	}
	clk.SetTime(t0.Add(5 * time.Second))
	got, err = poll()
	checkErr(t, err, "")
	checkNotices(t, got,
		"preemption Preempt "+preempt+" deadline=2026-11-29T10:00:05Z noticed=2026-11-29T10:00:00Z",
		"scheduled-maintenance Freeze "+freeze+" deadline=- noticed=2026-11-29T10:00:00Z")

	// Another machine's event, an event shared with another machine and another provider's
	// notice are refused without a request.
	for _, n := range []providers.Notice{
		{Provider: Name, ID: other, Kind: providers.KindScheduledMaintenance},
		{Provider: Name, ID: freeze, Kind: providers.KindScheduledMaintenance}, // also names vmss_1
		{Provider: "aws", ID: preempt, Kind: providers.KindPreemption},
		{Provider: Name},
	} {
		if err := p.Approve(ctx, n); err == nil {
			t.Errorf("Approve(%+v) succeeded", n)
		}
	}
	if c := fake.Counts(); c.EventsPosts != 1 {
		t.Errorf("%d approval requests reached the fake, want 1", c.EventsPosts)
	}

	// The preemption completes: Azure removes it, and its notice is withdrawn.
	fake.RemoveEvent(preempt)
	got, err = poll()
	checkErr(t, err, "")
	checkNotices(t, got, "scheduled-maintenance Freeze "+freeze+" deadline=- noticed=2026-11-29T10:00:00Z")

	// Throttled: the error names the status, and the last good notices stand.
	fake.RemoveEvent(freeze) // would withdraw the Freeze, but the next answer is a 429
	fake.Throttle(1)
	got, err = poll()
	checkErr(t, err, "HTTP 429 Too Many Requests")
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusTooManyRequests {
		t.Errorf("error %v: want a StatusError with 429", err)
	}
	checkNotices(t, got, "scheduled-maintenance Freeze "+freeze+" deadline=- noticed=2026-11-29T10:00:00Z")
	got, err = poll()
	checkErr(t, err, "")
	checkNotices(t, got)
}

// TestIncarnation checks that an unchanged DocumentIncarnation is not decoded again: the
// scripted server changes the events without changing the incarnation, which Azure never does.
func TestIncarnation(t *testing.T) {
	s := newScripted(t)
	p, clk := newProvider(t, s.srv.URL)
	ctx := context.Background()
	preempt := "preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z"

	s.events("@preempt_this_instance.json") // incarnation 5
	got, err := p.Poll(ctx)
	checkErr(t, err, "")
	checkNotices(t, got, preempt)

	clk.SetTime(t0.Add(time.Second))
	s.events(strings.Replace(body(t, "@terminate.json"), `"DocumentIncarnation": 3`, `"DocumentIncarnation": 5`, 1))
	got, err = p.Poll(ctx)
	checkErr(t, err, "")
	checkNotices(t, got, preempt)

	s.events(strings.Replace(body(t, "@terminate.json"), `"DocumentIncarnation": 3`, `"DocumentIncarnation": 6`, 1))
	got, err = p.Poll(ctx)
	checkErr(t, err, "")
	checkNotices(t, got, "termination Terminate "+idTerminate+" deadline=2026-11-29T10:10:00Z noticed=2026-11-29T10:00:01Z")

	// An incarnation that goes down (IMDS started afresh) is a change too.
	s.events("@terminate.json") // incarnation 3, same event
	got, err = p.Poll(ctx)
	checkErr(t, err, "")
	checkNotices(t, got, "termination Terminate "+idTerminate+" deadline=2026-11-29T10:10:00Z noticed=2026-11-29T10:00:01Z")

	// The error a document gave is given again while it does not change.
	s.events("@unknown_type.json")
	for range 2 {
		got, err = p.Poll(ctx)
		checkErr(t, err, `unknown event type "Hibernate"`)
		checkNotices(t, got, "termination Terminate "+idTerminate+" deadline=2026-11-29T10:10:00Z noticed=2026-11-29T10:00:01Z")
	}
	if n := s.count(http.MethodGet, eventsPath); n != 6 {
		t.Errorf("%d requests for 6 polls", n)
	}
}

// TestFirstSeen checks the times reprieve stamps: when it first saw an event, and when it first
// saw it started, both stable while the event lasts and forgotten once it is gone.
func TestFirstSeen(t *testing.T) {
	fake := azureevents.New(self)
	endpoint, err := fake.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	p, clk := newProvider(t, endpoint)
	ctx := context.Background()
	at := func(d time.Duration) string { return rfc3339(t0.Add(d)) }

	id := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeTerminate, Resources: []string{self}, NotBefore: t0.Add(10 * time.Minute)})
	got, err := p.Poll(ctx)
	checkErr(t, err, "")
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(10*time.Minute)+" noticed="+at(0))

	// Another change to the document (a new incarnation) keeps the first-seen time.
	clk.SetTime(t0.Add(time.Minute))
	fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeFreeze, Resources: []string{"someone-else"}})
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(10*time.Minute)+" noticed="+at(0))

	// Started: the deadline is when reprieve saw it start, and stays there.
	clk.SetTime(t0.Add(2 * time.Minute))
	fake.SetStatus(id, azureevents.StatusStarted)
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(2*time.Minute)+" noticed="+at(0))
	clk.SetTime(t0.Add(3 * time.Minute))
	fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeFreeze, Resources: []string{"someone-else-again"}})
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(2*time.Minute)+" noticed="+at(0))

	// Back to Scheduled (Azure documents no such move; if it happens, the cloud wins): NotBefore
	// is the deadline again, and a later start is stamped afresh.
	fake.SetStatus(id, azureevents.StatusScheduled)
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(10*time.Minute)+" noticed="+at(0))
	clk.SetTime(t0.Add(3*time.Minute + 30*time.Second))
	fake.SetStatus(id, azureevents.StatusStarted)
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(3*time.Minute+30*time.Second)+" noticed="+at(0))

	// Gone, then listed again under the same ID: a new event to reprieve.
	fake.RemoveEvent(id)
	got, _ = p.Poll(ctx)
	checkNotices(t, got)
	clk.SetTime(t0.Add(4 * time.Minute))
	fake.AddEvent(azureevents.Event{EventID: id, EventType: azureevents.EventTypeTerminate, Resources: []string{self}, EventStatus: azureevents.StatusStarted})
	got, _ = p.Poll(ctx)
	checkNotices(t, got, "termination Terminate "+id+" deadline="+at(4*time.Minute)+" noticed="+at(4*time.Minute))
}

// TestFailuresKeepLastGood checks that every way IMDS can fail returns the last good notices
// with an error naming the problem, after exactly one request.
func TestFailuresKeepLastGood(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name    string
		reply   reply
		timeout time.Duration
		wantErr string
	}{
		{name: "400 without the header", reply: reply{status: 400, body: "@error_missing_header.json"},
			wantErr: `reading scheduled events: HTTP 400 Bad Request: "{\"error\":\"Bad request. Required metadata header not specified\"}"`},
		{name: "429", reply: reply{status: 429, body: "Too many requests"}, wantErr: "HTTP 429 Too Many Requests"},
		{name: "500 with a long body, truncated", reply: reply{status: 500, body: long}, wantErr: `HTTP 500 Internal Server Error: "` + long[:120] + `..."`},
		{name: "503", reply: reply{status: 503}, wantErr: "HTTP 503 Service Unavailable"},
		{name: "404", reply: reply{status: 404}, wantErr: "HTTP 404 Not Found"},
		{name: "204 is not a document", reply: reply{status: 204}, wantErr: "HTTP 204 No Content"},
		{name: "HTML from a proxy", reply: reply{body: "@html_error.html"}, wantErr: `decoding scheduled events "<!DOCTYPE html>`},
		{name: "truncated JSON", reply: reply{body: "@truncated.json"}, wantErr: "decoding scheduled events"},
		{name: "an error object with 200", reply: reply{body: "@error_missing_header.json"}, wantErr: "no DocumentIncarnation and no Events"},
		{name: "null", reply: reply{body: "null"}, wantErr: "no DocumentIncarnation and no Events"},
		{name: "timeout", reply: reply{hang: true}, timeout: 50 * time.Millisecond, wantErr: "context deadline exceeded"},
	}
	preempt := "preemption Preempt " + idPreempt + " deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z"
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t)
			s.events("@preempt_this_instance.json")
			p, _ := newProvider(t, s.srv.URL)
			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			s.script(eventsPath, tc.reply)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			got, err := p.Poll(ctx)
			checkErr(t, err, tc.wantErr)
			checkNotices(t, got, preempt)
			if n := s.count(http.MethodGet, eventsPath); n != 2 {
				t.Errorf("%d requests for 2 polls: no internal retry wanted", n)
			}
			// Recovery: the same document again is taken as it is.
			s.events("@preempt_this_instance.json")
			got, err = p.Poll(context.Background())
			checkErr(t, err, "")
			checkNotices(t, got, preempt)
		})
	}

	t.Run("connection refused", func(t *testing.T) {
		s := newScripted(t)
		s.events("@preempt_this_instance.json")
		p, _ := newProvider(t, s.srv.URL)
		if _, err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.srv.Close()
		got, err := p.Poll(context.Background())
		checkErr(t, err, "reading scheduled events: Get ")
		checkNotices(t, got, preempt)
	})

	t.Run("a bad NotBefore keeps that event's last good notice", func(t *testing.T) {
		s := newScripted(t)
		s.events("@preempt_this_instance.json")
		p, _ := newProvider(t, s.srv.URL)
		if _, err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.events(strings.Replace(body(t, "@notbefore_rfc3339.json"), `"DocumentIncarnation": 8`, `"DocumentIncarnation": 9`, 1))
		got, err := p.Poll(context.Background())
		checkErr(t, err, `event "`+idPreempt+`" (Preempt): parsing NotBefore "2026-11-29T10:00:30Z"`)
		checkNotices(t, got, preempt, "scheduled-maintenance Freeze "+idFreeze+" deadline=- noticed=2026-11-29T10:00:00Z")
	})

	t.Run("before any good answer: no notices", func(t *testing.T) {
		s := newScripted(t)
		s.script(eventsPath, reply{status: 500})
		p, _ := newProvider(t, s.srv.URL)
		got, err := p.Poll(context.Background())
		checkErr(t, err, "HTTP 500")
		if got != nil {
			t.Errorf("got %v, want nil: nothing is known yet", got)
		}
	})
}

func TestComputeName(t *testing.T) {
	ctx := context.Background()
	t.Run("asked once, used to filter", func(t *testing.T) {
		s := newScripted(t)
		s.script(computePath, reply{body: "@compute_vmss_uniform.json"})
		s.events("@several.json")
		p, _ := newProvider(t, s.srv.URL, func(o *Options) { o.ResourceName = "" })
		for range 3 {
			got, err := p.Poll(ctx)
			checkErr(t, err, "")
			if len(got) != 3 {
				t.Fatalf("got %q, want this instance's 3 events", summaries(got))
			}
		}
		if n := s.count(http.MethodGet, computePath); n != 1 {
			t.Errorf("compute asked %d times, want once", n)
		}
		for _, r := range s.recorded() {
			if r.metadata != "true" {
				t.Errorf("%s %s?%s without Metadata: true", r.method, r.path, r.query)
			}
			if r.path == computePath && r.query != "api-version=2021-02-01" {
				t.Errorf("compute query %q", r.query)
			}
			if r.path == eventsPath && r.query != "api-version=2020-07-01" {
				t.Errorf("events query %q", r.query)
			}
		}
	})

	t.Run("failures are errors, never guesses, and are retried on the next poll", func(t *testing.T) {
		s := newScripted(t)
		s.script(computePath, reply{status: 500, body: "upstream"}, reply{body: "@compute_no_name.json"}, reply{body: "<html>"},
			reply{body: "@compute_vmss_uniform.json"})
		s.events("@preempt_this_instance.json")
		p, _ := newProvider(t, s.srv.URL, func(o *Options) { o.ResourceName = "" })
		for _, want := range []string{
			`reading instance compute metadata: HTTP 500 Internal Server Error: "upstream"`,
			"has no name",
			`decoding instance compute metadata "<html>"`,
		} {
			got, err := p.Poll(ctx)
			checkErr(t, err, want)
			if got != nil {
				t.Errorf("got %v with a compute failure", got)
			}
		}
		if n := s.count(http.MethodGet, eventsPath); n != 0 {
			t.Errorf("%d event requests before the name was known", n)
		}
		got, err := p.Poll(ctx)
		checkErr(t, err, "")
		checkNotices(t, got, "preemption Preempt "+idPreempt+" deadline=2026-11-29T10:00:30Z noticed=2026-11-29T10:00:00Z")
	})

	t.Run("not asked when given", func(t *testing.T) {
		s := newScripted(t)
		s.events("@empty_compact.json")
		p, _ := newProvider(t, s.srv.URL)
		if _, err := p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		if n := s.count(http.MethodGet, computePath); n != 0 {
			t.Errorf("compute asked %d times with a ResourceName", n)
		}
	})
}

func TestApprove(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*scripted, *Provider, providers.Notice) {
		s := newScripted(t)
		s.events("@several.json")
		p, _ := newProvider(t, s.srv.URL)
		ns, err := p.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s, p, ns[0]
	}

	t.Run("request", func(t *testing.T) {
		s, p, n := setup(t)
		s.script(eventsPath, reply{})
		if err := p.Approve(ctx, n); err != nil {
			t.Fatal(err)
		}
		rs := s.recorded()
		r := rs[len(rs)-1]
		want := request{method: http.MethodPost, path: eventsPath, query: "api-version=2020-07-01", metadata: "true",
			contentType: "application/json", body: `{"StartRequests":[{"EventId":"` + idPreempt + `"}]}`}
		if r != want {
			t.Errorf("got %+v\nwant %+v", r, want)
		}
	})

	for _, status := range []int{201, 204} {
		t.Run(fmt.Sprintf("%d is success", status), func(t *testing.T) {
			s, p, n := setup(t)
			s.script(eventsPath, reply{status: status})
			if err := p.Approve(ctx, n); err != nil {
				t.Error(err)
			}
		})
	}

	for _, tc := range []struct {
		status  int
		wantErr string
	}{
		{400, `approving event "` + idPreempt + `": HTTP 400 Bad Request: "bad"`},
		{429, "HTTP 429"},
		{500, "HTTP 500"},
	} {
		t.Run(fmt.Sprintf("%d is an error", tc.status), func(t *testing.T) {
			s, p, n := setup(t)
			s.script(eventsPath, reply{status: tc.status, body: "bad"})
			checkErr(t, p.Approve(ctx, n), tc.wantErr)
		})
	}

	t.Run("refusals send nothing", func(t *testing.T) {
		s, p, n := setup(t)
		for _, tc := range []struct {
			n       providers.Notice
			wantErr string
		}{
			{providers.Notice{Provider: "aws", ID: n.ID}, `notice of provider "aws"`},
			{providers.Notice{Provider: Name}, "without an ID"},
			{providers.Notice{Provider: Name, ID: idReboot}, "lists no such event for " + self},
			{providers.Notice{Provider: Name, ID: strings.ToLower(idPreempt)}, "lists no such event"},
			{providers.Notice{Provider: Name, ID: idFreeze}, `approving event "` + idFreeze + `": refused: the event also names other machines (aks-spotpool-38290525-vmss_0)`},
		} {
			checkErr(t, p.Approve(ctx, tc.n), tc.wantErr)
		}
		if err := p.Approve(ctx, providers.Notice{Provider: Name, ID: idFreeze}); !errors.Is(err, ErrSharedEvent) {
			t.Errorf("approving a shared event: %v, want ErrSharedEvent", err)
		}
		if c := s.count(http.MethodPost, eventsPath); c != 0 {
			t.Errorf("%d approvals sent", c)
		}
	})

	t.Run("nothing to approve before a poll", func(t *testing.T) {
		p, _ := newProvider(t, "http://127.0.0.1:1")
		checkErr(t, p.Approve(ctx, providers.Notice{Provider: Name, ID: idPreempt}), "lists no such event")
	})
}

func TestResultsAreCopies(t *testing.T) {
	s := newScripted(t)
	s.events("@several.json")
	p, _ := newProvider(t, s.srv.URL)
	first, err := p.Poll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := summaries(first)
	first[0].Deadline = time.Time{}
	first[1] = providers.Notice{}
	again, _ := p.Poll(context.Background())
	s.script(eventsPath, reply{status: 500})
	failed, _ := p.Poll(context.Background())
	for _, got := range [][]providers.Notice{again, failed} {
		if !slices.Equal(summaries(got), want) {
			t.Errorf("got %q after the caller edited an earlier result, want %q", summaries(got), want)
		}
	}
}

// TestConcurrentApprove runs Approve beside Poll for the race detector.
func TestConcurrentApprove(t *testing.T) {
	fake := azureevents.New(self)
	endpoint, err := fake.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	id := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypeReboot, Resources: []string{self}, NotBefore: t0.Add(time.Hour)})
	p, _ := newProvider(t, endpoint)
	if _, err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := p.Poll(context.Background()); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if err := p.Approve(context.Background(), providers.Notice{Provider: Name, ID: id}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(fake.Approvals()); n != 4 {
		t.Errorf("%d approvals, want 4", n)
	}
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		endpoint, wantEvents, wantErr string
	}{
		{endpoint: "", wantEvents: "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"},
		{endpoint: "http://127.0.0.1:8080/", wantEvents: "http://127.0.0.1:8080/metadata/scheduledevents?api-version=2020-07-01"},
		{endpoint: "169.254.169.254", wantErr: "want http://host[:port]"},
		{endpoint: "ftp://169.254.169.254", wantErr: "want http://host[:port]"},
		{endpoint: "http://", wantErr: "want http://host[:port]"},
		{endpoint: "http://a/?x=1", wantErr: "want http://host[:port]"},
		{endpoint: "http://a b", wantErr: "want http://host[:port]"},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			p, err := New(Options{Endpoint: tc.endpoint})
			checkErr(t, err, tc.wantErr)
			if err == nil && p.eventsURL != tc.wantEvents {
				t.Errorf("events URL %q, want %q", p.eventsURL, tc.wantEvents)
			}
			if err == nil && p.Name() != "azure" {
				t.Errorf("Name() = %q", p.Name())
			}
		})
	}
	t.Run("the default transport bypasses proxies", func(t *testing.T) {
		p, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		if tr, ok := p.client.Transport.(*http.Transport); !ok || tr.Proxy != nil {
			t.Errorf("default transport %#v: want an *http.Transport without Proxy", p.client.Transport)
		}
	})
}

// The provider implements the interfaces the agent consumes.
var (
	_ providers.Provider = (*Provider)(nil)
	_ providers.Approver = (*Provider)(nil)
)
