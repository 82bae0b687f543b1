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

// GPUMaintenanceNotice is how long before a host-maintenance stop GCE sets
// instance/maintenance-event to TERMINATE_ON_HOST_MAINTENANCE on a VM with a GPU attached, and
// VMMaintenanceNotice the same for every other VM: "Compute Engine gives GPU VMs a 1-hour
// stopping notice, while normal VMs receive only a 60-second notice" (GCE "Handling GPU host
// maintenance events"). Either is the deadline when upcoming-maintenance gives no
// window-start-time. The 30 s (Spot) and 120 s (standard) figures are the soft-off to
// power-off gap once a stop has begun, not a notice.
const (
	GPUMaintenanceNotice = time.Hour
	VMMaintenanceNotice  = 60 * time.Second
)

// DefaultMaintenanceNotice is kept for callers of the previous API: the GPU VM's hour.
//
// Deprecated: the notice depends on the VM; see GPUMaintenanceNotice and VMMaintenanceNotice.
const DefaultMaintenanceNotice = GPUMaintenanceNotice

// gpuFamilies are the machine families that come with GPUs attached: the accelerator-optimized
// A2, A3, A4, A4X and G2, G4 (GCE "Accelerator-optimized machine family"). Other families (N1
// above all) may have GPUs attached too; that only the node's capacity or labels can tell.
var gpuFamilies = map[string]bool{"a2": true, "a3": true, "a4": true, "a4x": true, "g2": true, "g4": true}

// machineFamily returns the family of instance/machine-type's value
// (projects/123/machineTypes/a2-highgpu-1g gives a2); "" when it has none.
func machineFamily(machineType string) string {
	name := machineType[strings.LastIndex(machineType, "/")+1:]
	family, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(name)), "-")
	return family
}

// machineTypeName returns the last part of instance/machine-type's value.
func machineTypeName(machineType string) string {
	return machineType[strings.LastIndex(machineType, "/")+1:]
}

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
	// machineType is instance/machine-type; "" while unknown (not read yet, or 404).
	machineType string
	// win decides the windows; the zero value is GCE's documented figures, and an unknown
	// machine the ordinary VM's minute.
	win windows
}

// windows are the figures the notices' deadlines come from.
type windows struct {
	// maintenance, when non-zero, is the deadline of TERMINATE_ON_HOST_MAINTENANCE counted from
	// when the value was first seen (--gcp-maintenance-notice): it wins over the machine.
	maintenance time.Duration
	// gpu and vm are the notices of a GPU VM and of any other; zero means GCE's figures.
	gpu, vm time.Duration
	// preemption is the extended preemption notice (scheduling.preemptionNoticeDuration):
	// preempted=TRUE comes that long before the soft-off. Zero: none, the soft-off at once.
	preemption time.Duration
	// preemptionSource says where preemption came from.
	preemptionSource string
	// node, when set, says whether the node shows an accelerator; known is false while the
	// node has not been read. It must not block: it is called with the provider's lock held.
	node func() (gpu bool, why string, known bool)
}

// maintenanceWindow returns the TERMINATE_ON_HOST_MAINTENANCE notice for a VM of machineType
// and where it came from: the flag; else a GPU VM's hour when the machine family has GPUs or
// the node shows an accelerator; else the ordinary minute, also when nothing can tell (evicting
// early costs less than dying mid-job).
func (w windows) maintenanceWindow(machineType string) (time.Duration, string) {
	if w.maintenance > 0 {
		return w.maintenance, "--gcp-maintenance-notice"
	}
	gpu, vm := w.gpu, w.vm
	if gpu <= 0 {
		gpu = GPUMaintenanceNotice
	}
	if vm <= 0 {
		vm = VMMaintenanceNotice
	}
	if f := machineFamily(machineType); gpuFamilies[f] {
		return gpu, fmt.Sprintf("GPU VM: machine type %s (family %s comes with GPUs)", machineTypeName(machineType), f)
	}
	if w.node != nil {
		if has, why, known := w.node(); known && has {
			return gpu, "GPU VM: the node shows " + why
		} else if known {
			return vm, fmt.Sprintf("ordinary VM: machine type %s, no accelerator on the node", orUnknown(machineTypeName(machineType)))
		}
	}
	return vm, fmt.Sprintf("assumed ordinary VM: machine type %s, node not read yet (the shorter notice)", orUnknown(machineTypeName(machineType)))
}

// preemptionWindow returns the time from preempted=TRUE to the power-off and where it came from.
func (w windows) preemptionWindow() (time.Duration, string) {
	if w.preemption <= 0 {
		return preemptGrace, "no extended preemption notice: the soft-off comes with preempted=TRUE, the power-off 30 s later"
	}
	return w.preemption + preemptGrace, fmt.Sprintf("preemption notice %s (%s) then the 30 s from soft-off to power-off", w.preemption, w.preemptionSource)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
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
		window, _ := s.win.preemptionWindow()
		n := providers.Notice{
			Provider:    Name,
			Kind:        providers.KindPreemption,
			ID:          noticeID(PathPreempted, s.preempted, s.preemptedSince),
			NoticeTime:  s.preemptedSince,
			Deadline:    s.preemptedSince.Add(window),
			Action:      actionPreempt,
			Description: desc,
			Source:      PathPreempted,
			// The value carries no time: the window counts from when this process saw it.
			FromFirstSeen: true,
		}
		// The soft-off comes the preemption notice after preempted=TRUE (at once without one):
		// a kubelet with graceful node shutdown (GKE's default) starts stopping pods then.
		n.SoftOff = s.preemptedSince.Add(s.win.preemption)
		if s.win.preemption > 0 {
			n.Description += fmt.Sprintf("; extended notice: soft-off at %s, power-off 30 s later", n.SoftOff.UTC().Format(time.RFC3339))
		}
		ns = append(ns, n)
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
			notice, source := s.win.maintenanceWindow(s.machineType)
			deadline, why = s.maintenanceSince.Add(notice), fmt.Sprintf("%s after the value was first seen (%s)", notice, source)
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
