// Package providers defines what reprieve learns from a cloud: notices that a machine is going
// away (with a reclaim deadline) or that it should be avoided (soft notices without one).
package providers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"time"
)

// Kind says what a notice announces.
type Kind string

// The kinds of notice reprieve understands. Each cloud maps its own vocabulary onto these.
const (
	// KindSpotInterruption: the cloud reclaims a spot or preemptible machine at the deadline.
	KindSpotInterruption Kind = "spot-interruption"
	// KindRebalanceRecommendation: the machine is at elevated risk of interruption; no deadline.
	KindRebalanceRecommendation Kind = "rebalance-recommendation"
	// KindScheduledMaintenance: a scheduled stop, reboot, redeploy or retirement starting at the
	// deadline. Further away than --maintenance-lead it only keeps new pods off the node; without
	// a deadline (GCP live migration, Azure Freeze) it is a soft notice.
	KindScheduledMaintenance Kind = "scheduled-maintenance"
	// KindPreemption: a preemptible or Spot VM is being preempted (GCP preempted=TRUE, Azure
	// Preempt).
	KindPreemption Kind = "preemption"
	// KindTermination: the machine is being deleted or stopped at the deadline for another
	// reason (Azure Terminate). GCP TERMINATE_ON_HOST_MAINTENANCE is not one: it comes an
	// hour ahead on a GPU VM (60 s on any other) and is a KindScheduledMaintenance, so that
	// --maintenance-lead applies.
	KindTermination Kind = "termination"
	// KindMaintenanceInformation: host maintenance that does not stop the machine (GCP
	// upcoming-maintenance on a VM that live-migrates). It never has a deadline and gives no
	// taint: the agent only records an Event and counts it in reprieve_notices_received_total.
	KindMaintenanceInformation Kind = "maintenance-information"
)

// Kinds lists every kind, for metrics that must exist from the start.
var Kinds = []Kind{KindSpotInterruption, KindRebalanceRecommendation, KindScheduledMaintenance, KindPreemption, KindTermination, KindMaintenanceInformation}

// Notice is one thing the cloud says about this machine, as long as it says it. Providers
// report the complete set of notices in force at every poll; a notice that is no longer
// reported has been withdrawn (a cancelled or completed event).
type Notice struct {
	// Provider names the cloud that gave the notice ("aws").
	Provider string
	// Kind says what the notice announces.
	Kind Kind
	// ID is stable for the life of the notice: the cloud's event ID, or a hash of the payload
	// when the cloud gives none.
	ID string
	// NoticeTime is when the cloud posted the notice, or when reprieve first saw it.
	NoticeTime time.Time
	// Deadline is when the machine is reclaimed or the event starts; zero when there is none.
	Deadline time.Time
	// Action is the cloud's word for what happens ("terminate", "stop", "system-reboot").
	Action string
	// Description is free text from the cloud, for logs and events.
	Description string
	// Source names the metadata source that raised the notice, the same in every process: the
	// path of an AWS or GCP metadata value (aws.PathSpotInstanceAction, gcp.PathPreempted),
	// azure.SourceScheduledEvents, or "annotation" for the none provider. It is a key of
	// SourceReporter.Answered for providers that implement it.
	Source string
	// FromFirstSeen is true when Deadline is counted from NoticeTime, and NoticeTime is when this
	// process first saw the value because the payload carries no time (GCP preempted=TRUE:
	// first seen + 30 s; GCP TERMINATE_ON_HOST_MAINTENANCE without an upcoming-maintenance
	// window: first seen + the maintenance notice; AWS hibernate: first seen). A process that
	// knows an earlier first sighting (Reanchor) moves such a deadline with it. It is false
	// when the cloud's payload gives the deadline.
	FromFirstSeen bool
	// SoftOff is when the machine's OS gets the ACPI soft-off (GCP: preempted=TRUE plus the
	// VM's preemption notice, which is zero by default), zero when the provider does not know
	// (AWS and Azure stop the machine at the deadline). A kubelet with graceful node shutdown starts stopping pods on its own schedule
	// then (pkg/kubelet/nodeshutdown), which can be before Deadline.
	SoftOff time.Time
}

// Reanchor returns the notice as first seen at firstSeen, an earlier sighting than this
// process's own (another process's, read back from the node). When firstSeen is non-zero and
// before NoticeTime, or NoticeTime is zero, NoticeTime becomes firstSeen and, when the deadline
// is counted from it (FromFirstSeen), the deadline moves by the same amount, so that
// Deadline - NoticeTime is kept. Otherwise, including a firstSeen later than NoticeTime (a
// process's clock never moves a countdown later), the notice is returned unchanged.
func (n Notice) Reanchor(firstSeen time.Time) Notice {
	if firstSeen.IsZero() || (!n.NoticeTime.IsZero() && !firstSeen.Before(n.NoticeTime)) {
		return n
	}
	if n.FromFirstSeen && !n.NoticeTime.IsZero() {
		shift := firstSeen.Sub(n.NoticeTime)
		if !n.Deadline.IsZero() {
			n.Deadline = n.Deadline.Add(shift)
		}
		if !n.SoftOff.IsZero() {
			n.SoftOff = n.SoftOff.Add(shift) // counted from the first sight too
		}
	}
	n.NoticeTime = firstSeen
	return n
}

// Interrupts reports whether the notice ends the machine's pods at its deadline.
func (n Notice) Interrupts() bool {
	return !n.Deadline.IsZero() && n.Kind != KindRebalanceRecommendation && n.Kind != KindMaintenanceInformation
}

// Window is a notice window a provider applies: how long before the machine goes a notice
// comes, and where that figure came from (a flag, a metadata value, the cloud's documentation),
// for `reprieve doctor` and the startup log.
type Window struct {
	// Name says which notice ("maintenance-event TERMINATE_ON_HOST_MAINTENANCE").
	Name string
	// Duration is the window.
	Duration time.Duration
	// Source says where Duration came from.
	Source string
}

// WindowReporter is implemented by providers whose windows depend on the machine or on flags
// (GCP: the maintenance notice of a GPU VM or an ordinary one, the extended preemption notice).
type WindowReporter interface {
	// Windows returns the windows that apply now, in a fixed order.
	Windows() []Window
}

// Readiness is implemented by providers that can be unable to say anything yet for a while
// after they start (Azure Scheduled Events' first call takes up to two minutes). Ready
// returns nil when the provider has an answer to go by, else why not.
type Readiness interface {
	Ready() error
}

// SourceReporter is implemented by providers that read several sources (AWS's three metadata
// paths, GCP's values) and can tell which of them have answered. An answer from one source
// says nothing about another: a notice raised by a source that has not answered yet is not
// withdrawn by the others answering. The agent treats a provider that does not implement it as
// one source, answered once Poll returned err == nil.
type SourceReporter interface {
	// Answered returns every source of the provider and whether it has given a good answer
	// (a value, or a positive "none" such as a 404 meaning nothing pending) since the
	// provider was created. A source that only failed, or whose first call is still
	// outstanding, is false: unknown, not none. Once true, a source stays true: a later
	// failure keeps its last good answer in what Poll returns.
	Answered() map[string]bool
}

// AnswerTimes is implemented by providers that can tell when each of their sources last gave a
// good answer (the sources of SourceReporter). Readiness is judged on it: a watching provider
// publishes only changes, so the agent cannot count its updates. A source that has not answered
// since the provider was created is absent or zero.
type AnswerTimes interface {
	LastAnswers() map[string]time.Time
}

// Provider reports the notices a cloud currently has for this machine.
type Provider interface {
	// Name is the provider's flag value ("aws", "none").
	Name() string
	// Poll returns every notice in force now. When one of the provider's sources fails, Poll
	// returns an error together with the best knowledge it has: the last answer that source
	// gave, never an invented notice and never a silently dropped one.
	Poll(ctx context.Context) ([]Notice, error)
}

// Watcher is implemented by providers whose cloud pushes changes (GCP's hanging GETs) rather
// than being polled. The agent then calls Watch instead of Poll.
type Watcher interface {
	// Watch calls update with the complete set of notices in force each time it may have
	// changed, until ctx ends; it returns ctx's error then. A failure is reported through
	// update's err, with the best knowledge the provider has (as Poll does), and Watch goes on,
	// retrying with backoff.
	Watch(ctx context.Context, update func(notices []Notice, err error)) error
}

// Approver is implemented by providers whose cloud lets a machine that is ready start its event
// early (Azure Scheduled Events' StartRequests). The agent calls Approve for an interrupting
// notice once every pod it evicts for it is gone, and only when the operator enabled approval.
type Approver interface {
	Approve(ctx context.Context, n Notice) error
}

// HashID derives a stable notice ID from the parts of a payload that identify it, for clouds
// that give none (AWS's spot notice). The same parts always give the same ID.
func HashID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Sort orders notices by deadline (none last), then kind and ID, so that logs and decisions do
// not depend on the order a cloud listed them in.
func Sort(ns []Notice) {
	sort.SliceStable(ns, func(i, j int) bool {
		a, b := ns[i], ns[j]
		if a.Deadline.IsZero() != b.Deadline.IsZero() {
			return !a.Deadline.IsZero()
		}
		if !a.Deadline.Equal(b.Deadline) {
			return a.Deadline.Before(b.Deadline)
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.ID < b.ID
	})
}
