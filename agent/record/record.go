package record

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

// Record is the interruption record the node carries in AnnotationInterruption: every notice in
// force, with the source that raised it and when it was first seen. With the interruption taint's
// timeAdded (when the countdowns started) and AnnotationReclaimDeadline, it is what a new agent
// process resumes: it never re-anchors a deadline or a countdown on its own clock, and a notice
// stays until the source that raised it answers without it.
type Record struct {
	Notices []Entry `json:"notices"`
}

// Entry is one notice of a Record. Times are whole seconds (RFC 3339), as the annotation holds
// them; rounding a first-seen time down only ever leaves less time, never more.
type Entry struct {
	Provider string `json:"provider"`
	// Source is the metadata source that raised the notice (providers.Notice.Source); empty
	// for a record written before sources were recorded.
	Source string `json:"source,omitempty"`
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Action string `json:"action,omitempty"`
	// NoticeTime is when the cloud posted the notice or, with FromFirstSeen, when an agent
	// first saw it; Deadline counts from it then.
	NoticeTime    time.Time  `json:"noticeTime"`
	Deadline      *time.Time `json:"deadline,omitempty"`
	FromFirstSeen bool       `json:"fromFirstSeen,omitempty"`
	// SoftOff is the machine's ACPI soft-off before the deadline, when the cloud gives one.
	SoftOff *time.Time `json:"softOff,omitempty"`
}

// RecordOf is the record of notices, in a stable order, leaving out what changes nothing on the
// node (maintenance information).
func RecordOf(notices []providers.Notice) Record {
	r := Record{Notices: []Entry{}}
	for _, n := range notices {
		if n.Kind == providers.KindMaintenanceInformation {
			continue
		}
		e := Entry{Provider: n.Provider, Source: n.Source, Kind: string(n.Kind), ID: n.ID, Action: n.Action,
			NoticeTime: n.NoticeTime.UTC().Truncate(time.Second), FromFirstSeen: n.FromFirstSeen}
		if !n.Deadline.IsZero() {
			d := n.Deadline.UTC().Truncate(time.Second)
			e.Deadline = &d
		}
		if !n.SoftOff.IsZero() {
			so := n.SoftOff.UTC().Truncate(time.Second)
			e.SoftOff = &so
		}
		r.Notices = append(r.Notices, e)
	}
	slices.SortFunc(r.Notices, func(a, b Entry) int {
		return strings.Compare(a.Source+"\x00"+a.Kind+"\x00"+a.ID, b.Source+"\x00"+b.Kind+"\x00"+b.ID)
	})
	return r
}

// Resume turns the record back into the notices it holds.
func (r Record) Resume() []providers.Notice {
	out := make([]providers.Notice, 0, len(r.Notices))
	for _, e := range r.Notices {
		n := providers.Notice{Provider: e.Provider, Source: e.Source, Kind: providers.Kind(e.Kind), ID: e.ID, Action: e.Action,
			NoticeTime: e.NoticeTime, FromFirstSeen: e.FromFirstSeen, Description: "resumed from the node's " + AnnotationInterruption + " record"}
		if e.Deadline != nil {
			n.Deadline = *e.Deadline
		}
		if e.SoftOff != nil {
			n.SoftOff = *e.SoftOff
		}
		out = append(out, n)
	}
	return out
}

// encode is the annotation's value; "" for an empty record.
func (r Record) encode() string {
	if len(r.Notices) == 0 {
		return ""
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "" // a struct of strings and times always encodes
	}
	return string(b)
}

// Read returns the record node carries, when reprieve wrote one and it decodes. A damaged record
// is reported as absent (ok false): the caller then falls back to what the taint and the deadline
// annotation say, never to nothing.
func Read(node *v1.Node) (r Record, ok bool) {
	if node == nil {
		return Record{}, false
	}
	v, has := node.Annotations[AnnotationInterruption]
	if !has || json.Unmarshal([]byte(v), &r) != nil {
		return Record{}, false
	}
	return r, true
}

// HasNotices reports whether node carries a record of at least one notice: an interruption a
// new agent process resumes.
func HasNotices(node *v1.Node) bool {
	r, ok := Read(node)
	return ok && len(r.Notices) > 0
}

// Owns reports whether reprieve added the taint t (by key and effect) and the node still
// carries it: only such a taint is reprieve's own to resume or to remove.
func Owns(node *v1.Node, t v1.Taint) bool {
	if node == nil {
		return false
	}
	return setOf(parseOwned(node).Taints)[TaintID(t)] && HasTaint(node.Spec.Taints, t)
}
