package gcp

import (
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
		if m, err := parseMaintenanceEvent(v); err == nil && m != MaintenanceNone && m != MaintenanceMigrate && m != MaintenanceTerminate {
			t.Errorf("maintenance-event %q read as %q", v, m)
		}
		_, _ = parsePreemptible(v, true)
		_ = parseProvisioningModel(v, true)
	})
}
