// Package whatif says what the agent would do with a node and its pods if a notice arrived now,
// with the agent's own code (plan.Intend, record.ComputeNodeChange, plan.CountdownTaints,
// plan.PlanPod): `reprieve plan`, `reprieve audit` and /readyz's eviction summary. It changes
// nothing.
package whatif

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/providers"
)

// Input is the input of Plan: a node, its pods, the PodDisruptionBudgets of their
// namespaces, and the interruption notice to imagine.
type Input struct {
	Node *v1.Node
	Pods []*v1.Pod
	PDBs []policyv1.PodDisruptionBudget
	// Deadline is the imagined notice's reclaim deadline; zero plans against the node's taints
	// as they are, with no deadline.
	Deadline time.Time
	// NoticeTime is when the notice arrives, the interruption taint's timeAdded; zero means Now.
	NoticeTime time.Time
	Now        time.Time
	// Kubelet is what was read of the node's kubelet configuration (ReadKubeletConfig): the
	// volume release's status period; the zero value is an unknown one.
	Kubelet kubelet.ConfigRead
}

// NodePlan is what `reprieve plan` prints (its JSON is documented in docs/operations.md and
// kept stable: fields are only ever added).
type NodePlan struct {
	Node string `json:"node"`
	// NoticeTime is the imagined notice's arrival (the interruption taint's timeAdded).
	NoticeTime time.Time `json:"noticeTime"`
	// Deadline and WindowEnd (deadline less the safety margin) are absent without a deadline.
	Deadline            *time.Time `json:"deadline,omitempty"`
	WindowEnd           *time.Time `json:"windowEnd,omitempty"`
	SafetyMarginSeconds float64    `json:"safetyMarginSeconds"`
	// FarAhead is set when the deadline is further away than --maintenance-lead: the node then
	// only gets the maintenance taint and nothing is evicted yet.
	FarAhead bool `json:"farAhead,omitempty"`
	// NoExecuteTaints are the taints the plan counts from, as key=value:NoExecute@timeAdded
	// (with --interruption-eviction=reprieve, the NoSchedule interruption taint read as NoExecute).
	NoExecuteTaints []string `json:"noExecuteTaints"`
	// InterruptionEviction is who deletes the pods (--interruption-eviction): kube-controller-manager
	// or reprieve; InterruptionTaint the interruption taint as it is written on the node.
	InterruptionEviction string    `json:"interruptionEviction"`
	InterruptionTaint    string    `json:"interruptionTaint"`
	Pods                 []PodPlan `json:"pods"`
}

// PodPlan is one pod's line of a NodePlan.
type PodPlan struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Action is "evict" or "skip".
	Action string `json:"action"`
	// SkipReason says why a skipped pod is left alone (finished, mirror-pod, daemonset-pod,
	// reprieve-itself, tolerates-forever, no-noexecute-taint).
	SkipReason string `json:"skipReason,omitempty"`
	// Taint is the NoExecute taint that decides Due, and Toleration the pod's toleration of it
	// ("none" when it has none).
	Taint      string `json:"taint,omitempty"`
	Toleration string `json:"toleration,omitempty"`
	// Due is the upstream time (timeAdded + tolerationSeconds); Latest the last start that still
	// ends by the window's end with the pod's whole grace; EvictAt = min(Due, Latest).
	Due     *time.Time `json:"due,omitempty"`
	Latest  *time.Time `json:"latest,omitempty"`
	EvictAt *time.Time `json:"evictAt,omitempty"`
	// SendAt is when the request leaves: EvictAt, or 500 ms before it when the deadline decides,
	// and never before now.
	SendAt     *time.Time `json:"sendAt,omitempty"`
	ByDeadline bool       `json:"byDeadline,omitempty"`
	// PodGraceSeconds is terminationGracePeriodSeconds; GraceSeconds what the eviction asks for.
	PodGraceSeconds float64 `json:"podGraceSeconds,omitempty"`
	GraceSeconds    float64 `json:"graceSeconds,omitempty"`
	// PDB is the PodDisruptionBudget that covers the pod, if any.
	PDB *PDBPlan `json:"pdb,omitempty"`
	// VolumeReleaseBy is when a pod with a volume that needs attaching must be gone for the
	// kubelet to release it before the machine goes (--volume-release before the deadline);
	// VolumeAtRisk is set when even the least grace sent at SendAt ends after it.
	VolumeReleaseBy *time.Time `json:"volumeReleaseBy,omitempty"`
	VolumeAtRisk    bool       `json:"volumeAtRisk,omitempty"`
	// Volumes are, for such a pod, its volumes that attach, each with where the node's status
	// has it now (NoteVolumes); NoAttach its claimed volumes that attach to no node;
	// VolumesUnknown why they could not all be read.
	Volumes        []PodVolume `json:"volumes,omitempty"`
	NoAttach       []string    `json:"noAttach,omitempty"`
	VolumesUnknown string      `json:"volumesUnknown,omitempty"`
}

// PodVolume is one of a pod's volumes that attach, by the name the node lists it with, and its
// state in the node's status now.
type PodVolume struct {
	Name v1.UniqueVolumeName `json:"name"`
	// State is "in use" (in status.volumesInUse: the kubelet has not released it), "released"
	// (attached, no longer in use: the controller may detach it) or "not attached" (in
	// neither list: released and detached, or never attached here).
	State string `json:"state"`
}

// The states of a PodVolume.
const (
	VolumeInUse       = "in use"
	VolumeReleased    = "released"
	VolumeNotAttached = "not attached"
)

// NoteVolumes fills pp's volumes from what was read of them (vols, err) and the node's status:
// which of them the kubelet still lists in use, which it released. It is pure.
func NoteVolumes(pp *PodPlan, node *v1.Node, vols evict.VolumesOf, err error) {
	inUse, attached := map[v1.UniqueVolumeName]bool{}, map[v1.UniqueVolumeName]bool{}
	if node != nil {
		for _, n := range node.Status.VolumesInUse {
			inUse[n] = true
		}
		for _, a := range node.Status.VolumesAttached {
			attached[a.Name] = true
		}
	}
	pp.Volumes = nil
	for _, name := range vols.Attach {
		state := VolumeNotAttached
		switch {
		case inUse[name]:
			state = VolumeInUse
		case attached[name]:
			state = VolumeReleased
		}
		pp.Volumes = append(pp.Volumes, PodVolume{Name: name, State: state})
	}
	pp.NoAttach = vols.NoAttach
	if err != nil {
		pp.VolumesUnknown = err.Error()
	}
}

// PDBPlan says whether a PodDisruptionBudget would refuse the eviction, and what then happens.
type PDBPlan struct {
	Name               string `json:"name"`
	DisruptionsAllowed int32  `json:"disruptionsAllowed"`
	Blocks             bool   `json:"blocks"`
	Then               string `json:"then,omitempty"`
	// Covering lists every budget that selects the pod when there is more than one: the
	// Eviction API then refuses it (500) whatever the budgets allow.
	Covering []string `json:"covering,omitempty"`
}

// Plan says what the agent with cfg would do if a notice with in.Deadline arrived at
// in.NoticeTime, with the agent's own code: the same intent, node change and pod planner as
// reconcile and the eviction loop. It changes nothing.
func Plan(cfg config.Config, in Input) NodePlan {
	ts := cfg.TaintSet()
	noticeAt := in.NoticeTime
	if noticeAt.IsZero() {
		noticeAt = in.Now
	}
	noticeAt = noticeAt.Truncate(time.Second)
	var notices []providers.Notice
	if !in.Deadline.IsZero() {
		notices = []providers.Notice{{Provider: "what-if", Kind: providers.KindSpotInterruption, ID: "what-if",
			Deadline: in.Deadline, NoticeTime: noticeAt, Action: "terminate"}}
	}
	intent := plan.Intend(notices, in.Now, cfg.MaintenanceLead, ts)
	taints := record.ComputeNodeChange(in.Node, record.NodeDesire{Intent: intent, Taints: ts,
		AddedAt: func(string) time.Time { return noticeAt }}).Taints
	onNode := map[string]bool{}
	for _, t := range in.Node.Spec.Taints {
		onNode[record.TaintID(t)] = true
	}
	out := NodePlan{Node: in.Node.Name, NoticeTime: noticeAt, SafetyMarginSeconds: cfg.SafetyMargin.Seconds(),
		FarAhead: len(intent.FarAhead) > 0, NoExecuteTaints: []string{}, Pods: []PodPlan{},
		InterruptionEviction: string(ts.Eviction()), InterruptionTaint: evict.TaintString(ts.Interruption)}
	// As the agent anchors the taints (plan.CountdownTaints, which its reconcile loop calls): a
	// taint already on the node counts from min(timeAdded, first seen: now), one without
	// timeAdded from now; the imagined notice's own taint keeps its notice time, future or not;
	// someone else's NoSchedule taint of the interruption's key and value counts from the notice.
	foreign := record.HasTaint(in.Node.Spec.Taints, ts.Interruption) && !record.Owns(in.Node, ts.Interruption)
	now := in.Now.Truncate(time.Second)
	noExecute := plan.CountdownTaints(taints, ts, intent.Interrupting(), foreign, noticeAt, now, func(t v1.Taint) time.Time {
		if onNode[record.TaintID(t)] {
			return now
		}
		return time.Time{}
	})
	for _, t := range noExecute {
		out.NoExecuteTaints = append(out.NoExecuteTaints, evict.TaintString(t)+"@"+t.TimeAdded.UTC().Format(time.RFC3339))
	}
	w := plan.Window{SafetyMargin: cfg.SafetyMargin}
	if intent.Interrupting() {
		w.VolumeRelease, _ = volumes.ReleaseOf(cfg, in.Kubelet)
	}
	if intent.Interrupting() {
		w.Deadline = intent.Deadline
		d, end := w.Deadline, w.End()
		out.Deadline, out.WindowEnd = &d, &end
	}
	filter := cfg.PodFilter()
	pods := slices.Clone(in.Pods)
	slices.SortFunc(pods, func(a, b *v1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, pod := range pods {
		pl := plan.PlanPod(pod, noExecute, w, filter, cfg.TolerationComparisonOperators)
		pp := PodPlan{Namespace: pod.Namespace, Name: pod.Name, Action: "evict"}
		if pl.Skip != plan.SkipNone {
			pp.Action, pp.SkipReason = "skip", string(pl.Skip)
			out.Pods = append(out.Pods, pp)
			continue
		}
		if pl.DueTaint != nil {
			pp.Taint = evict.TaintString(*pl.DueTaint)
			pp.Toleration = tolerationOf(pod, pl.DueTaint, cfg.TolerationComparisonOperators)
		}
		due, evictAt := pl.Due, pl.EvictAt
		pp.Due, pp.EvictAt = &due, &evictAt
		if !pl.Latest.IsZero() {
			latest := pl.Latest
			pp.Latest = &latest
		}
		// A time already past is acted on at once, with the grace that is left then, in whole
		// seconds as the request carries it.
		send := plan.SendAt(pl)
		if send.Before(in.Now) {
			send = in.Now
		}
		pp.SendAt, pp.ByDeadline = &send, pl.ByDeadline
		pp.PodGraceSeconds = pl.Grace.Seconds()
		bw := pl.Bound(w) // a volume's release, when it binds the pod
		pp.GraceSeconds = float64(int64(plan.GraceAt(pl.Grace, bw, send.Add(plan.RequestAllowance+pl.Tail)) / time.Second))
		if pl.Volume {
			by := bw.End()
			pp.VolumeReleaseBy = &by
			pp.VolumeAtRisk = send.Add(plan.RequestAllowance + plan.MinGrace + pl.Tail).After(by)
		}
		if pdbs := coveringPDBs(pod, in.PDBs); len(pdbs) > 0 {
			pdb := pdbs[0]
			pp.PDB = &PDBPlan{Name: pdb.Name, DisruptionsAllowed: pdb.Status.DisruptionsAllowed, Blocks: pdb.Status.DisruptionsAllowed < 1}
			if len(pdbs) > 1 {
				pp.PDB.Blocks = true
				for _, p := range pdbs {
					pp.PDB.Covering = append(pp.PDB.Covering, p.Name)
				}
			}
			switch {
			case len(pdbs) > 1 && w.HasDeadline():
				pp.PDB.Then = fmt.Sprintf("the Eviction API refuses a pod that more than one PodDisruptionBudget covers: retried until %s, then deleted with the grace left",
					pl.Latest.Add(-plan.EvictionLead).UTC().Format(time.RFC3339))
			case len(pdbs) > 1:
				pp.PDB.Then = "the Eviction API refuses a pod that more than one PodDisruptionBudget covers (no deadline: never deleted)"
			case !pp.PDB.Blocks:
			case w.HasDeadline() && ts.Eviction() == plan.EvictionKubeControllerManager && !pl.ByDeadline && pl.DueTaint != nil:
				// A NoExecute taint makes the pod due before reprieve needs it gone: the
				// taint-eviction controller, which runs in every managed cluster, deletes it
				// then, without asking the budget.
				pp.PDB.Then = fmt.Sprintf("kube-controller-manager's taint eviction deletes it at %s (DUE), past the budget; "+
					"with --interruption-eviction=reprieve the budget holds until %s, then it is deleted with the grace left",
					pl.Due.UTC().Format(time.RFC3339), pl.Latest.Add(-plan.EvictionLead).UTC().Format(time.RFC3339))
			case w.HasDeadline():
				pp.PDB.Then = fmt.Sprintf("evictions retried with backoff until %s, then the pod is deleted with the grace left",
					pl.Latest.Add(-plan.EvictionLead).UTC().Format(time.RFC3339))
			default:
				pp.PDB.Then = "evictions retried with backoff for as long as the budget refuses (no deadline: never deleted)"
			}
		}
		out.Pods = append(out.Pods, pp)
	}
	return out
}

// tolerationOf describes pod's toleration of taint.
func tolerationOf(pod *v1.Pod, taint *v1.Taint, comparisonOperators bool) string {
	for i := range pod.Spec.Tolerations {
		tol := &pod.Spec.Tolerations[i]
		if !tol.ToleratesTaint(klog.Background(), taint, comparisonOperators) {
			continue
		}
		var b strings.Builder
		b.WriteString(cmp.Or(tol.Key, "*"))
		if tol.Operator == v1.TolerationOpExists {
			b.WriteString(" Exists")
		} else if tol.Value != "" {
			b.WriteString("=" + tol.Value)
		}
		if tol.Effect != "" {
			b.WriteString(":" + string(tol.Effect))
		}
		if tol.TolerationSeconds != nil {
			fmt.Fprintf(&b, " for %ds", *tol.TolerationSeconds)
		} else {
			b.WriteString(" forever")
		}
		return b.String()
	}
	return "none"
}

// coveringPDBs returns the PodDisruptionBudgets of pod's namespace whose selector matches it,
// as the eviction registry finds them: in policy/v1 a nil selector selects nothing and an empty
// one every pod of the namespace.
func coveringPDBs(pod *v1.Pod, pdbs []policyv1.PodDisruptionBudget) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for i := range pdbs {
		pdb := &pdbs[i]
		if pdb.Namespace != pod.Namespace || pdb.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			out = append(out, pdb)
		}
	}
	return out
}

// EvictionSummary says in one line who deletes the pods of an interruption with cfg
// (--interruption-eviction) and what that does to their PodDisruptionBudgets, for /readyz,
// `reprieve doctor` and `reprieve plan`.
func EvictionSummary(cfg config.Config) string {
	ts := cfg.TaintSet()
	if ts.Eviction() == plan.EvictionReprieve {
		return fmt.Sprintf("interruption eviction: reprieve: the interruption taint %s keeps kube-controller-manager's taint eviction out; "+
			"reprieve evicts each pod when %s would make it due, through the Eviction API, its budget kept until its last safe moment",
			evict.TaintString(ts.Interruption), evict.TaintString(ts.Evicting()))
	}
	return fmt.Sprintf("interruption eviction: kube-controller-manager: under the interruption taint %s its taint-eviction controller deletes "+
		"each pod when its toleration runs out (one without at once), past its PodDisruptionBudget; --interruption-eviction=reprieve keeps budgets",
		evict.TaintString(ts.Interruption))
}
