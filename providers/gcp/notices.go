package gcp

import (
	"fmt"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// The values of instance/preempted and instance/maintenance-event.
const (
	PreemptedTrue              = "TRUE"
	PreemptedFalse             = "FALSE"
	MaintenanceNone            = "NONE"
	MaintenanceMigrate         = "MIGRATE_ON_HOST_MAINTENANCE"
	MaintenanceTerminate       = "TERMINATE_ON_HOST_MAINTENANCE"
	provisioningModelSpot      = "SPOT"
	preemptibleTrue            = "TRUE"
	preemptibleFalse           = "FALSE"
	actionPreempt              = "preempt"
	actionTerminateMaintenance = "terminate-on-host-maintenance"
	actionMigrateMaintenance   = "migrate-on-host-maintenance"
)

// Between the soft-off that starts a stop and the power-off, GCE gives a Spot or preemptible VM
// 30 s and a standard VM 120 s. reprieve counts them from the moment it first sees the value.
const (
	spotGrace     = 30 * time.Second
	standardGrace = 120 * time.Second
)

// normalize trims the value (the server answers without a newline, emulators not always) and
// upper-cases it, since GCE's vocabulary is upper case.
func normalize(v string) string { return strings.ToUpper(strings.TrimSpace(v)) }

// parsePreempted validates an instance/preempted value.
func parsePreempted(v string) (string, error) {
	switch n := normalize(v); n {
	case PreemptedTrue, PreemptedFalse:
		return n, nil
	default:
		return "", fmt.Errorf("unknown %s value %q", PathPreempted, v)
	}
}

// parseMaintenanceEvent validates an instance/maintenance-event value.
func parseMaintenanceEvent(v string) (string, error) {
	switch n := normalize(v); n {
	case MaintenanceNone, MaintenanceMigrate, MaintenanceTerminate:
		return n, nil
	default:
		return "", fmt.Errorf("unknown %s value %q", PathMaintenanceEvent, v)
	}
}

// parsePreemptible validates instance/scheduling/preemptible; absent means not preemptible.
func parsePreemptible(v string, found bool) (bool, error) {
	if !found {
		return false, nil
	}
	switch normalize(v) {
	case preemptibleTrue:
		return true, nil
	case preemptibleFalse:
		return false, nil
	default:
		return false, fmt.Errorf("unknown %s value %q", PathPreemptible, v)
	}
}

// parseProvisioningModel reads instance/scheduling/provisioning_model. Only SPOT shortens the
// grace period; STANDARD, absent and models added later (FLEX_START, RESERVATION_BOUND) keep
// the standard one.
func parseProvisioningModel(v string, found bool) bool {
	return found && normalize(v) == provisioningModelSpot
}

// state is what the metadata server last said, with when reprieve first saw each value that
// gives a notice. Only validated values get here.
type state struct {
	preempted        string
	preemptedSince   time.Time
	maintenance      string
	maintenanceSince time.Time
	// spot is true for a Spot or preemptible VM, whose termination grace is shorter.
	spot bool
}

// notices maps the state onto the notices in force, sorted.
func (s state) notices() []providers.Notice {
	var ns []providers.Notice
	if s.preempted == PreemptedTrue {
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindPreemption,
			ID:          noticeID(PathPreempted, s.preempted, s.preemptedSince),
			NoticeTime:  s.preemptedSince,
			Deadline:    s.preemptedSince.Add(spotGrace),
			Action:      actionPreempt,
			Description: "GCE is preempting this Spot or preemptible VM",
		})
	}
	switch s.maintenance {
	case MaintenanceTerminate:
		grace := standardGrace
		if s.spot {
			grace = spotGrace
		}
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindTermination,
			ID:          noticeID(PathMaintenanceEvent, s.maintenance, s.maintenanceSince),
			NoticeTime:  s.maintenanceSince,
			Deadline:    s.maintenanceSince.Add(grace),
			Action:      actionTerminateMaintenance,
			Description: "GCE host maintenance stops this VM",
		})
	case MaintenanceMigrate:
		// Live migration keeps the VM running: a soft notice without a deadline.
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindScheduledMaintenance,
			ID:          noticeID(PathMaintenanceEvent, s.maintenance, s.maintenanceSince),
			NoticeTime:  s.maintenanceSince,
			Action:      actionMigrateMaintenance,
			Description: "GCE host maintenance live-migrates this VM",
		})
	}
	providers.Sort(ns)
	return ns
}

// noticeID tells apart two occurrences of the same value (a second maintenance event weeks
// later) while staying fixed for as long as one persists.
func noticeID(path, value string, since time.Time) string {
	return providers.HashID(Name, path, value, since.UTC().Format(time.RFC3339Nano))
}
