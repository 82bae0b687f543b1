package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// summary renders the fields a test cares about on one line, so that tables stay readable.
func summary(n providers.Notice) string {
	return fmt.Sprintf("%s %s deadline=%s noticed=%s", n.Kind, n.Action, hhmmss(n.Deadline), hhmmss(n.NoticeTime))
}

func summaries(ns []providers.Notice) []string {
	out := []string{}
	for _, n := range ns {
		out = append(out, summary(n))
	}
	return out
}

func hhmmss(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05")
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

func TestNotices(t *testing.T) {
	later := t0.Add(45 * time.Second)
	tests := []struct {
		name string
		st   state
		want []string
	}{
		{name: "nothing pending", st: state{preempted: PreemptedFalse, maintenance: MaintenanceNone}, want: []string{}},
		{name: "nothing read yet", st: state{spot: true}, want: []string{}},
		{name: "preempted", st: state{preempted: PreemptedTrue, preemptedSince: t0, maintenance: MaintenanceNone},
			want: []string{"preemption preempt deadline=10:00:30 noticed=10:00:00"}},
		{name: "terminate, standard VM", st: state{preempted: PreemptedFalse, maintenance: MaintenanceTerminate, maintenanceSince: t0},
			want: []string{"termination terminate-on-host-maintenance deadline=10:02:00 noticed=10:00:00"}},
		{name: "terminate, Spot VM", st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, spot: true},
			want: []string{"termination terminate-on-host-maintenance deadline=10:00:30 noticed=10:00:00"}},
		{name: "migrate is a soft notice", st: state{maintenance: MaintenanceMigrate, maintenanceSince: t0},
			want: []string{"scheduled-maintenance migrate-on-host-maintenance deadline=- noticed=10:00:00"}},
		{name: "preempted during a terminate, earliest deadline first",
			st: state{preempted: PreemptedTrue, preemptedSince: later, maintenance: MaintenanceTerminate, maintenanceSince: t0},
			want: []string{
				"preemption preempt deadline=10:01:15 noticed=10:00:45",
				"termination terminate-on-host-maintenance deadline=10:02:00 noticed=10:00:00",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.st.notices()
			if got := summaries(ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for _, n := range ns {
				if n.Provider != Name || n.ID == "" {
					t.Errorf("notice %+v: want provider %q and an ID", n, Name)
				}
				if want := n.Kind != providers.KindScheduledMaintenance; n.Interrupts() != want {
					t.Errorf("notice %s: Interrupts() = %v, want %v", summary(n), n.Interrupts(), want)
				}
			}
		})
	}
}

func TestParseValues(t *testing.T) {
	tests := []struct {
		name    string
		parse   func(string) (string, error)
		in      string
		want    string
		wantErr string
	}{
		{"preempted TRUE", parsePreempted, "TRUE", PreemptedTrue, ""},
		{"preempted FALSE with newline", parsePreempted, "FALSE\n", PreemptedFalse, ""},
		{"preempted lower case", parsePreempted, "true", PreemptedTrue, ""},
		{"preempted unknown", parsePreempted, "MAYBE", "", `unknown instance/preempted value "MAYBE"`},
		{"preempted empty", parsePreempted, "", "", `unknown instance/preempted value ""`},
		{"maintenance NONE", parseMaintenanceEvent, "NONE", MaintenanceNone, ""},
		{"maintenance migrate", parseMaintenanceEvent, "MIGRATE_ON_HOST_MAINTENANCE", MaintenanceMigrate, ""},
		{"maintenance terminate", parseMaintenanceEvent, " TERMINATE_ON_HOST_MAINTENANCE\n", MaintenanceTerminate, ""},
		{"maintenance unknown", parseMaintenanceEvent, "REBOOT_ON_HOST_MAINTENANCE", "", `unknown instance/maintenance-event value "REBOOT_ON_HOST_MAINTENANCE"`},
		{"maintenance HTML", parseMaintenanceEvent, "<html>", "", `value "<html>"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse(tc.in)
			checkErr(t, err, tc.wantErr)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestScheduling(t *testing.T) {
	tests := []struct {
		name           string
		preemptible    string // "-" for absent
		model          string
		wantSpot       bool
		wantErr        string
		wantPreemptErr bool
	}{
		{name: "both absent", preemptible: "-", model: "-"},
		{name: "standard", preemptible: "FALSE", model: "STANDARD"},
		{name: "preemptible", preemptible: "TRUE", model: "-", wantSpot: true},
		{name: "spot", preemptible: "FALSE", model: "SPOT", wantSpot: true},
		{name: "spot, no preemptible value", preemptible: "-", model: "SPOT", wantSpot: true},
		{name: "another model", preemptible: "FALSE", model: "FLEX_START"},
		{name: "unknown preemptible", preemptible: "YES", model: "-", wantErr: `unknown instance/scheduling/preemptible value "YES"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePreemptible(tc.preemptible, tc.preemptible != "-")
			checkErr(t, err, tc.wantErr)
			if err != nil {
				return
			}
			if got := p || parseProvisioningModel(tc.model, tc.model != "-"); got != tc.wantSpot {
				t.Errorf("spot = %v, want %v", got, tc.wantSpot)
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "", want: ""},
		{in: "127.0.0.1:8080", want: "127.0.0.1:8080"},
		{in: "http://127.0.0.1:8080", want: "127.0.0.1:8080"},
		{in: "http://metadata.google.internal/", want: "metadata.google.internal"},
		{in: "https://127.0.0.1:8080", wantErr: "want host:port"},
		{in: "http://127.0.0.1:8080/computeMetadata/v1", wantErr: "want host:port"},
		{in: "http://", wantErr: "want host:port"},
		{in: "http://[::1", wantErr: "endpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := endpointHost(tc.in)
			checkErr(t, err, tc.wantErr)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			_, err = New(Options{Endpoint: tc.in})
			checkErr(t, err, tc.wantErr)
		})
	}
}

// startFake starts a fake metadata server with the given values ("" deletes a path).
func startFake(t *testing.T, values map[string]string) *gcpmeta.Server {
	t.Helper()
	s := gcpmeta.New()
	if _, err := s.Start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for p, v := range values {
		if v == "" {
			s.Delete(p)
		} else {
			s.Set(p, v)
		}
	}
	return s
}

func newProvider(t *testing.T, s *gcpmeta.Server, clk *clocktesting.FakePassiveClock) *Provider {
	t.Helper()
	p, err := New(Options{Endpoint: s.Addr(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoll(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]string
		want   []string
	}{
		{name: "nothing pending", want: []string{}},
		{name: "preempted", values: map[string]string{PathPreempted: "TRUE", PathPreemptible: "TRUE"},
			want: []string{"preemption preempt deadline=10:00:30 noticed=10:00:00"}},
		{name: "terminate, standard VM", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate},
			want: []string{"termination terminate-on-host-maintenance deadline=10:02:00 noticed=10:00:00"}},
		{name: "terminate, standard provisioning model", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "FALSE", PathProvisioningModel: "STANDARD"},
			want: []string{"termination terminate-on-host-maintenance deadline=10:02:00 noticed=10:00:00"}},
		{name: "terminate, preemptible VM", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "TRUE"},
			want: []string{"termination terminate-on-host-maintenance deadline=10:00:30 noticed=10:00:00"}},
		{name: "terminate, Spot VM", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "FALSE", PathProvisioningModel: "SPOT"},
			want: []string{"termination terminate-on-host-maintenance deadline=10:00:30 noticed=10:00:00"}},
		{name: "migrate", values: map[string]string{PathMaintenanceEvent: MaintenanceMigrate},
			want: []string{"scheduled-maintenance migrate-on-host-maintenance deadline=- noticed=10:00:00"}},
		{name: "values with a newline", values: map[string]string{PathPreempted: "TRUE\n", PathMaintenanceEvent: "NONE\n"},
			want: []string{"preemption preempt deadline=10:00:30 noticed=10:00:00"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, tc.values)
			p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
			ns, err := p.Poll(context.Background())
			checkErr(t, err, "")
			if got := summaries(ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for _, r := range s.Requests() {
				if r.Flavor != "Google" {
					t.Errorf("request %s without Metadata-Flavor: Google", r.Path)
				}
			}
		})
	}
}

func TestPollTracksValues(t *testing.T) {
	s := startFake(t, nil)
	clk := clocktesting.NewFakePassiveClock(t0)
	p := newProvider(t, s, clk)
	ctx := context.Background()
	poll := func(wantErr string) []providers.Notice {
		t.Helper()
		ns, err := p.Poll(ctx)
		checkErr(t, err, wantErr)
		return ns
	}

	s.Set(PathMaintenanceEvent, MaintenanceTerminate)
	first := poll("")
	clk.SetTime(t0.Add(10 * time.Second))
	again := poll("")
	if len(first) != 1 || len(again) != 1 || first[0].ID != again[0].ID || !again[0].Deadline.Equal(first[0].Deadline) {
		t.Fatalf("a persisting value moved: %q then %q", summaries(first), summaries(again))
	}

	// An unknown value keeps the last good one, and the error names it.
	s.Set(PathMaintenanceEvent, "REBOOT_ON_HOST_MAINTENANCE")
	kept := poll(`unknown instance/maintenance-event value "REBOOT_ON_HOST_MAINTENANCE"`)
	if len(kept) != 1 || kept[0].ID != first[0].ID {
		t.Errorf("unknown value: got %q, want the last good notice kept", summaries(kept))
	}
	// So does a value that disappeared (GCE always serves it: a wrong endpoint).
	s.Delete(PathMaintenanceEvent)
	if kept := poll("instance/maintenance-event: not defined"); len(kept) != 1 || kept[0].ID != first[0].ID {
		t.Errorf("404: got %q, want the last good notice kept", summaries(kept))
	}

	// NONE withdraws; the same value later is a new notice.
	s.Set(PathMaintenanceEvent, MaintenanceNone)
	if ns := poll(""); len(ns) != 0 {
		t.Errorf("NONE: got %q, want nothing", summaries(ns))
	}
	clk.SetTime(t0.Add(20 * time.Second))
	s.Set(PathMaintenanceEvent, MaintenanceTerminate)
	s.Set(PathPreempted, PreemptedTrue)
	both := poll("")
	want := []string{
		"preemption preempt deadline=10:00:50 noticed=10:00:20",
		"termination terminate-on-host-maintenance deadline=10:02:20 noticed=10:00:20",
	}
	if got := summaries(both); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if both[1].ID == first[0].ID {
		t.Error("a second maintenance event kept the first one's ID")
	}
	s.Set(PathPreempted, PreemptedFalse)
	if got := summaries(poll("")); len(got) != 1 || !strings.HasPrefix(got[0], "termination") {
		t.Errorf("preempted FALSE: got %q, want only the termination", got)
	}

	// The scheduling values were read once for the provider's lifetime.
	if n := s.Count(PathPreemptible) + s.Count(PathProvisioningModel); n != 2 {
		t.Errorf("scheduling values read %d times, want 2 (once each)", n)
	}
}

func TestPollServerErrors(t *testing.T) {
	t.Parallel()
	s := startFake(t, map[string]string{PathPreempted: PreemptedTrue})
	p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
	ctx := context.Background()
	first, err := p.Poll(ctx)
	checkErr(t, err, "")

	// A short burst of 503 (as during maintenance) is retried within the read.
	s.SetError(PathPreempted, http.StatusServiceUnavailable, 3)
	ns, err := p.Poll(ctx)
	checkErr(t, err, "")
	if !slices.Equal(summaries(ns), summaries(first)) {
		t.Errorf("after a 503 burst: got %q, want %q", summaries(ns), summaries(first))
	}

	// A lasting one fails the source, which keeps its last good answer.
	s.SetError(PathPreempted, http.StatusServiceUnavailable, 100)
	ns, err = p.Poll(ctx)
	var se *SourceError
	if !errors.As(err, &se) || se.Path != PathPreempted || se.StatusCode() != http.StatusServiceUnavailable {
		t.Fatalf("got error %v, want a 503 SourceError for %s", err, PathPreempted)
	}
	if !slices.Equal(summaries(ns), summaries(first)) {
		t.Errorf("failing source: got %q, want the last good %q", summaries(ns), summaries(first))
	}
}

// stripFlavor is a client bug: it removes Metadata-Flavor from every request.
type stripFlavor struct{ next http.RoundTripper }

func (s stripFlavor) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Del("Metadata-Flavor")
	return s.next.RoundTrip(req)
}

func TestMetadataFlavorRequired(t *testing.T) {
	s := startFake(t, nil)
	p, err := New(Options{Endpoint: s.Addr(), HTTPClient: &http.Client{Transport: stripFlavor{DefaultTransport()}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Poll(context.Background())
	var se *SourceError
	if !errors.As(err, &se) || se.StatusCode() != http.StatusForbidden {
		t.Fatalf("got %v, want 403 from the fake", err)
	}
}

// countingTransport stands for the instrumented transport main passes.
type countingTransport struct {
	n    atomic.Int64
	next http.RoundTripper

	mu             sync.Mutex
	sent, deadline time.Time // of the last hanging GET
	hasDeadline    bool
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	if req.URL.Query().Get("wait_for_change") == "true" {
		c.mu.Lock()
		c.deadline, c.hasDeadline = req.Context().Deadline()
		c.sent = time.Now()
		c.mu.Unlock()
	}
	return c.next.RoundTrip(req)
}

// hangingDeadline is how far from its sending the last hanging GET's context deadline was.
func (c *countingTransport) hangingDeadline() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline.Sub(c.sent), c.hasDeadline
}

func TestHTTPClientOption(t *testing.T) {
	s := startFake(t, nil)
	ct := &countingTransport{next: DefaultTransport()}
	// A client-wide timeout would cut every hanging GET short (google-cloud-go#11035).
	hc := &http.Client{Transport: ct, Timeout: 50 * time.Millisecond}
	p, err := New(Options{Endpoint: "http://" + s.Addr(), HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	if hc.Timeout != 50*time.Millisecond {
		t.Error("New changed the caller's client")
	}
	w := startWatch(t, p)
	w.rec.next(t, "the first update", func(u update) bool { return true })
	waitParked(t, s, PathPreempted)
	// The caller's 50 ms timeout would show as a deadline on each request's context; the
	// hanging GET must carry its own bound (waitTimeout) instead.
	if d, ok := ct.hangingDeadline(); !ok || d < waitTimeout-10*time.Second {
		t.Errorf("the hanging GET's deadline is %v away (set %v), want about %v: the caller's timeout cuts it", d, ok, waitTimeout)
	}
	s.Set(PathPreempted, PreemptedTrue)
	w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	if ct.n.Load() == 0 {
		t.Error("the caller's transport carried no request")
	}
	for _, u := range w.rec.pending() {
		if u.err != nil {
			t.Errorf("update with error: %v", u.err)
		}
	}
}

func TestGCEMetadataHostWhenNoEndpoint(t *testing.T) {
	s := startFake(t, map[string]string{PathPreempted: PreemptedTrue})
	t.Setenv("GCE_METADATA_HOST", s.Addr())
	p, err := New(Options{Clock: clocktesting.NewFakePassiveClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := p.Poll(context.Background())
	checkErr(t, err, "")
	if len(ns) != 1 {
		t.Errorf("got %q, want the preemption", summaries(ns))
	}
}

// update is one call of Watch's update.
type update struct {
	at      time.Time
	notices []providers.Notice
	err     error
}

// recorder keeps Watch's updates; next waits for the first unseen one that matches.
type recorder struct {
	t       *testing.T
	mu      sync.Mutex
	ups     []update
	seen    int
	changed chan struct{}
	busy    atomic.Bool
	stopped atomic.Bool
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, changed: make(chan struct{})}
}

func (r *recorder) update(ns []providers.Notice, err error) {
	if r.busy.Swap(true) {
		r.t.Error("update called concurrently")
	}
	defer r.busy.Store(false)
	if r.stopped.Load() {
		r.t.Error("update called after Watch returned")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ups = append(r.ups, update{at: time.Now(), notices: ns, err: err})
	close(r.changed)
	r.changed = make(chan struct{})
}

const waitLimit = 20 * time.Second

// next returns the first update after the last one returned that satisfies match, skipping
// the others, and fails the test when none comes within waitLimit.
func (r *recorder) next(t *testing.T, what string, match func(update) bool) update {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		r.mu.Lock()
		for r.seen < len(r.ups) {
			u := r.ups[r.seen]
			r.seen++
			if match(u) {
				r.mu.Unlock()
				return u
			}
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no update with %s within %v; updates: %s", what, waitLimit, r.dump())
		}
	}
}

// pending returns the updates not yet returned by next.
func (r *recorder) pending() []update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]update(nil), r.ups[r.seen:]...)
}

func (r *recorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, u := range r.ups {
		fmt.Fprintf(&b, "\n  %s %q err=%v", u.at.Format("15:04:05.000"), summaries(u.notices), u.err)
	}
	return b.String()
}

func hasKind(k providers.Kind) func(update) bool {
	return func(u update) bool {
		return u.err == nil && slices.ContainsFunc(u.notices, func(n providers.Notice) bool { return n.Kind == k })
	}
}

func empty(u update) bool { return u.err == nil && len(u.notices) == 0 }

type watchRun struct {
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
}

func startWatch(t *testing.T, p *Provider) *watchRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchRun{rec: newRecorder(t), cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := p.Watch(ctx, w.rec.update)
		w.rec.stopped.Store(true)
		w.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(waitLimit):
			t.Error("Watch did not return after cancel")
		}
	})
	return w
}

// waitParked waits until a hanging GET on path is held by the server.
func waitParked(t *testing.T, s *gcpmeta.Server, path string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) {
		return s.Waiting(path) > 0, nil
	}); err != nil {
		t.Fatalf("no hanging GET on %s within %v", path, waitLimit)
	}
}

func TestWatchLatency(t *testing.T) {
	s := startFake(t, nil)
	clk := clocktesting.NewFakePassiveClock(t0)
	w := startWatch(t, newProvider(t, s, clk))
	w.rec.next(t, "no notice", empty)

	var lat []time.Duration
	measure := func(path, value, what string, match func(update) bool) update {
		t.Helper()
		waitParked(t, s, path)
		start := time.Now()
		s.Set(path, value)
		u := w.rec.next(t, what, match)
		d := u.at.Sub(start)
		if d >= time.Second {
			t.Errorf("%s reached update after %v, want < 1s", what, d)
		}
		lat = append(lat, d)
		return u
	}
	for i := range 5 {
		clk.SetTime(t0.Add(time.Duration(i) * time.Minute))
		u := measure(PathPreempted, PreemptedTrue, "the preemption", hasKind(providers.KindPreemption))
		if n := u.notices[0]; !n.NoticeTime.Equal(clk.Now()) || !n.Deadline.Equal(clk.Now().Add(30*time.Second)) {
			t.Errorf("preemption %s: want noticed now, deadline 30s later", summary(n))
		}
		measure(PathPreempted, PreemptedFalse, "the preemption withdrawn", empty)
	}
	u := measure(PathMaintenanceEvent, MaintenanceMigrate, "the migration", hasKind(providers.KindScheduledMaintenance))
	if n := u.notices[0]; !n.Deadline.IsZero() || n.Interrupts() {
		t.Errorf("migration %s: want a soft notice", summary(n))
	}
	u = measure(PathMaintenanceEvent, MaintenanceTerminate, "the termination", hasKind(providers.KindTermination))
	// Standard VM: first seen + 120 s.
	if want := []string{"termination terminate-on-host-maintenance deadline=10:06:00 noticed=10:04:00"}; !slices.Equal(summaries(u.notices), want) {
		t.Errorf("got %q, want %q", summaries(u.notices), want)
	}
	measure(PathMaintenanceEvent, MaintenanceNone, "the termination withdrawn", empty)

	sorted := slices.Clone(lat)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("notice-to-update latency over %d changes: min %v, median %v, max %v", len(sorted), sorted[0], sorted[len(sorted)/2], sorted[len(sorted)-1])
}

func TestWatchDeduplicates(t *testing.T) {
	s := startFake(t, nil)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
	w.rec.next(t, "no notice", empty)

	// The same value again comes back from the hanging GET with a new ETag: no update.
	waitParked(t, s, PathPreempted)
	before := s.Count(PathPreempted)
	s.Set(PathPreempted, PreemptedFalse)
	if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) {
		return s.Count(PathPreempted) >= before+1 && s.Waiting(PathPreempted) > 0, nil
	}); err != nil {
		t.Fatal("the hanging GET was not re-armed")
	}
	s.Set(PathPreempted, PreemptedTrue)
	w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	w.rec.mu.Lock()
	n := len(w.rec.ups)
	w.rec.mu.Unlock()
	if n != 2 {
		t.Errorf("got %d updates, want 2 (start, preemption): %s", n, w.rec.dump())
	}
}

func TestWatchServerIgnoringLastETag(t *testing.T) {
	s := startFake(t, nil)
	s.SetIgnoreWaitForChange(true)
	timers := clocktesting.NewFakeClock(t0)
	p, err := New(Options{Endpoint: s.Addr(), Clock: timers, Timers: timers})
	if err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, p)
	w.rec.next(t, "no notice", empty)

	// Such a server answers every hanging GET at once. Watch must neither spin nor repeat
	// the unchanged set; it falls back to one read per minAnswerInterval. On the fake clock
	// each follower (one per notice path) then waits on a timer, so nothing more is read
	// until the clock moves, and each step of minAnswerInterval gives exactly one read.
	paused := func(want int) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) {
			return timers.Waiters() == len(noticePaths) && s.Count(PathPreempted) >= want, nil
		}); err != nil {
			t.Fatalf("the followers did not pause after %d reads (%d reads, %d waiting)", want, s.Count(PathPreempted), timers.Waiters())
		}
	}
	paused(0)
	before := s.Count(PathPreempted)
	for i := 1; i <= 3; i++ {
		timers.Step(minAnswerInterval)
		paused(before + i)
	}
	if n := s.Count(PathPreempted) - before; n != 3 {
		t.Errorf("%d reads over 3 pauses of %v, want 3: Watch spins", n, minAnswerInterval)
	}
	if p := w.rec.pending(); len(p) != 0 {
		t.Errorf("unchanged values gave updates: %s", w.rec.dump())
	}
	set := time.Now()
	s.Set(PathPreempted, PreemptedTrue)
	timers.Step(minAnswerInterval)
	u := w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	t.Logf("latency against a server ignoring last_etag: %v", u.at.Sub(set))
}

func TestWatch503Burst(t *testing.T) {
	s := startFake(t, nil)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
	w.rec.next(t, "no notice", empty)

	// A short burst on the re-armed hanging GET is absorbed by the library's retries.
	waitParked(t, s, PathPreempted)
	s.SetError(PathPreempted, http.StatusServiceUnavailable, 3)
	s.Set(PathPreempted, PreemptedTrue)
	w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	waitParked(t, s, PathPreempted)
	s.Set(PathPreempted, PreemptedFalse)
	w.rec.next(t, "the preemption withdrawn", empty)
	for _, u := range w.rec.pending() {
		if u.err != nil {
			t.Errorf("short burst reported: %v", u.err)
		}
	}

	// A longer one outlasts them: update gets the error with the last good notices, then
	// Watch backs off, reads again and recovers.
	waitParked(t, s, PathPreempted)
	s.SetError(PathPreempted, http.StatusServiceUnavailable, 8)
	s.Set(PathPreempted, PreemptedTrue)
	w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	failed := w.rec.next(t, "a 503 error", func(u update) bool { return u.err != nil })
	var se *SourceError
	if !errors.As(failed.err, &se) || se.StatusCode() != http.StatusServiceUnavailable || se.Path != PathPreempted {
		t.Errorf("got error %v, want a 503 SourceError for %s", failed.err, PathPreempted)
	}
	if len(failed.notices) != 1 || failed.notices[0].Kind != providers.KindPreemption {
		t.Errorf("with the error: got %q, want the last good preemption", summaries(failed.notices))
	}
	w.rec.next(t, "recovery", hasKind(providers.KindPreemption))
	waitParked(t, s, PathPreempted)
	s.Set(PathPreempted, PreemptedFalse)
	w.rec.next(t, "the preemption withdrawn", empty)
}

func TestWatchReconnectKeepsChange(t *testing.T) {
	s := startFake(t, nil)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
	w.rec.next(t, "no notice", empty)
	waitParked(t, s, PathPreempted)
	waitParked(t, s, PathMaintenanceEvent)

	// The server goes away with both hanging GETs, the values change meanwhile.
	s.SetOffline(true)
	s.Set(PathPreempted, PreemptedTrue)
	s.Set(PathMaintenanceEvent, MaintenanceTerminate)
	failed := w.rec.next(t, "connection errors on both paths", func(u update) bool {
		return u.err != nil && strings.Contains(u.err.Error(), PathPreempted) && strings.Contains(u.err.Error(), PathMaintenanceEvent)
	})
	if len(failed.notices) != 0 {
		t.Errorf("while unreachable: got %q, want nothing invented", summaries(failed.notices))
	}
	s.SetOffline(false)
	u := w.rec.next(t, "both changes", func(u update) bool {
		return hasKind(providers.KindPreemption)(u) && hasKind(providers.KindTermination)(u)
	})
	t.Logf("recovered after %v", u.at.Sub(failed.at))
	// After a failure Watch reads the current value before waiting again: a hanging GET
	// without last_etag would wait past a change made while it was disconnected.
	for _, path := range noticePaths {
		for _, r := range s.Requests() {
			if r.Path == path && r.Status == http.StatusOK && r.Time.After(failed.at) {
				if r.Query.Has("wait_for_change") {
					t.Errorf("%s: first answer after the failure was to a hanging GET (%v)", path, r.Query)
				}
				break
			}
		}
	}

	// Re-armed: later changes arrive too.
	waitParked(t, s, PathPreempted)
	s.Set(PathPreempted, PreemptedFalse)
	w.rec.next(t, "the preemption withdrawn", func(u update) bool {
		return u.err == nil && len(u.notices) == 1 && u.notices[0].Kind == providers.KindTermination
	})
}

func TestWatchDroppedConnection(t *testing.T) {
	s := startFake(t, nil)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
	w.rec.next(t, "no notice", empty)
	for range 3 {
		waitParked(t, s, PathPreempted)
		s.DropConnections()
		s.Set(PathPreempted, PreemptedTrue)
		w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
		waitParked(t, s, PathPreempted)
		s.DropConnections()
		s.Set(PathPreempted, PreemptedFalse)
		w.rec.next(t, "the preemption withdrawn", empty)
	}
}

func TestWatchUnknownValue(t *testing.T) {
	s := startFake(t, map[string]string{PathMaintenanceEvent: MaintenanceTerminate})
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
	good := w.rec.next(t, "the termination", hasKind(providers.KindTermination))

	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, "REBOOT_ON_HOST_MAINTENANCE")
	u := w.rec.next(t, "an error", func(u update) bool { return u.err != nil })
	checkErr(t, u.err, `"REBOOT_ON_HOST_MAINTENANCE"`)
	if !slices.Equal(summaries(u.notices), summaries(good.notices)) || u.notices[0].ID != good.notices[0].ID {
		t.Errorf("got %q, want the last good %q", summaries(u.notices), summaries(good.notices))
	}
	// Watch waits for the next value rather than asking again.
	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, MaintenanceNone)
	w.rec.next(t, "the termination withdrawn", empty)
}

func TestWatchSchedulingRetried(t *testing.T) {
	s := startFake(t, map[string]string{PathMaintenanceEvent: MaintenanceTerminate})
	s.SetError(PathPreemptible, http.StatusForbidden, 1)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))

	// Until the VM is known to be standard, the shorter Spot grace applies.
	u := w.rec.next(t, "the first update", func(update) bool { return true })
	checkErr(t, u.err, PathPreemptible)
	if want := []string{"termination terminate-on-host-maintenance deadline=10:00:30 noticed=10:00:00"}; !slices.Equal(summaries(u.notices), want) {
		t.Errorf("got %q, want %q", summaries(u.notices), want)
	}
	u = w.rec.next(t, "the standard deadline", func(u update) bool { return u.err == nil })
	if want := []string{"termination terminate-on-host-maintenance deadline=10:02:00 noticed=10:00:00"}; !slices.Equal(summaries(u.notices), want) {
		t.Errorf("got %q, want %q", summaries(u.notices), want)
	}
}

func TestWatchCancel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*testing.T, *gcpmeta.Server, *watchRun)
	}{
		{name: "hanging GETs held", setup: func(t *testing.T, s *gcpmeta.Server, _ *watchRun) {
			waitParked(t, s, PathPreempted)
			waitParked(t, s, PathMaintenanceEvent)
		}},
		{name: "server unreachable, backing off", setup: func(t *testing.T, s *gcpmeta.Server, w *watchRun) {
			s.SetOffline(true)
			w.rec.next(t, "an error", func(u update) bool { return u.err != nil })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, nil)
			w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))
			w.rec.next(t, "the first update", func(update) bool { return true })
			tc.setup(t, s, w)
			start := time.Now()
			w.cancel()
			select {
			case err := <-w.done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Watch returned %v, want context.Canceled", err)
				}
				el := time.Since(start)
				if el > 500*time.Millisecond {
					t.Errorf("Watch took %v to return", el)
				}
				t.Logf("Watch returned %v after cancel", el)
				w.done <- err // for the cleanup
			case <-time.After(waitLimit):
				t.Fatal("Watch did not return after cancel")
			}
		})
	}
}
