package gcp

import (
	"strings"
	"testing"
)

// FuzzParseValues: whatever the metadata server answers, the parsers either refuse it or
// return one of GCE's documented values.
func FuzzParseValues(f *testing.F) {
	for _, s := range []string{"TRUE", "FALSE", "true\n", " NONE ", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE", "", "\x00{\"garbage", "SPOT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if p, err := parsePreempted(v); err == nil && p != PreemptedTrue && p != PreemptedFalse {
			t.Errorf("preempted %q read as %q", v, p)
		}
		if m, known, err := parseMaintenanceEvent(v); err == nil && known && m != MaintenanceNone && m != MaintenanceMigrate && m != MaintenanceTerminate {
			t.Errorf("maintenance-event %q read as known %q", v, m)
		} else if err == nil && !known && (m == "" || strings.Trim(m, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "") {
			t.Errorf("maintenance-event %q read as unknown value %q, want an upper-case token", v, m)
		}
		_, _ = parsePreemptible(v, true)
		_ = parseProvisioningModel(v, true)
	})
}

// FuzzParseUpcoming: whatever instance/upcoming-maintenance holds, ParseUpcoming returns a
// window or an error, never panics, and never a window with nothing in it.
func FuzzParseUpcoming(f *testing.F) {
	for _, s := range []string{
		`{"maintenanceStatus":"PENDING","type":"SCHEDULED","windowStartTime":"2026-12-01T13:00:00Z","windowEndTime":"2026-12-01T17:00:00Z","canReschedule":"true"}`,
		`{"window-start-time":"2026-12-01T13:00:00Z"}`, `[]`, `null`, `{}`, `{"type":1}`, "<html>",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUpcoming(b)
		if err == nil && (u == nil || (u.Status == "" && u.Type == "" && u.WindowStart.IsZero())) {
			t.Errorf("%q read as an empty window %+v", b, u)
		}
	})
}
