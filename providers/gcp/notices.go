package gcp

import (
	"fmt"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// The values of instance/preempted, instance/maintenance-event and the scheduling keys.
const (
	PreemptedTrue              = "TRUE"
	PreemptedFalse             = "FALSE"
	MaintenanceNone            = "NONE"
	MaintenanceMigrate         = "MIGRATE_ON_HOST_MAINTENANCE"
	MaintenanceTerminate       = "TERMINATE_ON_HOST_MAINTENANCE"
	OnHostMaintenanceMigrate   = "MIGRATE"
	OnHostMaintenanceTerminate = "TERMINATE"
	provisioningModelSpot      = "SPOT"
	preemptibleTrue            = "TRUE"
	preemptibleFalse           = "FALSE"
	actionPreempt              = "preempt"
	actionTerminateMaintenance = "terminate-on-host-maintenance"
	actionMigrateMaintenance   = "migrate-on-host-maintenance"
	actionUpcomingMaintenance  = "upcoming-maintenance"
)

// preemptGrace is the time between a preemption's soft-off and the power-off of a Spot or
// preemptible VM (GCE "Preemption process"). preempted=TRUE only happens to such VMs.
const preemptGrace = 30 * time.Second

// DefaultMaintenanceNotice is how long before a host-maintenance stop GCE sets
// instance/maintenance-event to TERMINATE_ON_HOST_MAINTENANCE on a VM with a GPU attached:
// one hour (GCE "Handling GPU host maintenance events"; Google's k8s-node-termination-handler
// waits one hour for GPU VMs). It is the deadline when upcoming-maintenance gives no
// window-start-time. The 30 s (Spot) and 120 s (standard) figures are the soft-off to power-off
// gap once a stop has begun, not a notice.
const DefaultMaintenanceNotice = time.Hour

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

// parseMaintenanceEvent validates an instance/maintenance-event value. GCE may add values
// (its documentation says so): a value that is upper-case letters and underscores is
// accepted as known=false, and becomes a maintenance notice without a deadline. Anything
// else (empty, HTML, a truncated answer) is an error.
func parseMaintenanceEvent(v string) (value string, known bool, err error) {
	n := normalize(v)
	switch n {
	case MaintenanceNone, MaintenanceMigrate, MaintenanceTerminate:
		return n, true, nil
	}
	if n == "" || len(n) > 64 || strings.Trim(n, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" {
		return "", false, fmt.Errorf("malformed %s value %q", PathMaintenanceEvent, truncate(v))
	}
	return n, false, nil
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
		return false, fmt.Errorf("unknown %s value %q", PathPreemptible, truncate(v))
	}
}

// parseProvisioningModel reads instance/scheduling/provisioning-model. Only SPOT makes the VM
// a Spot VM; STANDARD, absent and models added later (FLEX_START, RESERVATION_BOUND) do not.
func parseProvisioningModel(v string, found bool) bool {
	return found && normalize(v) == provisioningModelSpot
}

// parseOnHostMaintenance reads instance/scheduling/on-host-maintenance: migrates is true only
// for MIGRATE. Absent or another value counts as TERMINATE, the choice that keeps pods safe.
func parseOnHostMaintenance(v string, found bool) (migrates bool) {
	return found && normalize(v) == OnHostMaintenanceMigrate
}

// state is what the metadata server last said, with when reprieve first saw each value that
// gives a notice. Only validated values get here.
type state struct {
	preempted        string
	preemptedSince   time.Time
	maintenance      string
	maintenanceSince time.Time
	// upcoming is instance/upcoming-maintenance; nil when there is none (404).
	upcoming *Upcoming
	// spot is true for a Spot or preemptible VM (provisioning-model SPOT, or preemptible
	// TRUE). It changes no deadline (a GPU VM's maintenance notice is an hour either way); the
	// preemption's description says when a VM that should not be preempted was.
	spot bool
	// migrates is true when the VM live-migrates on host maintenance (on-host-maintenance
	// MIGRATE); such a VM keeps running through upcoming maintenance.
	migrates bool
	// maintenanceNotice is the deadline of TERMINATE_ON_HOST_MAINTENANCE counted from when the
	// value was first seen, when upcoming-maintenance gives no window.
	maintenanceNotice time.Duration
}

// notices maps the state onto the notices in force, sorted.
func (s state) notices() []providers.Notice {
	var ns []providers.Notice
	if s.preempted == PreemptedTrue {
		desc := "GCE is preempting this Spot or preemptible VM"
		if !s.spot {
			// Only Spot and preemptible VMs are preempted; say so rather than guess.
			desc = "GCE reports preempted=TRUE on a VM whose provisioning-model and preemptible say it is standard; handled as a preemption"
		}
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindPreemption,
			ID:          noticeID(PathPreempted, s.preempted, s.preemptedSince),
			NoticeTime:  s.preemptedSince,
			Deadline:    s.preemptedSince.Add(preemptGrace),
			Action:      actionPreempt,
			Description: desc,
			Source:      PathPreempted,
			// The value carries no time: the 30 s count from when this process saw it.
			FromFirstSeen: true,
		})
	}
	window := time.Time{}
	if s.upcoming != nil {
		window = s.upcoming.WindowStart
	}
	switch {
	case s.maintenance == "" || s.maintenance == MaintenanceNone:
	case s.maintenance == MaintenanceTerminate:
		// A scheduled maintenance, not a termination: far ahead it only keeps new pods off the
		// node, and from --maintenance-lead before the deadline it interrupts, as an AWS
		// scheduled event does. GPU jobs keep running until their own last safe moment.
		deadline, why, fromFirstSeen := window, "upcoming-maintenance window-start-time", false
		if deadline.IsZero() {
			notice := s.maintenanceNotice
			if notice <= 0 {
				notice = DefaultMaintenanceNotice
			}
			deadline, why = s.maintenanceSince.Add(notice), fmt.Sprintf("%s after the value was first seen (GPU VMs get a one-hour notice)", notice)
			fromFirstSeen = true
		}
		ns = append(ns, providers.Notice{
			Provider:      Name,
			Kind:          providers.KindScheduledMaintenance,
			ID:            noticeID(PathMaintenanceEvent, s.maintenance, s.maintenanceSince),
			NoticeTime:    s.maintenanceSince,
			Deadline:      deadline,
			Action:        actionTerminateMaintenance,
			Description:   "GCE host maintenance stops this VM; deadline: " + why,
			Source:        PathMaintenanceEvent,
			FromFirstSeen: fromFirstSeen,
		})
	case s.maintenance == MaintenanceMigrate:
		// Live migration keeps the VM running: a soft notice without a deadline.
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindScheduledMaintenance,
			ID:          noticeID(PathMaintenanceEvent, s.maintenance, s.maintenanceSince),
			NoticeTime:  s.maintenanceSince,
			Action:      actionMigrateMaintenance,
			Description: "GCE host maintenance live-migrates this VM",
			Source:      PathMaintenanceEvent,
		})
	default:
		// A value GCE added: information, not an error. Without knowing what it does,
		// keep new pods off the node and evict nothing.
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindScheduledMaintenance,
			ID:          noticeID(PathMaintenanceEvent, s.maintenance, s.maintenanceSince),
			NoticeTime:  s.maintenanceSince,
			Action:      strings.ToLower(strings.ReplaceAll(s.maintenance, "_", "-")),
			Description: fmt.Sprintf("GCE host maintenance of a kind reprieve does not know (%s): new pods are kept off the node, nothing is evicted", s.maintenance),
			Source:      PathMaintenanceEvent,
		})
	}
	if u := s.upcoming; u != nil {
		n := providers.Notice{
			Provider:   Name,
			ID:         providers.HashID(Name, PathUpcomingMaintenance, u.Type, u.WindowStart.UTC().Format(time.RFC3339)),
			NoticeTime: u.since,
			Action:     strings.TrimSpace(fmt.Sprintf("%s %s %s", actionUpcomingMaintenance, strings.ToLower(u.Type), strings.ToLower(u.Status))),
			Source:     PathUpcomingMaintenance,
		}
		if s.migrates {
			// The VM live-migrates: information only, never an eviction.
			n.Kind = providers.KindMaintenanceInformation
			n.Description = "GCE host maintenance live-migrates this VM; " + u.describe()
		} else {
			n.Kind = providers.KindScheduledMaintenance
			n.Deadline = u.WindowStart
			n.Description = "GCE host maintenance stops this VM at the start of its window; " + u.describe()
		}
		ns = append(ns, n)
	}
	providers.Sort(ns)
	return ns
}

// noticeID tells apart two occurrences of the same value (a second maintenance event weeks
// later) while staying fixed for as long as one persists.
func noticeID(path, value string, since time.Time) string {
	return providers.HashID(Name, path, value, since.UTC().Format(time.RFC3339Nano))
}

func truncate(s string) string {
	const max = 80
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
