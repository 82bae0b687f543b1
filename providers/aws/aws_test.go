package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the time-zone test runs itself under TZ values that must exist

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// summary renders the fields a test cares about on one line, so that tables stay readable.
// Spot and rebalance IDs are hashes: their stability has tests of its own.
func summary(n providers.Notice) string {
	s := fmt.Sprintf("%s %s deadline=%s noticed=%s", n.Kind, n.Action, rfc3339(n.Deadline), rfc3339(n.NoticeTime))
	if n.Kind == providers.KindScheduledMaintenance {
		s += " id=" + n.ID
	}
	return s
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

// errPaths returns the metadata path of every SourceError joined into err, sorted.
func errPaths(err error) []string {
	var paths []string
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var se *SourceError
		if errors.As(err, &se) {
			paths = append(paths, se.Path)
		} else if err != nil {
			paths = append(paths, "not a SourceError: "+err.Error())
		}
	}
	walk(err)
	slices.Sort(paths)
	return paths
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

func TestParseSpotInstanceAction(t *testing.T) {
	tests := []struct {
		name    string
		body    string // a testdata file, or literal when it starts with "="
		want    []string
		wantErr string
	}{
		{name: "terminate", body: "spot_terminate.json", want: []string{"spot-interruption terminate deadline=2017-09-18T08:22:00Z noticed=-"}},
		{name: "stop", body: "spot_stop.json", want: []string{"spot-interruption stop deadline=2017-09-18T08:22:00Z noticed=-"}},
		// The deadline becomes min(time, first seen) in Poll; the action says why.
		{name: "hibernate", body: "spot_hibernate.json", want: []string{"spot-interruption " + HibernateNote + " deadline=2017-09-18T08:22:00Z noticed=-"}},
		{name: "tab-indented as amazon-ec2-metadata-mock serves it", body: "spot_terminate_aemm.json", want: []string{"spot-interruption terminate deadline=2026-11-29T10:02:00Z noticed=-"}},
		{name: "unknown action", body: "spot_unknown_action.json", wantErr: `unknown action "reboot"`},
		{name: "no action", body: `={"time": "2017-09-18T08:22:00Z"}`, wantErr: `unknown action ""`},
		{name: "time not RFC 3339", body: "spot_bad_time.json", wantErr: `parsing time "18 Sep 2017 08:22:00 GMT"`},
		{name: "no time", body: `={"action": "terminate"}`, wantErr: `parsing time ""`},
		{name: "truncated JSON names the document", body: "spot_truncated.json", wantErr: `decoding spot instance action "{\"action\": \"terminate\", \"time\": \"2017-09-18T08:2"`},
		{name: "plain text (legacy termination-time answer)", body: "spot_plain_text.txt", wantErr: "decoding spot instance action"},
		{name: "HTML error page", body: "html_error.html", wantErr: "decoding spot instance action"},
		{name: "empty body", body: "=", wantErr: "decoding spot instance action"},
		{name: "JSON array", body: `=[{"action": "terminate", "time": "2017-09-18T08:22:00Z"}]`, wantErr: "decoding spot instance action"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := ParseSpotInstanceAction(body(t, tc.body))
			checkErr(t, err, tc.wantErr)
			if err != nil {
				if ns != nil {
					t.Errorf("got notices %v with the error", ns)
				}
				return
			}
			if got := summaries(ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for _, n := range ns {
				if n.Provider != Name || n.ID == "" || !n.Interrupts() {
					t.Errorf("notice %+v: want provider %q, an ID, and Interrupts()", n, Name)
				}
			}
		})
	}
}

// body reads a testdata file, or returns the text after "=".
func body(t *testing.T, s string) []byte {
	t.Helper()
	if lit, ok := strings.CutPrefix(s, "="); ok {
		return []byte(lit)
	}
	return []byte(readTestdata(t, s))
}

func TestSpotNoticeID(t *testing.T) {
	id := func(b string) string {
		t.Helper()
		ns, err := ParseSpotInstanceAction([]byte(b))
		if err != nil {
			t.Fatal(err)
		}
		return ns[0].ID
	}
	base := id(`{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`)
	if again := id(`{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`); again != base {
		t.Errorf("same payload gave IDs %q and %q", base, again)
	}
	// IMDS and the mock format the same document differently: the ID follows its content.
	if reformatted := id("{\n\t\"time\": \"2017-09-18T08:22:00Z\",\n\t\"action\": \"terminate\"\n}"); reformatted != base {
		t.Errorf("reformatted payload gave ID %q, want %q", reformatted, base)
	}
	for _, other := range []string{
		`{"action": "stop", "time": "2017-09-18T08:22:00Z"}`,
		`{"action": "terminate", "time": "2017-09-18T08:24:00Z"}`,
	} {
		if got := id(other); got == base {
			t.Errorf("%s gave the same ID as a different notice", other)
		}
	}
}

func TestParseRebalance(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []string
		wantErr string
	}{
		{name: "documented shape", body: "rebalance.json", want: []string{"rebalance-recommendation  deadline=- noticed=2020-10-27T08:22:00Z"}},
		{name: "tab-indented as amazon-ec2-metadata-mock serves it", body: "rebalance_aemm.json", want: []string{"rebalance-recommendation  deadline=- noticed=2026-11-29T10:00:00Z"}},
		{name: "noticeTime not RFC 3339", body: "rebalance_bad_time.json", wantErr: `parsing noticeTime "Tue, 27 Oct 2020 08:22:00 GMT"`},
		{name: "no noticeTime", body: "={}", wantErr: `parsing noticeTime ""`},
		{name: "truncated JSON names the document", body: `={"noticeTime": "2020-10-27T08:2`, wantErr: `decoding rebalance recommendation "{\"noticeTime\": \"2020-10-27T08:2"`},
		{name: "HTML error page", body: "html_error.html", wantErr: "decoding rebalance recommendation"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := ParseRebalance(body(t, tc.body))
			checkErr(t, err, tc.wantErr)
			if err != nil {
				return
			}
			if got := summaries(ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for _, n := range ns {
				if n.Interrupts() {
					t.Errorf("a rebalance recommendation must not interrupt: %+v", n)
				}
			}
		})
	}
}

func TestParseScheduledEvents(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []string
		wantErr string
	}{
		{
			name: "active event, documented shape and date format",
			body: "scheduled_active.json",
			want: []string{"scheduled-maintenance system-reboot deadline=2019-01-21T09:00:43Z noticed=- id=instance-event-0d59937288b749b32"},
		},
		{name: "canceled event is not in force", body: "scheduled_canceled.json", want: []string{}},
		{name: "completed event is not in force", body: "scheduled_completed.json", want: []string{}},
		{
			name: "several events: only the active ones",
			body: "scheduled_several.json",
			want: []string{
				"scheduled-maintenance instance-stop deadline=2019-02-01T02:00:00Z noticed=- id=instance-event-01234567890abcdef",
				"scheduled-maintenance instance-retirement deadline=2019-02-03T22:00:00Z noticed=- id=instance-event-0a1b2c3d4e5f60718",
			},
		},
		{
			name: "tab-indented as amazon-ec2-metadata-mock serves it",
			body: "scheduled_aemm.json",
			want: []string{"scheduled-maintenance system-reboot deadline=2026-11-29T10:05:00Z noticed=- id=instance-event-1234567890abcdef0"},
		},
		{
			name: "state in another case",
			body: `=[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "EventId": "e-1", "State": "Active"}]`,
			want: []string{"scheduled-maintenance system-reboot deadline=2019-01-21T09:00:43Z noticed=- id=e-1"},
		},
		{name: "no events (AWS answers [])", body: "scheduled_none.json", want: []string{}},
		{name: "null", body: "=null", want: []string{}},
		{
			name: "a canceled event with a bad date is ignored, not an error",
			body: `=[{"NotBefore": "soon", "Code": "system-reboot", "EventId": "e-1", "State": "canceled"}]`,
			want: []string{},
		},
		{
			name:    "RFC 3339 NotBefore names the event and the value",
			body:    "scheduled_bad_time.json",
			wantErr: `scheduled event "instance-event-0d59937288b749b32": parsing NotBefore "2019-01-21T09:00:43Z"`,
		},
		{
			name:    "one bad event fails the whole document",
			body:    `=[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "EventId": "e-1", "State": "active"}, {"NotBefore": "", "Code": "instance-stop", "EventId": "e-2", "State": "active"}]`,
			wantErr: `scheduled event "e-2"`,
		},
		{name: "object instead of array names the document", body: "scheduled_not_array.json", wantErr: `decoding scheduled events "{\"NotBefore\"`},
		{name: "truncated JSON", body: "scheduled_truncated.json", wantErr: "decoding scheduled events"},
		{name: "HTML error page", body: "html_error.html", wantErr: "decoding scheduled events"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := ParseScheduledEvents(body(t, tc.body))
			checkErr(t, err, tc.wantErr)
			if err != nil {
				if ns != nil {
					t.Errorf("got notices %v with the error", ns)
				}
				return
			}
			providers.Sort(ns)
			if got := summaries(ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %q,\nwant %q", got, tc.want)
			}
			for _, n := range ns {
				if !n.Interrupts() || n.Provider != Name {
					t.Errorf("notice %+v: want provider %q and Interrupts()", n, Name)
				}
			}
		})
	}
}

func TestScheduledEventWithoutEventID(t *testing.T) {
	b := body(t, "scheduled_no_event_id.json")
	first, err := ParseScheduledEvents(b)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ParseScheduledEvents(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("got %d and %d notices, want 1", len(first), len(second))
	}
	if first[0].ID == "" || first[0].ID != second[0].ID {
		t.Errorf("IDs %q and %q: want the same non-empty hash for the same payload", first[0].ID, second[0].ID)
	}
	other, err := ParseScheduledEvents([]byte(strings.Replace(string(b), "21 Jan 2019 09:00:43", "22 Jan 2019 09:00:43", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if other[0].ID == first[0].ID {
		t.Errorf("an event at another time got the same ID %q", other[0].ID)
	}
}

// TestScheduledEventsIgnoreLocalTimeZone runs itself under other local time zones (time.Parse
// looks zone abbreviations up in time.Local; Dublin calls its winter time GMT and has a
// negative DST): "21 Jan 2019 09:00:43 GMT" must be 09:00:43 UTC wherever the agent runs.
func TestScheduledEventsIgnoreLocalTimeZone(t *testing.T) {
	const child = "REPRIEVE_TEST_TZ_CHILD"
	if os.Getenv(child) != "" {
		for _, c := range []struct{ notBefore, want string }{
			{"21 Jan 2019 09:00:43 GMT", "2019-01-21T09:00:43Z"},
			{"21 Jul 2019 09:00:43 GMT", "2019-07-21T09:00:43Z"},
		} {
			ns, err := ParseScheduledEvents([]byte(`[{"NotBefore": "` + c.notBefore + `", "Code": "system-reboot", "EventId": "e-1", "State": "active"}]`))
			if err != nil {
				t.Fatal(err)
			}
			if got := rfc3339(ns[0].Deadline); got != c.want {
				t.Errorf("TZ=%s: %q parsed as %s (%v), want %s", os.Getenv("TZ"), c.notBefore, got, ns[0].Deadline, c.want)
			}
		}
		return
	}
	for _, tz := range []string{"Africa/Lagos", "Europe/Dublin", "America/Los_Angeles", "UTC"} {
		t.Run(tz, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestScheduledEventsIgnoreLocalTimeZone$", "-test.count=1")
			// atexit_sleep_ms: a -race binary otherwise waits a second before exiting.
			cmd.Env = append(os.Environ(), "TZ="+tz, child+"=1", "GORACE=atexit_sleep_ms=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New with no endpoint: want an error")
	}
	p, err := New(Options{Endpoint: "http://127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "aws" {
		t.Errorf("Name() = %q", p.Name())
	}
	var _ providers.Provider = p
}

// pollEnv is a provider polling a fake IMDS, both on one fake clock: the clock stamps notices
// and decides when the fake's tokens expire.
type pollEnv struct {
	imds *fakeIMDS
	clk  *clocktesting.FakeClock
	p    *Provider
}

func newPollEnv(t *testing.T) *pollEnv {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	f := newFakeIMDS(t, clk)
	// HTTPClient is left to the SDK, as in production: its short dial and response-header
	// timeouts are part of what is tested.
	p, err := New(Options{Endpoint: f.URL() + "/", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &pollEnv{imds: f, clk: clk, p: p}
}

func (e *pollEnv) poll(t *testing.T) ([]providers.Notice, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return e.p.Poll(ctx)
}

// pollStep scripts the fake (and the clock), polls once and checks the outcome.
type pollStep struct {
	name    string
	do      func(e *pollEnv)
	want    []string // summaries, in Poll's order
	errPath []string // the sources the error must name, sorted; nil: no error
	check   func(t *testing.T, e *pollEnv, ns []providers.Notice, err error)
}

const (
	spotNotice = "spot-interruption terminate deadline=2017-09-18T08:22:00Z noticed=2026-11-29T10:00:00Z"
	rebalNote  = "rebalance-recommendation  deadline=- noticed=2020-10-27T08:22:00Z"
	rebootNote = "scheduled-maintenance system-reboot deadline=2019-01-21T09:00:43Z noticed=2026-11-29T10:00:00Z id=instance-event-0d59937288b749b32"
)

func TestPoll(t *testing.T) {
	spotOK := func(e *pollEnv) { e.imds.setFile(PathSpotInstanceAction, "spot_terminate.json") }
	rebootActive := func(e *pollEnv) { e.imds.setFile(PathScheduledEvents, "scheduled_active.json") }
	requests := func(spot, rebalance, scheduled, tokens int) func(*testing.T, *pollEnv, []providers.Notice, error) {
		return func(t *testing.T, e *pollEnv, _ []providers.Notice, _ error) {
			t.Helper()
			got := []int{e.imds.gets(PathSpotInstanceAction), e.imds.gets(PathRebalance), e.imds.gets(PathScheduledEvents), e.imds.tokenPuts()}
			if want := []int{spot, rebalance, scheduled, tokens}; !slices.Equal(got, want) {
				t.Errorf("requests (spot, rebalance, scheduled GETs, token PUTs) = %v, want %v", got, want)
			}
		}
	}

	tests := []struct {
		name  string
		steps []pollStep
	}{
		{
			name: "nothing pending",
			steps: []pollStep{{
				name:  "every source answers 404",
				want:  []string{},
				check: requests(1, 1, 1, 1),
			}, {
				name:  "AWS answers [] for no scheduled events",
				do:    func(e *pollEnv) { e.imds.setFile(PathScheduledEvents, "scheduled_none.json") },
				want:  []string{},
				check: requests(2, 2, 2, 1), // the token is cached
			}},
		},
		{
			name: "spot notice",
			steps: []pollStep{{
				do:   spotOK,
				want: []string{spotNotice},
			}},
		},
		{
			name: "every source at once, sorted by deadline",
			steps: []pollStep{{
				do: func(e *pollEnv) {
					spotOK(e)
					e.imds.setFile(PathRebalance, "rebalance.json")
					e.imds.setFile(PathScheduledEvents, "scheduled_several.json")
				},
				want: []string{
					spotNotice,
					"scheduled-maintenance instance-stop deadline=2019-02-01T02:00:00Z noticed=2026-11-29T10:00:00Z id=instance-event-01234567890abcdef",
					"scheduled-maintenance instance-retirement deadline=2019-02-03T22:00:00Z noticed=2026-11-29T10:00:00Z id=instance-event-0a1b2c3d4e5f60718",
					rebalNote,
				},
			}},
		},
		{
			name: "against amazon-ec2-metadata-mock's payloads",
			steps: []pollStep{{
				do: func(e *pollEnv) {
					e.imds.setFile(PathSpotInstanceAction, "spot_terminate_aemm.json")
					e.imds.setFile(PathRebalance, "rebalance_aemm.json")
					e.imds.setFile(PathScheduledEvents, "scheduled_aemm.json")
				},
				want: []string{
					"spot-interruption terminate deadline=2026-11-29T10:02:00Z noticed=2026-11-29T10:00:00Z",
					"scheduled-maintenance system-reboot deadline=2026-11-29T10:05:00Z noticed=2026-11-29T10:00:00Z id=instance-event-1234567890abcdef0",
					"rebalance-recommendation  deadline=- noticed=2026-11-29T10:00:00Z",
				},
			}},
		},
		{
			name: "a failing source is named and the others still report",
			steps: []pollStep{{
				do: func(e *pollEnv) {
					spotOK(e)
					e.imds.set(PathScheduledEvents, http.StatusInternalServerError, "Internal Server Error")
				},
				want:    []string{spotNotice},
				errPath: []string{PathScheduledEvents},
				check: func(t *testing.T, e *pollEnv, _ []providers.Notice, err error) {
					var se *SourceError
					if !errors.As(err, &se) || se.StatusCode() != http.StatusInternalServerError {
						t.Errorf("error %v: want a SourceError with status 500", err)
					}
					// Our Retryer allows one retry, no more: a poll must stay short.
					requests(1, 1, 2, 1)(t, e, nil, err)
				},
			}},
		},
		{
			name: "NoticeTime is first seen on the injected clock and stays",
			steps: []pollStep{{
				do:   spotOK,
				want: []string{spotNotice},
			}, {
				name: "ten seconds later a scheduled event appears",
				do: func(e *pollEnv) {
					e.clk.Step(10 * time.Second)
					rebootActive(e)
				},
				want: []string{
					spotNotice,
					"scheduled-maintenance system-reboot deadline=2019-01-21T09:00:43Z noticed=2026-11-29T10:00:10Z id=instance-event-0d59937288b749b32",
				},
			}, {
				name: "a minute later, both keep their first-seen time",
				do:   func(e *pollEnv) { e.clk.Step(time.Minute) },
				want: []string{
					spotNotice,
					"scheduled-maintenance system-reboot deadline=2019-01-21T09:00:43Z noticed=2026-11-29T10:00:10Z id=instance-event-0d59937288b749b32",
				},
				check: func(t *testing.T, e *pollEnv, ns []providers.Notice, _ error) {
					ids := []string{ns[0].ID}
					e.clk.Step(time.Second)
					again, err := e.poll(t)
					if err != nil || len(again) != 2 || again[0].ID != ids[0] {
						t.Errorf("next poll: %v, %v; want the spot notice's ID %q to stay", summaries(again), err, ids[0])
					}
				},
			}},
		},
		{
			name: "cancelled scheduled event undoes the active one",
			steps: []pollStep{
				{do: rebootActive, want: []string{rebootNote}},
				{do: func(e *pollEnv) { e.imds.setFile(PathScheduledEvents, "scheduled_canceled.json") }, want: []string{}},
			},
		},
		{
			name: "completed scheduled event undoes the active one",
			steps: []pollStep{
				{do: rebootActive, want: []string{rebootNote}},
				{do: func(e *pollEnv) { e.imds.setFile(PathScheduledEvents, "scheduled_completed.json") }, want: []string{}},
			},
		},
		{
			name: "a scheduled event IMDS stops listing is withdrawn (amazon-ec2-metadata-mock answers 404)",
			steps: []pollStep{
				{do: rebootActive, want: []string{rebootNote}},
				{do: func(e *pollEnv) { e.imds.notFound(PathScheduledEvents) }, want: []string{}},
			},
		},
		{
			name: "an undatable scheduled event keeps the last good answer",
			steps: []pollStep{
				{do: rebootActive, want: []string{rebootNote}},
				{
					do:      func(e *pollEnv) { e.imds.setFile(PathScheduledEvents, "scheduled_bad_time.json") },
					want:    []string{rebootNote},
					errPath: []string{PathScheduledEvents},
				},
			},
		},
		{
			name: "token expires on the server between polls",
			steps: []pollStep{
				{do: spotOK, want: []string{spotNotice}, check: requests(1, 1, 1, 1)},
				{
					name: "six minutes on, past the SDK's 5 min TTL on the fake's clock only",
					do:   func(e *pollEnv) { e.clk.Step(6 * time.Minute) },
					want: []string{spotNotice},
					check: func(t *testing.T, e *pollEnv, _ []providers.Notice, _ error) {
						if got := e.imds.unauthorized(); got == 0 {
							t.Errorf("the fake refused no request: the test did not expire the token")
						}
						if got := e.imds.tokenPuts(); got < 2 {
							t.Errorf("token PUTs = %d, want a new token after the 401", got)
						}
					},
				},
			},
		},
		{
			name: "token revoked between polls",
			steps: []pollStep{
				{do: spotOK, want: []string{spotNotice}},
				{
					do:   func(e *pollEnv) { e.imds.revokeTokens() },
					want: []string{spotNotice},
					check: func(t *testing.T, e *pollEnv, _ []providers.Notice, _ error) {
						if e.imds.unauthorized() == 0 || e.imds.tokenPuts() < 2 {
							t.Errorf("401s = %d, token PUTs = %d: want a refusal and a new token", e.imds.unauthorized(), e.imds.tokenPuts())
						}
					},
				},
			},
		},
		{
			name: "token endpoint fails: every source fails, last answers stand",
			steps: []pollStep{
				{do: func(e *pollEnv) { spotOK(e); rebootActive(e) }, want: []string{spotNotice, rebootNote}},
				{
					do: func(e *pollEnv) {
						e.imds.revokeTokens()
						e.imds.set(imdsTokenPath, http.StatusInternalServerError, "Internal Server Error")
					},
					want:    []string{spotNotice, rebootNote},
					errPath: []string{PathScheduledEvents, PathRebalance, PathSpotInstanceAction},
				},
			},
		},
		{
			name: "no IMDSv1 fallback when the token PUT is refused",
			steps: []pollStep{{
				do:      func(e *pollEnv) { e.imds.set(imdsTokenPath, http.StatusNotFound, "Not Found") },
				want:    []string{},
				errPath: []string{PathScheduledEvents, PathRebalance, PathSpotInstanceAction},
				check:   requests(0, 0, 0, 3),
			}, {
				do:      func(e *pollEnv) { e.imds.set(imdsTokenPath, http.StatusForbidden, "Forbidden") },
				want:    []string{},
				errPath: []string{PathScheduledEvents, PathRebalance, PathSpotInstanceAction},
				check: func(t *testing.T, e *pollEnv, _ []providers.Notice, _ error) {
					if n := e.imds.gets(PathSpotInstanceAction) + e.imds.unauthorized(); n != 0 {
						t.Errorf("%d metadata GETs without a token: the SDK fell back to IMDSv1", n)
					}
				},
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newPollEnv(t)
			for i, s := range tc.steps {
				t.Logf("step %d: %s", i, s.name)
				if s.do != nil {
					s.do(e)
				}
				ns, err := e.poll(t)
				checkPoll(t, i, ns, err, s.want, s.errPath)
				if s.check != nil {
					s.check(t, e, ns, err)
				}
			}
		})
	}
}

func checkPoll(t *testing.T, step int, ns []providers.Notice, err error, want, wantErrPaths []string) {
	t.Helper()
	if got := summaries(ns); !slices.Equal(got, want) {
		t.Errorf("step %d: notices\n got %q\nwant %q", step, got, want)
	}
	if got := errPaths(err); !slices.Equal(got, wantErrPaths) {
		t.Errorf("step %d: error %v\nnames sources %q, want %q", step, err, got, wantErrPaths)
	}
	if err != nil {
		for _, p := range wantErrPaths {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("step %d: error %q does not name %s", step, err, p)
			}
		}
	}
}

// TestPollSourceFaults: a source that gave a notice and then misbehaves keeps that notice (it
// is neither invented nor withdrawn) and is named in the error; answering 404 withdraws it.
func TestPollSourceFaults(t *testing.T) {
	tests := []struct {
		name       string
		resp       imdsResponse
		wantStatus int // SourceError.StatusCode; -1: not checked
		wantErr    string
	}{
		{name: "500", resp: imdsResponse{status: 500, body: "Internal Server Error"}, wantStatus: 500},
		{name: "503", resp: imdsResponse{status: 503, body: "Service Unavailable"}, wantStatus: 503},
		{name: "429 throttled", resp: imdsResponse{status: 429, body: "Too Many Requests"}, wantStatus: 429},
		{name: "400", resp: imdsResponse{status: 400, body: "Bad Request"}, wantStatus: 400},
		{name: "malformed JSON", resp: imdsResponse{body: `{"action": "terminate", "time": `}, wantStatus: 0, wantErr: "decoding spot instance action"},
		{name: "HTML from a proxy", resp: imdsResponse{body: "<html><body>502 Bad Gateway</body></html>"}, wantStatus: 0, wantErr: "decoding spot instance action"},
		{name: "unknown action", resp: imdsResponse{body: `{"action": "reboot", "time": "2017-09-18T08:22:00Z"}`}, wantStatus: 0, wantErr: `unknown action "reboot"`},
		{name: "empty 200", resp: imdsResponse{}, wantStatus: 0, wantErr: "decoding spot instance action"},
		{name: "connection closed mid-body", resp: imdsResponse{body: `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`, fault: faultTruncate}, wantStatus: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newPollEnv(t)
			e.imds.setFile(PathSpotInstanceAction, "spot_terminate.json")
			ns, err := e.poll(t)
			checkPoll(t, 0, ns, err, []string{spotNotice}, nil)
			id := ns[0].ID

			e.clk.Step(5 * time.Second)
			e.imds.script(PathSpotInstanceAction, tc.resp)
			ns, err = e.poll(t)
			checkPoll(t, 1, ns, err, []string{spotNotice}, []string{PathSpotInstanceAction})
			if len(ns) == 1 && ns[0].ID != id {
				t.Errorf("kept notice changed ID from %q to %q", id, ns[0].ID)
			}
			var se *SourceError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a SourceError", err)
			}
			if tc.wantStatus >= 0 && se.StatusCode() != tc.wantStatus {
				t.Errorf("StatusCode() = %d, want %d", se.StatusCode(), tc.wantStatus)
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}

			e.imds.notFound(PathSpotInstanceAction)
			ns, err = e.poll(t)
			checkPoll(t, 2, ns, err, []string{}, nil)
		})
	}
}

// TestPollHangingSource: a source that never answers costs the poll no more than its context
// allows, and the sources that did answer are still reported.
func TestPollHangingSource(t *testing.T) {
	tests := []struct {
		name  string
		fault fault
	}{
		{name: "no response", fault: faultHang},
		{name: "headers then a stalled body", fault: faultHangBody},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newPollEnv(t)
			e.imds.setFile(PathSpotInstanceAction, "spot_terminate.json")
			e.imds.fail(PathScheduledEvents, tc.fault, http.StatusOK, readTestdata(t, "scheduled_active.json"))

			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			ns, err := e.p.Poll(ctx)
			elapsed := time.Since(start)

			// Generous slack for -race on a loaded machine; without the context the SDK
			// would wait 5 s.
			if elapsed > deadline+2*time.Second {
				t.Errorf("Poll took %v with a %v deadline", elapsed, deadline)
			}
			checkPoll(t, 0, ns, err, []string{spotNotice}, []string{PathScheduledEvents})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v: want it to wrap context.DeadlineExceeded", err)
			}
		})
	}
}

// TestPollHangingSourceWithoutDeadline: the agent may poll with a context that has no
// deadline; the SDK client's own response-header timeout (500 ms) and our single retry then
// bound the poll, well inside the SDK's 5 s per-operation default.
func TestPollHangingSourceWithoutDeadline(t *testing.T) {
	e := newPollEnv(t)
	e.imds.fail(PathRebalance, faultHang, 0, "")
	start := time.Now()
	ns, err := e.p.Poll(context.Background())
	if elapsed := time.Since(start); elapsed > 4*time.Second {
		t.Errorf("Poll took %v", elapsed)
	}
	checkPoll(t, 0, ns, err, []string{}, []string{PathRebalance})
}

// TestPollRetryIsShort: a source that keeps failing costs one retry after at most 100 ms, not
// the SDK's default backoff of up to 1 s, so that a failing IMDS never stalls the poll loop.
func TestPollRetryIsShort(t *testing.T) {
	e := newPollEnv(t)
	for _, src := range sources {
		e.imds.set(src, http.StatusServiceUnavailable, "Service Unavailable")
	}
	const polls = 5
	start := time.Now()
	for range polls {
		if _, err := e.poll(t); err == nil {
			t.Fatal("got no error from a failing IMDS")
		}
	}
	// Five polls of three sources, each retried once after up to 100 ms: about 0.5 s at
	// worst. With the SDK's 1 s cap the first retry waits up to 1 s: about 3.5 s on average.
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("%d polls took %v", polls, elapsed)
	}
	for _, src := range sources {
		if got := e.imds.gets(src); got != 2*polls {
			t.Errorf("%s: %d GETs, want %d (one retry per poll)", src, got, 2*polls)
		}
	}
}

// TestRebalanceIDIgnoresNoticeTime: amazon-ec2-metadata-mock recomputes noticeTime on every
// request; the recommendation must keep one ID so it is not announced anew at every poll.
func TestRebalanceIDIgnoresNoticeTime(t *testing.T) {
	a, err := ParseRebalance([]byte(`{"noticeTime": "2026-11-29T12:00:00Z"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseRebalance([]byte(`{"noticeTime": "2026-11-29T12:00:07Z"}`))
	if err != nil {
		t.Fatal(err)
	}
	if a[0].ID != b[0].ID {
		t.Errorf("IDs differ: %s, %s", a[0].ID, b[0].ID)
	}
	if a[0].NoticeTime.Equal(b[0].NoticeTime) {
		t.Error("noticeTime should still be reported as given")
	}
}
