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
	window := &Upcoming{Status: UpcomingStatusPending, Type: UpcomingTypeScheduled, WindowStart: t0.Add(50 * time.Minute), WindowEnd: t0.Add(5 * time.Hour), since: t0.Add(-time.Hour)}
	weeks := &Upcoming{Status: UpcomingStatusPending, Type: UpcomingTypeScheduled, WindowStart: t0.Add(21 * 24 * time.Hour), since: t0}
	tests := []struct {
		name string
		st   state
		want []string
	}{
		{name: "nothing pending", st: state{preempted: PreemptedFalse, maintenance: MaintenanceNone}, want: []string{}},
		{name: "nothing read yet", st: state{spot: true}, want: []string{}},
		{name: "preempted", st: state{preempted: PreemptedTrue, preemptedSince: t0, maintenance: MaintenanceNone},
			want: []string{"preemption preempt deadline=10:00:30 noticed=10:00:00"}},
		// Issue 13: GPU VMs get a one-hour notice; the deadline is the maintenance's start,
		// not first seen + 120 s (30 s on Spot), and the kind is scheduled maintenance so
		// that --maintenance-lead applies.
		// Issue 21: the hour is a GPU VM's; an ordinary VM gets 60 s ("Handling GPU host
		// maintenance events"), and a VM that cannot be told gets the shorter notice.
		{name: "terminate without a window, GPU machine family: one hour after first seen",
			st:   state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/a2-highgpu-1g"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate, GPU VM on Spot: the same hour",
			st:   state{maintenance: MaintenanceTerminate, maintenanceSince: t0, spot: true, machineType: "projects/1/machineTypes/g2-standard-8"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate without a window, ordinary VM: 60 s",
			st:   state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/n2-standard-4"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:00 noticed=10:00:00"}},
		{name: "terminate, machine type unknown: the shorter notice", st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:00 noticed=10:00:00"}},
		{name: "terminate, N1 with a GPU on the node: one hour",
			st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/n1-standard-8",
				win: windows{node: func() (bool, string, bool) { return true, "nvidia.com/gpu: 1", true }}},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate, N1 without a GPU on the node: 60 s",
			st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/n1-standard-8",
				win: windows{node: func() (bool, string, bool) { return false, "", true }}},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:00 noticed=10:00:00"}},
		{name: "terminate, notice set by the option wins over a GPU machine",
			st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/a3-highgpu-8g",
				win: windows{maintenance: 20 * time.Minute}},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:20:00 noticed=10:00:00"}},
		{name: "terminate, notice set by the option wins over an ordinary machine",
			st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/e2-medium",
				win: windows{maintenance: 20 * time.Minute}},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:20:00 noticed=10:00:00"}},
		// Issue 21: with scheduling.preemptionNoticeDuration 120 s, preempted=TRUE comes 120 s
		// before the soft-off and the power-off 30 s after it.
		{name: "preempted with an extended notice: 150 s",
			st:   state{preempted: PreemptedTrue, preemptedSince: t0, maintenance: MaintenanceNone, win: windows{preemption: 120 * time.Second}},
			want: []string{"preemption preempt deadline=10:02:30 noticed=10:00:00"}},
		{name: "terminate with a window: its start",
			st: state{maintenance: MaintenanceTerminate, maintenanceSince: t0, upcoming: window},
			want: []string{
				// Same deadline and kind: ordered by ID.
				"scheduled-maintenance upcoming-maintenance scheduled pending deadline=10:50:00 noticed=09:00:00",
				"scheduled-maintenance terminate-on-host-maintenance deadline=10:50:00 noticed=10:00:00",
			}},
		{name: "a window weeks ahead on a VM that stops",
			st:   state{maintenance: MaintenanceNone, upcoming: weeks},
			want: []string{"scheduled-maintenance upcoming-maintenance scheduled pending deadline=10:00:00 noticed=10:00:00"}},
		{name: "a window on a VM that live-migrates is information",
			st:   state{maintenance: MaintenanceNone, upcoming: window, migrates: true},
			want: []string{"maintenance-information upcoming-maintenance scheduled pending deadline=- noticed=09:00:00"}},
		{name: "migrate is a soft notice", st: state{maintenance: MaintenanceMigrate, maintenanceSince: t0},
			want: []string{"scheduled-maintenance migrate-on-host-maintenance deadline=- noticed=10:00:00"}},
		{name: "an unknown value is a soft notice", st: state{maintenance: "REBOOT_ON_HOST_MAINTENANCE", maintenanceSince: t0},
			want: []string{"scheduled-maintenance reboot-on-host-maintenance deadline=- noticed=10:00:00"}},
		{name: "preempted during a terminate, earliest deadline first",
			st: state{preempted: PreemptedTrue, preemptedSince: later, maintenance: MaintenanceTerminate, maintenanceSince: t0, machineType: "projects/1/machineTypes/a2-highgpu-1g"},
			want: []string{
				"preemption preempt deadline=10:01:15 noticed=10:00:45",
				"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.st.notices()
			got := summaries(ns)
			// Weeks ahead does not fit in hh:mm:ss: check that deadline apart.
			if tc.st.upcoming == weeks {
				if len(ns) != 1 || !ns[0].Deadline.Equal(weeks.WindowStart) {
					t.Fatalf("got %q, want the window's start as the deadline", got)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for _, n := range ns {
				if n.Provider != Name || n.ID == "" {
					t.Errorf("notice %+v: want provider %q and an ID", n, Name)
				}
				if want := !n.Deadline.IsZero() && n.Kind != providers.KindMaintenanceInformation; n.Interrupts() != want {
					t.Errorf("notice %s: Interrupts() = %v, want %v", summary(n), n.Interrupts(), want)
				}
				if n.Kind == providers.KindTermination {
					t.Errorf("notice %s: GCP gives no termination notice", summary(n))
				}
			}
		})
	}
}

// maintenance is parseMaintenanceEvent in TestParseValues' shape: an unknown value is
// returned as "unknown VALUE".
func maintenance(v string) (string, error) {
	m, known, err := parseMaintenanceEvent(v)
	if err == nil && !known {
		m = "unknown " + m
	}
	return m, err
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
		{"maintenance NONE", maintenance, "NONE", MaintenanceNone, ""},
		{"maintenance migrate", maintenance, "MIGRATE_ON_HOST_MAINTENANCE", MaintenanceMigrate, ""},
		{"maintenance terminate", maintenance, " TERMINATE_ON_HOST_MAINTENANCE\n", MaintenanceTerminate, ""},
		// GCE may add values: information, not an error.
		{"maintenance unknown", maintenance, "REBOOT_ON_HOST_MAINTENANCE", "unknown REBOOT_ON_HOST_MAINTENANCE", ""},
		{"maintenance HTML", maintenance, "<html>", "", `malformed instance/maintenance-event value "<html>"`},
		{"maintenance empty", maintenance, "", "", `malformed instance/maintenance-event value ""`},
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
		// GPU VMs: a one-hour notice, whatever the provisioning model (issue 13).
		{name: "terminate, standard VM", values: map[string]string{PathMachineType: "projects/1/machineTypes/a2-highgpu-1g", PathMaintenanceEvent: MaintenanceTerminate},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate, standard provisioning model", values: map[string]string{PathMachineType: "projects/1/machineTypes/a2-highgpu-1g", PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "FALSE", PathProvisioningModel: "STANDARD"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate, preemptible VM", values: map[string]string{PathMachineType: "projects/1/machineTypes/a2-highgpu-1g", PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "TRUE"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		{name: "terminate, Spot VM", values: map[string]string{PathMachineType: "projects/1/machineTypes/a2-highgpu-1g", PathMaintenanceEvent: MaintenanceTerminate, PathPreemptible: "FALSE", PathProvisioningModel: "SPOT"},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=11:00:00 noticed=10:00:00"}},
		// Issue 21: an ordinary VM gets 60 s; the fake serves machine type n2-standard-4 by
		// default, and one that is not served (404) is treated the same.
		{name: "terminate, ordinary VM", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:00 noticed=10:00:00"}},
		{name: "terminate, machine type not served", values: map[string]string{PathMaintenanceEvent: MaintenanceTerminate, PathMachineType: ""},
			want: []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:00 noticed=10:00:00"}},
		{name: "GPU VM: terminate and a window, the window's start", values: withWindow(map[string]string{
			PathMaintenanceEvent: MaintenanceTerminate, PathOnHostMaintenance: "TERMINATE"}, "2026-11-29T10:50:00Z"),
			want: []string{
				"scheduled-maintenance upcoming-maintenance scheduled pending deadline=10:50:00 noticed=10:00:00",
				"scheduled-maintenance terminate-on-host-maintenance deadline=10:50:00 noticed=10:00:00",
			}},
		{name: "a window before the value changes", values: withWindow(map[string]string{PathOnHostMaintenance: "TERMINATE"}, "2026-11-29T10:50:00Z"),
			want: []string{"scheduled-maintenance upcoming-maintenance scheduled pending deadline=10:50:00 noticed=10:00:00"}},
		{name: "a window on a live-migrating VM: information only", values: withWindow(map[string]string{PathOnHostMaintenance: "MIGRATE"}, "2026-11-29T10:50:00Z"),
			want: []string{"maintenance-information upcoming-maintenance scheduled pending deadline=- noticed=10:00:00"}},
		{name: "unknown maintenance value: soft notice, no error", values: map[string]string{PathMaintenanceEvent: "REBOOT_ON_HOST_MAINTENANCE"},
			want: []string{"scheduled-maintenance reboot-on-host-maintenance deadline=- noticed=10:00:00"}},
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

// withWindow adds a pending scheduled upcoming-maintenance window starting at start (RFC 3339)
// to values, as the fake's keys.
func withWindow(values map[string]string, start string) map[string]string {
	values[gcpmeta.PathUpcomingMaintenance+"maintenance-status"] = "PENDING"
	values[gcpmeta.PathUpcomingMaintenance+"type"] = "SCHEDULED"
	values[gcpmeta.PathUpcomingMaintenance+"window-start-time"] = start
	values[gcpmeta.PathUpcomingMaintenance+"can-reschedule"] = "false"
	return values
}

func TestPollUpcomingMaintenance(t *testing.T) {
	s := startFake(t, map[string]string{PathOnHostMaintenance: "TERMINATE"})
	clk := clocktesting.NewFakePassiveClock(t0)
	p := newProvider(t, s, clk)
	poll := func(wantErr string) []providers.Notice {
		t.Helper()
		ns, err := p.Poll(context.Background())
		checkErr(t, err, wantErr)
		return ns
	}
	start := t0.Add(3 * 24 * time.Hour)
	s.SetUpcomingMaintenance(gcpmeta.UpcomingMaintenance{Status: "PENDING", Type: "SCHEDULED", WindowStart: start, WindowEnd: start.Add(4 * time.Hour), CanReschedule: true})
	first := poll("")
	if len(first) != 1 || first[0].Kind != providers.KindScheduledMaintenance || !first[0].Deadline.Equal(start) {
		t.Fatalf("got %q, want a maintenance notice with the window's start as deadline", summaries(first))
	}
	if !strings.Contains(first[0].Description, "can be rescheduled") {
		t.Errorf("description %q does not say the window can be rescheduled", first[0].Description)
	}

	// A malformed answer keeps the last good window and names the source.
	s.Set(gcpmeta.PathUpcomingMaintenance+"window-start-time", "next Tuesday")
	kept := poll(`decoding instance/upcoming-maintenance/: key "windowStartTime": parsing time "next Tuesday"`)
	if len(kept) != 1 || kept[0].ID != first[0].ID {
		t.Errorf("malformed: got %q, want the last good window", summaries(kept))
	}

	// Rescheduled: the deadline moves, under a new ID.
	clk.SetTime(t0.Add(time.Hour))
	moved := start.Add(24 * time.Hour)
	s.Set(gcpmeta.PathUpcomingMaintenance+"window-start-time", moved.Format(time.RFC3339))
	ns := poll("")
	if len(ns) != 1 || !ns[0].Deadline.Equal(moved) || ns[0].ID == first[0].ID || !ns[0].NoticeTime.Equal(clk.Now()) {
		t.Errorf("rescheduled: got %q (ID %s, first %s), want the new start under a new ID", summaries(ns), ns[0].ID, first[0].ID)
	}
	// The status turning ONGOING is the same window: same ID.
	s.Set(gcpmeta.PathUpcomingMaintenance+"maintenance-status", "ONGOING")
	if again := poll(""); len(again) != 1 || again[0].ID != ns[0].ID || !again[0].NoticeTime.Equal(ns[0].NoticeTime) {
		t.Errorf("ONGOING: got %q, want the same notice", summaries(again))
	}
	// Gone (done or cancelled): withdrawn.
	s.ClearUpcomingMaintenance()
	if gone := poll(""); len(gone) != 0 {
		t.Errorf("after the window disappeared: got %q, want nothing", summaries(gone))
	}
}

func TestParseUpcoming(t *testing.T) {
	tests := []struct {
		name, body, want, wantErr string
	}{
		{name: "GCE's recursive answer (camelCase)",
			body: `{"canReschedule":"true","latestWindowStartTime":"2026-12-10T09:00:00Z","maintenanceStatus":"PENDING","type":"SCHEDULED","windowEndTime":"2026-12-03T13:00:00Z","windowStartTime":"2026-12-03T09:00:00Z"}`,
			want: "SCHEDULED PENDING 2026-12-03T09:00:00Z-2026-12-03T13:00:00Z latest=2026-12-10T09:00:00Z reschedule=true"},
		{name: "hyphenated keys and a boolean",
			body: `{"maintenance-status":"ongoing","type":"UNSCHEDULED","window-start-time":"2026-12-03T09:00:00.5Z","can-reschedule":false}`,
			want: "UNSCHEDULED ONGOING 2026-12-03T09:00:00Z-0001-01-01T00:00:00Z latest=0001-01-01T00:00:00Z reschedule=false"},
		{name: "unknown keys are no error", body: `{"type":"SCHEDULED","windowStartTime":"2026-12-03T09:00:00Z","newKey":"x"}`,
			want: "SCHEDULED  2026-12-03T09:00:00Z-0001-01-01T00:00:00Z latest=0001-01-01T00:00:00Z reschedule=false"},
		{name: "HTML", body: "<html>", wantErr: "decoding instance/upcoming-maintenance/"},
		{name: "an array", body: `[]`, wantErr: "cannot unmarshal array"},
		{name: "null", body: `null`, wantErr: "not an object"},
		{name: "empty object", body: `{}`, wantErr: "no maintenance-status, type nor window-start-time"},
		{name: "a number for a time", body: `{"windowStartTime":5}`, wantErr: `key "windowStartTime": want a string`},
		{name: "a bad time", body: `{"windowStartTime":"tomorrow"}`, wantErr: `parsing time "tomorrow"`},
		{name: "a bad boolean", body: `{"type":"SCHEDULED","canReschedule":"maybe"}`, wantErr: `want true or false, got "maybe"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := ParseUpcoming([]byte(tc.body))
			checkErr(t, err, tc.wantErr)
			if err != nil {
				return
			}
			got := fmt.Sprintf("%s %s %s-%s latest=%s reschedule=%v", u.Type, u.Status, u.WindowStart.UTC().Truncate(time.Second).Format(time.RFC3339),
				u.WindowEnd.UTC().Format(time.RFC3339), u.LatestWindowStart.UTC().Format(time.RFC3339), u.CanReschedule)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
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

	// A malformed value keeps the last good one, and the error names it.
	s.Set(PathMaintenanceEvent, "<html>")
	kept := poll(`malformed instance/maintenance-event value "<html>"`)
	if len(kept) != 1 || kept[0].ID != first[0].ID {
		t.Errorf("malformed value: got %q, want the last good notice kept", summaries(kept))
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
		// An ordinary VM (the fake's default machine type): first seen + 60 s (issue 21).
		"scheduled-maintenance terminate-on-host-maintenance deadline=10:01:20 noticed=10:00:20",
	}
	if got := summaries(both); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if both[1].ID == first[0].ID {
		t.Error("a second maintenance event kept the first one's ID")
	}
	s.Set(PathPreempted, PreemptedFalse)
	if got := summaries(poll("")); len(got) != 1 || !strings.HasPrefix(got[0], "scheduled-maintenance terminate") {
		t.Errorf("preempted FALSE: got %q, want only the maintenance", got)
	}

	// The scheduling values were read once for the provider's lifetime.
	if n := s.Count(PathPreemptible) + s.Count(PathProvisioningModel) + s.Count(PathOnHostMaintenance); n != 3 {
		t.Errorf("scheduling values read %d times, want 3 (once each)", n)
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

// hasAction matches an update without error holding a notice with the given action.
func hasAction(a string) func(update) bool {
	return func(u update) bool {
		return u.err == nil && slices.ContainsFunc(u.notices, func(n providers.Notice) bool { return n.Action == a })
	}
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
	u = measure(PathMaintenanceEvent, MaintenanceTerminate, "the termination", hasAction(actionTerminateMaintenance))
	// An ordinary VM (the fake's default machine type): first seen + 60 s (issue 21).
	if want := []string{"scheduled-maintenance terminate-on-host-maintenance deadline=10:05:00 noticed=10:04:00"}; !slices.Equal(summaries(u.notices), want) {
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
			// One timer per follower, and the upcoming-maintenance poll's.
			// No request under way: its bound's timer would count as a waiter.
			return p.inflight.Load() == 0 && timers.Waiters() == len(noticePaths)+1 && s.Count(PathPreempted) >= want, nil
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
		return hasKind(providers.KindPreemption)(u) && hasAction(actionTerminateMaintenance)(u)
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
		return u.err == nil && len(u.notices) == 1 && u.notices[0].Action == actionTerminateMaintenance
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
	good := w.rec.next(t, "the termination", hasAction(actionTerminateMaintenance))

	// A value GCE added is information: a maintenance notice without a deadline, no error.
	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, "REBOOT_ON_HOST_MAINTENANCE")
	u := w.rec.next(t, "the unknown value", hasAction("reboot-on-host-maintenance"))
	if n := u.notices[0]; n.Kind != providers.KindScheduledMaintenance || !n.Deadline.IsZero() || n.Interrupts() {
		t.Errorf("unknown value: got %s, want a maintenance notice without a deadline", summary(n))
	}
	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, MaintenanceTerminate)
	good = w.rec.next(t, "the termination", hasAction(actionTerminateMaintenance))

	// A malformed one is an error, and keeps the last good value.
	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, "<html><body>500</body></html>")
	u = w.rec.next(t, "an error", func(u update) bool { return u.err != nil })
	checkErr(t, u.err, `malformed instance/maintenance-event value "<html>`)
	if !slices.Equal(summaries(u.notices), summaries(good.notices)) || u.notices[0].ID != good.notices[0].ID {
		t.Errorf("got %q, want the last good %q", summaries(u.notices), summaries(good.notices))
	}
	// Watch waits for the next value rather than asking again.
	waitParked(t, s, PathMaintenanceEvent)
	s.Set(PathMaintenanceEvent, MaintenanceNone)
	w.rec.next(t, "the termination withdrawn", empty)
}

func TestWatchSchedulingRetried(t *testing.T) {
	s := startFake(t, withWindow(map[string]string{PathOnHostMaintenance: "MIGRATE"}, "2026-11-29T10:50:00Z"))
	s.SetError(PathOnHostMaintenance, http.StatusForbidden, 1)
	w := startWatch(t, newProvider(t, s, clocktesting.NewFakePassiveClock(t0)))

	// Until the VM is known to live-migrate, its window is taken as a stop.
	u := w.rec.next(t, "the first update", func(update) bool { return true })
	checkErr(t, u.err, PathOnHostMaintenance)
	if want := []string{"scheduled-maintenance upcoming-maintenance scheduled pending deadline=10:50:00 noticed=10:00:00"}; !slices.Equal(summaries(u.notices), want) {
		t.Errorf("got %q, want %q", summaries(u.notices), want)
	}
	u = w.rec.next(t, "information only", func(u update) bool { return u.err == nil })
	if want := []string{"maintenance-information upcoming-maintenance scheduled pending deadline=- noticed=10:00:00"}; !slices.Equal(summaries(u.notices), want) {
		t.Errorf("got %q, want %q", summaries(u.notices), want)
	}
}

// TestWatchStallNoticed: a hanging GET that the server stops answering (connection open, no
// reset) blinds the watch for at most waitTimeout; the preemption posted meanwhile is then
// read by the re-issued request. On the fake clock, stepping waitTimeout ends the stalled
// request; with the old 70 s bound it would not.
func TestWatchStallNoticed(t *testing.T) {
	if waitSeconds > 10 || waitTimeout > 15*time.Second {
		t.Fatalf("hanging GETs wait %d s, bounded at %v: a stall hides a preemption (30 s) for too long", waitSeconds, waitTimeout)
	}
	s := startFake(t, nil)
	timers := clocktesting.NewFakeClock(t0)
	p, err := New(Options{Endpoint: s.Addr(), Clock: timers, Timers: timers})
	if err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, p)
	w.rec.next(t, "no notice", empty)
	waitParked(t, s, PathPreempted)
	for _, r := range s.Requests() {
		if r.Query.Has("wait_for_change") {
			t.Fatalf("a hanging GET was answered before any change: %+v", r)
		}
	}
	s.StallHeld()
	s.Set(PathPreempted, PreemptedTrue)
	before := s.Count(PathPreempted)
	// Nothing comes back while the stall lasts and the clock stands.
	timers.Step(waitTimeout - time.Second)
	if pend := w.rec.pending(); len(pend) != 0 {
		t.Fatalf("updates during the stall: %s", w.rec.dump())
	}
	timers.Step(time.Second)
	// The stalled request is re-issued at once, with no backoff to step through.
	u := w.rec.next(t, "the preemption", hasKind(providers.KindPreemption))
	if n := u.notices[0]; !n.NoticeTime.Equal(t0.Add(waitTimeout)) {
		t.Errorf("preemption noticed at %s, want at the stall's bound %s", hhmmss(n.NoticeTime), hhmmss(t0.Add(waitTimeout)))
	}
	reported := false
	w.rec.mu.Lock()
	for _, up := range w.rec.ups {
		reported = reported || errors.Is(up.err, ErrNoAnswer)
	}
	w.rec.mu.Unlock()
	if !reported {
		t.Errorf("the stall was not reported: %s", w.rec.dump())
	}
	if n := s.Count(PathPreempted); n <= before {
		t.Errorf("no new request for %s after the stall", PathPreempted)
	}
	t.Logf("preemption seen %v after the stall's bound on the fake clock", u.at.Sub(time.Now()).Abs())
	for _, r := range s.Requests() {
		if r.Query.Has("timeout_sec") && r.Query.Get("timeout_sec") != fmt.Sprint(waitSeconds) {
			t.Errorf("hanging GET with timeout_sec=%s, want %d", r.Query.Get("timeout_sec"), waitSeconds)
		}
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

// TestSpotFromProvisioningModel: the Spot key is instance/scheduling/provisioning-model
// (hyphenated, as every GCE key), with preemptible as the fallback for preemptible VMs.
func TestSpotFromProvisioningModel(t *testing.T) {
	tests := []struct {
		name     string
		values   map[string]string
		wantSpot bool
	}{
		{"SPOT, no preemptible key", map[string]string{"instance/scheduling/provisioning-model": "SPOT"}, true},
		{"STANDARD", map[string]string{"instance/scheduling/provisioning-model": "STANDARD", PathPreemptible: "FALSE"}, false},
		{"preemptible fallback", map[string]string{PathPreemptible: "TRUE"}, true},
		// A server that spells the key with an underscore is not GCE: ignored.
		{"underscore spelling", map[string]string{"instance/scheduling/provisioning_model": "SPOT", PathPreemptible: "FALSE"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, tc.values)
			p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
			if _, err := p.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			p.mu.Lock()
			spot := p.st.spot
			p.mu.Unlock()
			if spot != tc.wantSpot {
				t.Errorf("spot = %v, want %v", spot, tc.wantSpot)
			}
			s.Set(PathPreempted, PreemptedTrue)
			ns, err := p.Poll(context.Background())
			if err != nil || len(ns) != 1 {
				t.Fatalf("preempted: got %q, %v", summaries(ns), err)
			}
			if got := strings.Contains(ns[0].Description, "standard"); got == tc.wantSpot {
				t.Errorf("description %q on a VM with spot=%v", ns[0].Description, tc.wantSpot)
			}
			if n := s.Count("instance/scheduling/provisioning-model"); n != 1 {
				t.Errorf("provisioning-model read %d times, want once", n)
			}
		})
	}
}

// TestWatchReadsWindowWithMaintenanceEvent: when maintenance-event turns to
// TERMINATE_ON_HOST_MAINTENANCE, the first update already has the window's start as its
// deadline: upcoming-maintenance is read at once, not at its next poll.
func TestWatchReadsWindowWithMaintenanceEvent(t *testing.T) {
	s := startFake(t, map[string]string{PathOnHostMaintenance: "TERMINATE"})
	timers := clocktesting.NewFakeClock(t0)
	p, err := New(Options{Endpoint: s.Addr(), Clock: timers, Timers: timers})
	if err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, p)
	w.rec.next(t, "no notice", empty)
	waitParked(t, s, PathMaintenanceEvent)
	start := t0.Add(90 * time.Second)
	s.SetUpcomingMaintenance(gcpmeta.UpcomingMaintenance{Status: "PENDING", Type: "SCHEDULED", WindowStart: start, WindowEnd: start.Add(time.Hour)})
	s.Set(PathMaintenanceEvent, MaintenanceTerminate)
	// The fake clock stands: the upcoming-maintenance poll cannot have run.
	u := w.rec.next(t, "the maintenance", hasAction(actionTerminateMaintenance))
	for _, n := range u.notices {
		if !n.Deadline.Equal(start) {
			t.Errorf("notice %s: deadline %s, want the window's start %s in the first update", summary(n), hhmmss(n.Deadline), hhmmss(start))
		}
	}
	if len(u.notices) != 2 {
		t.Errorf("got %q, want the maintenance event and the window", summaries(u.notices))
	}
}
