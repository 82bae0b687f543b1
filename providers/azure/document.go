package azure

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// The event types of Scheduled Events api-version 2020-07-01.
const (
	EventTypeFreeze    = "Freeze"
	EventTypeReboot    = "Reboot"
	EventTypeRedeploy  = "Redeploy"
	EventTypePreempt   = "Preempt"
	EventTypeTerminate = "Terminate"
)

// The event statuses. No Completed or Canceled status exists: a finished or cancelled event
// disappears from the document.
const (
	EventStatusScheduled = "Scheduled"
	EventStatusStarted   = "Started"
)

// notBeforeLayout is NotBefore's format, RFC 1123 ("Mon, 19 Sep 2016 18:29:47 GMT", .NET's "R").
// A literal GMT (not the MST zone token) keeps the host's time zone out of the parse, as in
// the aws provider. Go does not check the weekday, which Microsoft's own example gets wrong.
const notBeforeLayout = "Mon, _2 Jan 2006 15:04:05 GMT"

// ErrUnknownEventType marks an event of a type this provider does not know. Poll reports it
// and still returns every other notice.
var ErrUnknownEventType = errors.New("unknown event type")

// ScheduledEventsDocument is the answer of GET /metadata/scheduledevents.
type ScheduledEventsDocument struct {
	// DocumentIncarnation increases whenever Events changes; an unchanged incarnation means an
	// unchanged document.
	DocumentIncarnation int `json:"DocumentIncarnation"`
	// Events lists every event not yet finished or cancelled, for every VM of the availability
	// set or scale set placement group: filter on Resources.
	Events []Event `json:"Events"`
}

// Event is one scheduled event.
type Event struct {
	// EventId is a GUID, stable for the life of the event.
	EventId string `json:"EventId"`
	// EventType is one of the EventType constants.
	EventType string `json:"EventType"`
	// ResourceType is "VirtualMachine".
	ResourceType string `json:"ResourceType"`
	// Resources names the affected VMs: "<vmss>_<instance id>" for a scale set instance, the VM
	// name otherwise.
	Resources []string `json:"Resources"`
	// EventStatus is Scheduled or Started.
	EventStatus string `json:"EventStatus"`
	// NotBefore is when the event may start, RFC 1123 in GMT; empty once it started.
	NotBefore string `json:"NotBefore"`
	// Description is free text ("Host server is undergoing maintenance.").
	Description string `json:"Description"`
	// EventSource is Platform or User.
	EventSource string `json:"EventSource"`
	// DurationInSeconds is the expected interruption; -1 when unknown.
	DurationInSeconds int `json:"DurationInSeconds"`
}

// wireDocument decodes what IMDS sent more carefully than ScheduledEventsDocument could: a
// missing key is told apart from an empty one, and integers may come quoted.
type wireDocument struct {
	DocumentIncarnation *looseInt       `json:"DocumentIncarnation"`
	Events              json.RawMessage `json:"Events"`
}

type wireEvent struct {
	EventId           string   `json:"EventId"`
	EventType         string   `json:"EventType"`
	ResourceType      string   `json:"ResourceType"`
	Resources         []string `json:"Resources"`
	EventStatus       string   `json:"EventStatus"`
	NotBefore         string   `json:"NotBefore"`
	Description       string   `json:"Description"`
	EventSource       string   `json:"EventSource"`
	DurationInSeconds looseInt `json:"DurationInSeconds"`
}

// looseInt accepts 7 and "7". Every other IMDS document serves its primitives as strings, and
// Microsoft's older samples quote DocumentIncarnation: a quoted number must not blind the agent.
type looseInt int

func (n *looseInt) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if unq, err := strconv.Unquote(s); err == nil {
		s = strings.TrimSpace(unq)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want an integer, got %s", b)
	}
	*n = looseInt(v)
	return nil
}

// ParseDocument decodes a Scheduled Events document. A body that is not a JSON object with both
// DocumentIncarnation and Events (an HTML error page, "null", an {"error": ...} object) is an
// error, never an empty document: an empty document withdraws every notice.
func ParseDocument(body []byte) (ScheduledEventsDocument, error) {
	inc, raw, err := decodeHeader(body)
	if err != nil {
		return ScheduledEventsDocument{}, err
	}
	var wire []wireEvent
	if err := json.Unmarshal(raw, &wire); err != nil {
		return ScheduledEventsDocument{}, fmt.Errorf("decoding scheduled events %q: Events: %w", truncate(body), err)
	}
	doc := ScheduledEventsDocument{DocumentIncarnation: inc, Events: make([]Event, 0, len(wire))}
	for _, w := range wire {
		doc.Events = append(doc.Events, Event{
			EventId:           w.EventId,
			EventType:         w.EventType,
			ResourceType:      w.ResourceType,
			Resources:         w.Resources,
			EventStatus:       w.EventStatus,
			NotBefore:         w.NotBefore,
			Description:       w.Description,
			EventSource:       w.EventSource,
			DurationInSeconds: int(w.DurationInSeconds),
		})
	}
	return doc, nil
}

// decodeHeader reads DocumentIncarnation and leaves Events undecoded, so that an unchanged
// document is not decoded further.
func decodeHeader(body []byte) (incarnation int, events json.RawMessage, err error) {
	var w wireDocument
	if err := json.Unmarshal(body, &w); err != nil {
		return 0, nil, fmt.Errorf("decoding scheduled events %q: %w", truncate(body), err)
	}
	var missing []string
	if w.DocumentIncarnation == nil {
		missing = append(missing, "DocumentIncarnation")
	}
	if len(w.Events) == 0 {
		missing = append(missing, "Events")
	}
	if len(missing) > 0 {
		return 0, nil, fmt.Errorf("decoding scheduled events %q: no %s", truncate(body), strings.Join(missing, " and no "))
	}
	return int(*w.DocumentIncarnation), w.Events, nil
}

// names reports whether resources lists name. Azure's names are case-insensitive.
func names(resources []string, name string) bool {
	for _, r := range resources {
		if strings.EqualFold(strings.TrimSpace(r), name) {
			return true
		}
	}
	return false
}

// others returns the resources other than name, in the document's order.
func others(resources []string, name string) []string {
	var out []string
	for _, r := range resources {
		if r = strings.TrimSpace(r); r != "" && !strings.EqualFold(r, name) {
			out = append(out, r)
		}
	}
	return out
}

// started reports whether the event is under way: Azure says Started, or has blanked NotBefore.
func started(ev Event) bool {
	return strings.EqualFold(ev.EventStatus, EventStatusStarted) || strings.TrimSpace(ev.NotBefore) == ""
}

// eventKind maps an event type to a notice kind, and says whether the notice has a deadline.
func eventKind(eventType string, freezeInterrupts bool) (providers.Kind, bool, error) {
	switch {
	case strings.EqualFold(eventType, EventTypePreempt):
		return providers.KindPreemption, true, nil
	case strings.EqualFold(eventType, EventTypeTerminate):
		return providers.KindTermination, true, nil
	case strings.EqualFold(eventType, EventTypeReboot), strings.EqualFold(eventType, EventTypeRedeploy):
		return providers.KindScheduledMaintenance, true, nil
	case strings.EqualFold(eventType, EventTypeFreeze):
		// A Freeze pauses the VM for seconds with memory and open files intact (live migration,
		// memory-preserving host update): pods survive it, so by default it only keeps new pods
		// off the node, like GCP's MIGRATE_ON_HOST_MAINTENANCE.
		return providers.KindScheduledMaintenance, freezeInterrupts, nil
	}
	return "", false, fmt.Errorf("%w %q", ErrUnknownEventType, eventType)
}

// toNotice maps one event that names this machine. firstSeen is when reprieve first saw the
// event; startedSeen when it first saw it started (zero while it has not).
func toNotice(ev Event, freezeInterrupts bool, firstSeen, startedSeen time.Time) (providers.Notice, error) {
	kind, hasDeadline, err := eventKind(ev.EventType, freezeInterrupts)
	if err != nil {
		return providers.Notice{}, fmt.Errorf("event %q: %w", ev.EventId, err)
	}
	n := providers.Notice{
		Provider:    Name,
		Kind:        kind,
		ID:          ev.EventId,
		NoticeTime:  firstSeen,
		Action:      ev.EventType,
		Description: ev.Description,
		Source:      SourceScheduledEvents,
	}
	if n.Description == "" {
		n.Description = "Azure scheduled event " + ev.EventType
	}
	if !hasDeadline {
		return n, nil
	}
	nb, nbErr := parseNotBefore(ev.NotBefore)
	switch {
	case !startedSeen.IsZero():
		// Under way: the machine goes now. A NotBefore still present and earlier is kept (an
		// event seen late); one that does not parse no longer matters.
		n.Deadline = startedSeen
		if nbErr == nil && !nb.IsZero() && nb.Before(startedSeen) {
			n.Deadline = nb
		}
	case nbErr != nil:
		return providers.Notice{}, fmt.Errorf("event %q (%s): %w", ev.EventId, ev.EventType, nbErr)
	default:
		n.Deadline = nb
	}
	return n, nil
}

// parseNotBefore parses NotBefore; empty gives the zero time.
func parseNotBefore(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(notBeforeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parsing NotBefore %q: want RFC 1123 in GMT (Mon, 19 Sep 2016 18:29:47 GMT)", s)
	}
	return t, nil
}

func truncate(b []byte) string {
	const max = 120
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
