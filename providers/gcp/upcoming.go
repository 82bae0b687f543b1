package gcp

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The values of instance/upcoming-maintenance's keys.
const (
	UpcomingStatusPending   = "PENDING"
	UpcomingStatusOngoing   = "ONGOING"
	UpcomingTypeScheduled   = "SCHEDULED"
	UpcomingTypeUnscheduled = "UNSCHEDULED"
	upcomingMaxBody         = 64 << 10
)

// Upcoming is instance/upcoming-maintenance: host maintenance GCE has scheduled for this VM,
// for some machine families weeks ahead (GCE "Monitor and plan for a host maintenance event").
type Upcoming struct {
	// Status is maintenance-status: PENDING, or ONGOING once the window started.
	Status string
	// Type is SCHEDULED or UNSCHEDULED.
	Type string
	// WindowStart is window-start-time: when the maintenance may begin; zero when absent.
	WindowStart time.Time
	// WindowEnd is window-end-time; zero when absent.
	WindowEnd time.Time
	// LatestWindowStart is latest-window-start-time, how far it can be rescheduled.
	LatestWindowStart time.Time
	// CanReschedule is can-reschedule.
	CanReschedule bool

	since time.Time // when reprieve first saw this window
}

func (u *Upcoming) describe() string {
	s := fmt.Sprintf("%s %s, window %s", u.Type, u.Status, formatTime(u.WindowStart))
	if !u.WindowEnd.IsZero() {
		s += " to " + formatTime(u.WindowEnd)
	}
	if u.CanReschedule {
		s += ", can be rescheduled"
	}
	return s
}

// same reports whether two answers describe the same window.
func (u *Upcoming) same(o *Upcoming) bool {
	if u == nil || o == nil {
		return u == o
	}
	return u.Status == o.Status && u.Type == o.Type && u.WindowStart.Equal(o.WindowStart) &&
		u.WindowEnd.Equal(o.WindowEnd) && u.LatestWindowStart.Equal(o.LatestWindowStart) && u.CanReschedule == o.CanReschedule
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}

// ParseUpcoming decodes the answer to instance/upcoming-maintenance/?recursive=true. A
// recursive directory answer is a JSON object whose keys GCE writes in camelCase
// (windowStartTime for window-start-time); the hyphenated and snake_case spellings are read
// too, so that an emulator's spelling does not hide a window. Values are strings (times in
// RFC 3339); can-reschedule may be a string or a boolean. A payload that is not an object, a
// time that does not parse, or an object without a status, type or window is an error.
func ParseUpcoming(body []byte) (*Upcoming, error) {
	if len(body) > upcomingMaxBody {
		return nil, fmt.Errorf("decoding %s: answer of %d bytes is too large", PathUpcomingMaintenance, len(body))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("decoding %s %q: %w", PathUpcomingMaintenance, truncate(string(body)), err)
	}
	if raw == nil {
		return nil, fmt.Errorf("decoding %s %q: not an object", PathUpcomingMaintenance, truncate(string(body)))
	}
	var u Upcoming
	seen := 0
	for k, v := range raw {
		key := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(k))
		var err error
		switch key {
		case "maintenancestatus":
			u.Status, err = stringValue(v)
			u.Status = normalize(u.Status)
		case "type":
			u.Type, err = stringValue(v)
			u.Type = normalize(u.Type)
		case "windowstarttime":
			u.WindowStart, err = timeValue(v)
		case "windowendtime":
			u.WindowEnd, err = timeValue(v)
		case "latestwindowstarttime":
			u.LatestWindowStart, err = timeValue(v)
		case "canreschedule":
			u.CanReschedule, err = boolValue(v)
		default:
			continue // GCE adds keys; they are no error
		}
		if err != nil {
			return nil, fmt.Errorf("decoding %s: key %q: %w", PathUpcomingMaintenance, k, err)
		}
		seen++
	}
	if seen == 0 || (u.Status == "" && u.Type == "" && u.WindowStart.IsZero()) {
		return nil, fmt.Errorf("decoding %s %q: no maintenance-status, type nor window-start-time", PathUpcomingMaintenance, truncate(string(body)))
	}
	return &u, nil
}

func stringValue(v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("want a string, got %s", truncate(string(v)))
	}
	return strings.TrimSpace(s), nil
}

func timeValue(v json.RawMessage) (time.Time, error) {
	s, err := stringValue(v)
	if err != nil || s == "" {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parsing time %q: %w", s, err)
	}
	return t, nil
}

func boolValue(v json.RawMessage) (bool, error) {
	var b bool
	if err := json.Unmarshal(v, &b); err == nil {
		return b, nil
	}
	s, err := stringValue(v)
	if err != nil {
		return false, err
	}
	b, err = strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("want true or false, got %q", s)
	}
	return b, nil
}
