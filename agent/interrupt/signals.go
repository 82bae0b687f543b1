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

// Windows the platforms' signals give. The signals are written by whoever may patch the node
// (its labels and taints) or its status (its conditions), not only by the platform: a deadline
// is counted from when this process first saw the signal, or taken from the signal's own time
// only when that leaves at least the platform's documented notice from first sight, so that
// no writer can make a signal due at once (issue 39 item 5). On the platform, the metadata
// provider reads the cloud's own notice, whose earlier deadline wins (plan.Intend).
const (
	// gkeActiveMaintenanceWindow: once GKE says the maintenance is ONGOING, the VM stops within
	// the notice an ordinary VM gets, 60 s ("Handling GPU host maintenance events": "normal VMs
	// receive only a 60-second notice"); evicting early costs less than dying mid-job. It is
	// also the shortest a scheduled-maintenance-time label leaves from first sight: GCE gives
	// no host maintenance a shorter notice.
	gkeActiveMaintenanceWindow = 60 * time.Second
	// gkeTerminationWindow: GKE taints a Spot or preemptible node that is being preempted;
	// Compute Engine's preemption notice is 30 s ("Preemption process"). The taint's timeAdded
	// is its writer's: the window counts from first sight.
	gkeTerminationWindow = 30 * time.Second
	// The shortest notice of each Scheduled Events type ("Azure Metadata Service: Scheduled
	// Events", NotBefore: Preempt 30 s, Terminate 5 to 15 minutes as configured, Redeploy
	// 10 minutes, Reboot and Freeze 15 minutes).
	azurePreemptNotice   = 30 * time.Second
	azureTerminateNotice = 5 * time.Minute
	azureRedeployNotice  = 10 * time.Minute
	azureRebootNotice    = 15 * time.Minute
)

// The platforms a node can be on, as its spec.providerID's scheme tells them; the values are
// the --provider names of their clouds.
const (
	PlatformAWS   = "aws"
	PlatformGCP   = "gcp"
	PlatformAzure = "azure"
)

// PlatformOf tells a node's platform from its spec.providerID, as each cloud's node controller
// writes it: aws:///<zone>/<instance> (EKS and EC2), gce://<project>/<zone>/<name> (GKE and
// GCE), azure:///subscriptions/... (AKS and Azure VMs). "" for any other, and for none: a node
// of no known platform reads no platform's signals. The API server lets spec.providerID be
// set once, from empty, and never changed, and a kubelet only on its own node.
func PlatformOf(providerID string) string {
	switch {
	case strings.HasPrefix(providerID, "aws://"):
		return PlatformAWS
	case strings.HasPrefix(providerID, "gce://"):
		return PlatformGCP
	case strings.HasPrefix(providerID, "azure://"):
		return PlatformAzure
	}
	return ""
}

// notBefore returns at, or first sight plus the platform's shortest notice when at is earlier
// (or zero); fromSeen says which. A time the signal's writer chose never makes it due sooner
// than the platform would have.
func notBefore(at, seen time.Time, notice time.Duration) (deadline time.Time, fromSeen bool) {
	if floor := seen.Add(notice); at.IsZero() || at.Before(floor) {
		return floor, true
	}
	return at, false
}

// aksScheduledMessage is AKS node-problem-detector's message for a scheduled event: the event
// type, then NotBefore in HTTP date form, as "Preempt Scheduled: Mon, 02 Mar 2026 19:01:45 GMT",
// optionally followed by ". EventId: <id>".
var aksScheduledMessage = regexp.MustCompile(`^\s*(\w+) Scheduled: ([^.]+?)\s*(?:\.\s*EventId:\s*(\S+))?\s*$`)

// NodeSignals returns the notices the node's own signals raise now: GKE's only on a GKE node,
// AKS's only on an AKS node (PlatformOf), Karpenter's (information, no deadline) on any.
// firstSeen gives when this process first saw a signal; every deadline counts from it, or
// from the signal's own time when that is later than first sight plus the platform's shortest
// notice (notBefore). The node's record re-anchors a deadline counted from first sight across
// restarts (FromFirstSeen). Values that do not parse are reported in bad, each with the key that
// holds it, and raise nothing; another platform's signals are neither read nor reported.
func NodeSignals(node *v1.Node, firstSeen func(source string) time.Time) (notices []providers.Notice, bad map[string]string) {
	if node == nil {
		return nil, nil
	}
	bad = map[string]string{}
	platform := PlatformOf(node.Spec.ProviderID)
	if platform == PlatformGCP {
		notices = append(notices, gkeSignals(node, firstSeen, bad)...)
	}
	for _, t := range node.Spec.Taints {
		if t.Key != TaintKarpenterDisrupted {
			continue
		}
		seen := firstSeen(SourceKarpenterDisrupted)
		if t.TimeAdded != nil {
			seen = t.TimeAdded.Time // information only: no deadline hangs on it
		}
		notices = append(notices, providers.Notice{Provider: "karpenter", Source: SourceKarpenterDisrupted,
			Kind: providers.KindMaintenanceInformation, ID: "karpenter-disrupted", NoticeTime: seen, Action: "disrupt",
			Description: "Karpenter taint " + TaintKarpenterDisrupted + ": Karpenter drains this node by its own terminationGracePeriod; reprieve does not act on it"})
	}
	if platform == PlatformAzure {
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
	}
	if len(bad) == 0 {
		bad = nil
	}
	providers.Sort(notices)
	return notices, bad
}

// gkeSignals reads GKE's labels and taint of a GKE node.
func gkeSignals(node *v1.Node, firstSeen func(source string) time.Time, bad map[string]string) []providers.Notice {
	var notices []providers.Notice
	if v, ok := node.Labels[LabelGKEScheduledMaintenance]; ok {
		if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && secs > 0 {
			seen := firstSeen(SourceGKEScheduledMaintenance)
			deadline, fromSeen := notBefore(time.Unix(secs, 0).UTC(), seen, gkeActiveMaintenanceWindow)
			notices = append(notices, providers.Notice{Provider: "gke", Source: SourceGKEScheduledMaintenance,
				Kind: providers.KindScheduledMaintenance, ID: "gke-maintenance-" + strconv.FormatInt(secs, 10),
				NoticeTime: seen, Deadline: deadline, FromFirstSeen: fromSeen, Action: "host-maintenance",
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
		if t.Key != TaintGKEImpendingTermination {
			continue
		}
		// The taint's timeAdded is its writer's choice: one in the past would make the
		// termination due at once. GKE's window counts from first sight.
		seen := firstSeen(SourceGKEImpendingTermination)
		notices = append(notices, providers.Notice{Provider: "gke", Source: SourceGKEImpendingTermination, Kind: providers.KindTermination,
			ID: "gke-impending-termination", Action: "terminate", NoticeTime: seen, Deadline: seen.Add(gkeTerminationWindow), FromFirstSeen: true,
			Description: "GKE taint " + TaintGKEImpendingTermination + ": the node is about to be terminated"})
		break
	}
	return notices
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

// aksNotice reads one scheduled-event condition. The deadline is the message's NotBefore, but
// never sooner than the event type's shortest notice from first sight (seen): a NotBefore or a
// lastTransitionTime in the past is its writer's, and must not make the event due at once. An
// event without a time that parses gets that shortest notice; a Freeze (a pause of seconds)
// evicts nothing.
func aksNotice(c v1.NodeCondition, seen time.Time) (providers.Notice, bool) {
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
		// The condition's own time names the event, so that the ID is the same in every
		// process; it dates nothing.
		anchor := c.LastTransitionTime.Time
		if anchor.IsZero() {
			anchor = seen
		}
		id = strings.ToLower(typ) + "-" + strconv.FormatInt(anchor.Unix(), 10)
	}
	n := providers.Notice{Provider: "aks", Source: SourceAKSScheduledEvent, ID: "aks-" + id, NoticeTime: seen,
		Action: typ, Description: "AKS node condition " + string(c.Type) + ": " + c.Message}
	var notice time.Duration
	switch strings.ToLower(typ) {
	case "preempt":
		n.Kind, notice = providers.KindPreemption, azurePreemptNotice
	case "terminate":
		n.Kind, notice = providers.KindTermination, azureTerminateNotice
	case "reboot":
		n.Kind, notice = providers.KindScheduledMaintenance, azureRebootNotice
	case "redeploy":
		n.Kind, notice = providers.KindScheduledMaintenance, azureRedeployNotice
	case "freeze":
		n.Kind = providers.KindScheduledMaintenance
		return n, true // no deadline: keeps new pods off, evicts nothing
	default:
		return providers.Notice{}, false
	}
	n.Deadline, n.FromFirstSeen = notBefore(at, seen, notice)
	return n, true
}
