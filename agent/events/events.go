// Package events holds the reasons of the Kubernetes Events the agent records, and the
// recorder that sends them.
package events

import (
	"context"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/providers"
)

// Event reasons. Node events: what the cloud said and what reprieve did to the node; pod events:
// what happened to each pod and why.
const (
	ReasonNoticeWithdrawn     = "NoticeWithdrawn"
	ReasonTaintApplied        = "TaintApplied"
	ReasonTaintRemoved        = "TaintRemoved"
	ReasonInterruptionHandled = "InterruptionHandled"
	ReasonEventApproved       = "EventApproved"
	ReasonEvictionScheduled   = "EvictionScheduled"
	// ReasonEvicted is reprieve's own, not the kubelet's "Evicted": an alert or a query on the
	// kubelet's node-pressure evictions must not count reprieve's graceful ones.
	ReasonEvicted         = "InterruptionEviction"
	ReasonEvictionBlocked = "EvictionBlocked"
	ReasonForceDeleted    = "ForceDeleted"
	ReasonGraceShortened  = "GraceShortened"
	ReasonMissedDeadline  = "MissedDeadline"
	// ReasonVolumeAtRisk: a pod with a volume that needs attaching cannot be gone in time for
	// the kubelet to release the volume before the machine goes (issue 40).
	ReasonVolumeAtRisk     = "VolumeAtRisk"
	ReasonPressureDetected = "PressureDetected"
	ReasonPressureCleared  = "PressureCleared"
	ReasonPressureEviction = "PressureEviction"
	ReasonPressureDisabled = "PressureDisabled"
	// ReasonMetadataUnanswered says that a metadata source has given no good answer within
	// --metadata-stale-after: the agent cannot see the cloud's notices (it is not Ready);
	// ReasonMetadataAnswered that every source answers again.
	ReasonMetadataUnanswered = "MetadataUnanswered"
	ReasonMetadataAnswered   = "MetadataAnswered"
	// ReasonKubeletConfigUnknown says that the kubelet's configuration was not found: its
	// eviction thresholds and graceful node shutdown are unknown, the defaults assumed.
	ReasonKubeletConfigUnknown = "KubeletConfigUnknown"
	// ReasonOverlappingHandler says that another program also acts on this node's
	// interruptions (Karpenter's interruption queue, AKS node auto-drain,
	// aws-node-termination-handler).
	ReasonOverlappingHandler = "OverlappingHandler"
)

// Node event reasons for a notice, one per kind, so that `kubectl get events
// --field-selector reason=SpotInterruption` and an event exporter's rules tell them apart.
const (
	ReasonSpotInterruption        = "SpotInterruption"
	ReasonRebalanceRecommendation = "RebalanceRecommendation"
	ReasonScheduledMaintenance    = "ScheduledMaintenance"
	ReasonPreemption              = "Preemption"
	ReasonTermination             = "Termination"
	ReasonHostMaintenance         = "HostMaintenance"
	// ReasonNoticeReceived is for a kind this build does not know.
	ReasonNoticeReceived = "NoticeReceived"
)

// NoticeReason is the reason of the node event that reports a notice of kind.
func NoticeReason(kind providers.Kind) string {
	switch kind {
	case providers.KindSpotInterruption:
		return ReasonSpotInterruption
	case providers.KindRebalanceRecommendation:
		return ReasonRebalanceRecommendation
	case providers.KindScheduledMaintenance:
		return ReasonScheduledMaintenance
	case providers.KindPreemption:
		return ReasonPreemption
	case providers.KindTermination:
		return ReasonTermination
	case providers.KindMaintenanceInformation:
		return ReasonHostMaintenance
	}
	return ReasonNoticeReceived
}

// NewBroadcaster returns client-go's event broadcaster for the agent, not yet sending; its
// recorder (Recorder) can be handed out at once, and StartRecordingToSink starts the sending.
// Its correlator aggregates repeated events and its spam filter allows a burst of 25 events per
// object and reason, then one per five minutes, so that an eviction storm cannot flood the API
// server with events. The reason is part of the spam key (client-go's default key leaves it out)
// so that a flood of one kind of event cannot starve another: a flapping notice must not silence
// the summary.
func NewBroadcaster(ctx context.Context) record.EventBroadcaster {
	return record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{
		BurstSize:   25,
		QPS:         1. / 300,
		SpamKeyFunc: spamKey,
	}))
}

// Recorder is b's recorder of reprieve's events on node.
func Recorder(b record.EventBroadcaster, node string) record.EventRecorderLogger {
	return b.NewRecorder(kube.Scheme, v1.EventSource{Component: "reprieve", Host: node})
}

// StartRecording sends b's events to the API server through client, counting each write in d
// when it is given.
func StartRecording(b record.EventBroadcaster, client kube.Interface, d *Delivery) {
	var sink record.EventSink = &kube.EventSink{Interface: client.CoreV1().Events("")}
	if d != nil {
		sink = d.Sink(sink)
	}
	b.StartRecordingToSink(sink)
}

func spamKey(e *v1.Event) string {
	return strings.Join([]string{e.Source.Component, e.Source.Host, e.InvolvedObject.Kind, e.InvolvedObject.Namespace,
		e.InvolvedObject.Name, string(e.InvolvedObject.UID), e.InvolvedObject.APIVersion, e.Type, e.Reason}, "/")
}

// NodeRef is the reference events about the node are recorded on, as the kubelet records them:
// the node's name doubles as its UID so events group under the node in kubectl describe.
func NodeRef(name string) *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Node", Name: name, UID: types.UID(name)}
}
