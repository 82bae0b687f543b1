package interrupt

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

// The managed platforms announce disruptions on the node object itself. Each signal is a source
// of its own, beside the metadata ones: the node comes from the informer's cache, so what it
// shows is always a positive answer, and a signal that goes away withdraws only the notice it
// raised. When two sources disagree, the earliest deadline wins (plan.Intend), as between the
// metadata sources.
const (
	// SourceGKEScheduledMaintenance is GKE's label with the start of an upcoming host
	// maintenance in Unix seconds (GKE 1.31.1-gke.2008000 and later, for GPU, TPU and some
	// other machine types: "Monitor maintenance events", "When an upcoming maintenance is
	// scheduled by the VM but isn't active, GKE adds scheduled-maintenance-time to the node
	// label").
	SourceGKEScheduledMaintenance = "node/label/" + LabelGKEScheduledMaintenance
	// SourceGKEActiveMaintenance is GKE's label that says the maintenance has started.
	SourceGKEActiveMaintenance = "node/label/" + LabelGKEActiveMaintenance
	// SourceGKEImpendingTermination is GKE's taint on a node about to be terminated.
	SourceGKEImpendingTermination = "node/taint/" + TaintGKEImpendingTermination
	// SourceAKSScheduledEvent is AKS node-problem-detector's VMEventScheduled condition (and
	// its per-kind conditions such as PreemptScheduled), from the VM's Scheduled Events.
	SourceAKSScheduledEvent = "node/condition/" + ConditionAKSVMEventScheduled
	// SourceKarpenterDisrupted is Karpenter's disruption taint. Karpenter drains such a node by
	// its own terminationGracePeriod: reprieve only reports it, and never taints or evicts for
	// it, so that it never fights Karpenter's drain.
	SourceKarpenterDisrupted = "node/taint/" + TaintKarpenterDisrupted
)

// The keys of the platform signals.
const (
	LabelGKEScheduledMaintenance = "cloud.google.com/scheduled-maintenance-time"
	LabelGKEActiveMaintenance    = "cloud.google.com/active-node-maintenance"
	TaintGKEImpendingTermination = "cloud.google.com/impending-node-termination"
	ConditionAKSVMEventScheduled = "VMEventScheduled"
	TaintKarpenterDisrupted      = "karpenter.sh/disrupted"
)

// Windows the platforms' signals give when they carry no time of their own.
const (
	// gkeActiveMaintenanceWindow: once GKE says the maintenance is ONGOING, the VM stops within
	// the notice an ordinary VM gets, 60 s ("Handling GPU host maintenance events": "normal VMs
	// receive only a 60-second notice"); evicting early costs less than dying mid-job.
	gkeActiveMaintenanceWindow = 60 * time.Second
	// gkeTerminationWindow: GKE taints a Spot or preemptible node that is being preempted;
	// Compute Engine's preemption notice is 30 s ("Preemption process").
	gkeTerminationWindow = 30 * time.Second
	// azureRebootWindow: Scheduled Events give a Reboot or Redeploy at least 15 minutes
	// ("Azure Metadata Service: Scheduled Events": NotBefore, minimum notice per event type).
	azureRebootWindow = 15 * time.Minute
)

// aksScheduledMessage is AKS node-problem-detector's message for a scheduled event: the event
// type, then NotBefore in HTTP date form, as "Preempt Scheduled: Mon, 02 Mar 2026 19:01:45 GMT",
// optionally followed by ". EventId: <id>".
var aksScheduledMessage = regexp.MustCompile(`^\s*(\w+) Scheduled: ([^.]+?)\s*(?:\.\s*EventId:\s*(\S+))?\s*$`)

// NodeSignals returns the notices the node's own signals raise now. firstSeen gives, for a
// signal that carries no time of its own, when this process first saw it; the node's record
// re-anchors it across restarts (FromFirstSeen). Values that do not parse are reported in bad,
// each with the key that holds it, and raise nothing.
func NodeSignals(node *v1.Node, firstSeen func(source string) time.Time) (notices []providers.Notice, bad map[string]string) {
	if node == nil {
		return nil, nil
	}
	bad = map[string]string{}
	if v, ok := node.Labels[LabelGKEScheduledMaintenance]; ok {
		if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && secs > 0 {
			at := time.Unix(secs, 0).UTC()
			notices = append(notices, providers.Notice{Provider: "gke", Source: SourceGKEScheduledMaintenance,
				Kind: providers.KindScheduledMaintenance, ID: "gke-maintenance-" + strconv.FormatInt(secs, 10),
				NoticeTime: firstSeen(SourceGKEScheduledMaintenance), Deadline: at, Action: "host-maintenance",
				Description: "GKE node label " + LabelGKEScheduledMaintenance + " (the maintenance window's start)"})
		} else {
			bad[LabelGKEScheduledMaintenance] = v
		}
	}
	if v := node.Labels[LabelGKEActiveMaintenance]; strings.EqualFold(strings.TrimSpace(v), "ONGOING") {
		seen := firstSeen(SourceGKEActiveMaintenance)
		notices = append(notices, providers.Notice{Provider: "gke", Source: SourceGKEActiveMaintenance,
			Kind: providers.KindScheduledMaintenance, ID: "gke-active-maintenance", NoticeTime: seen,
			Deadline: seen.Add(gkeActiveMaintenanceWindow), Action: "host-maintenance", FromFirstSeen: true,
			Description: "GKE node label " + LabelGKEActiveMaintenance + "=ONGOING: the host maintenance has started"})
	}
	for _, t := range node.Spec.Taints {
		switch t.Key {
		case TaintGKEImpendingTermination:
			n := providers.Notice{Provider: "gke", Source: SourceGKEImpendingTermination, Kind: providers.KindTermination,
				ID: "gke-impending-termination", Action: "terminate",
				Description: "GKE taint " + TaintGKEImpendingTermination + ": the node is about to be terminated"}
			if t.TimeAdded != nil {
				n.NoticeTime = t.TimeAdded.Time
			} else {
				n.NoticeTime, n.FromFirstSeen = firstSeen(SourceGKEImpendingTermination), true
			}
			n.Deadline = n.NoticeTime.Add(gkeTerminationWindow)
			notices = append(notices, n)
		case TaintKarpenterDisrupted:
			seen := firstSeen(SourceKarpenterDisrupted)
			if t.TimeAdded != nil {
				seen = t.TimeAdded.Time
			}
			notices = append(notices, providers.Notice{Provider: "karpenter", Source: SourceKarpenterDisrupted,
				Kind: providers.KindMaintenanceInformation, ID: "karpenter-disrupted", NoticeTime: seen, Action: "disrupt",
				Description: "Karpenter taint " + TaintKarpenterDisrupted + ": Karpenter drains this node by its own terminationGracePeriod; reprieve does not act on it"})
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Status != v1.ConditionTrue || !isAKSScheduledCondition(string(c.Type)) {
			continue
		}
		if n, ok := aksNotice(c, firstSeen(SourceAKSScheduledEvent)); ok {
			notices = append(notices, n)
		} else {
			bad[string(c.Type)] = c.Message
		}
		break // one scheduled event at a time: the first condition that says so
	}
	if len(bad) == 0 {
		bad = nil
	}
	providers.Sort(notices)
	return notices, bad
}

// isAKSScheduledCondition reports whether t is one of AKS node-problem-detector's scheduled-event
// conditions: VMEventScheduled, or one per event type (PreemptScheduled, TerminateScheduled,
// RebootScheduled, RedeployScheduled, FreezeScheduled).
func isAKSScheduledCondition(t string) bool {
	switch t {
	case ConditionAKSVMEventScheduled, "PreemptScheduled", "TerminateScheduled", "RebootScheduled", "RedeployScheduled", "FreezeScheduled":
		return true
	}
	return false
}

// aksNotice reads one scheduled-event condition. The deadline is the message's NotBefore; a
// Preempt or Terminate whose time does not parse is due at once (it is mandatory, and failing
// closed is never worse than dying with the VM), a Reboot or Redeploy 15 minutes after the
// condition turned True, and a Freeze (a pause of seconds) evicts nothing.
func aksNotice(c v1.NodeCondition, seen time.Time) (providers.Notice, bool) {
	anchor := c.LastTransitionTime.Time
	if anchor.IsZero() {
		anchor = seen
	}
	typ := strings.TrimSuffix(string(c.Type), "Scheduled")
	var at time.Time
	id := ""
	if m := aksScheduledMessage.FindStringSubmatch(c.Message); m != nil {
		if c.Type == ConditionAKSVMEventScheduled {
			typ = m[1]
		}
		if t, err := http.ParseTime(strings.TrimSpace(m[2])); err == nil {
			at = t.UTC()
		}
		id = m[3]
	}
	if id == "" {
		id = strings.ToLower(typ) + "-" + strconv.FormatInt(anchor.Unix(), 10)
	}
	n := providers.Notice{Provider: "aks", Source: SourceAKSScheduledEvent, ID: "aks-" + id, NoticeTime: anchor,
		Action: typ, Description: "AKS node condition " + string(c.Type) + ": " + c.Message}
	switch strings.ToLower(typ) {
	case "preempt":
		n.Kind = providers.KindPreemption
	case "terminate":
		n.Kind = providers.KindTermination
	case "reboot", "redeploy":
		n.Kind = providers.KindScheduledMaintenance
		if at.IsZero() {
			at = anchor.Add(azureRebootWindow)
		}
	case "freeze":
		n.Kind = providers.KindScheduledMaintenance
		return n, true // no deadline: keeps new pods off, evicts nothing
	default:
		return providers.Notice{}, false
	}
	if at.IsZero() {
		at = anchor
	}
	n.Deadline = at
	return n, true
}
