// Package azureevents is a fake Azure instance metadata service (IMDS) that serves Scheduled
// Events and instance compute metadata, for unit and end-to-end tests. No emulator of Scheduled
// Events can be installed here, so this one is written from Microsoft's documentation
// ("Azure Metadata Service: Scheduled Events for Linux VMs", api-version 2020-07-01, and
// "Azure Instance Metadata Service"), with JSON types of its own rather than reprieve's, so that
// it does not share the client's reading of the protocol.
//
// What it does, as documented:
//   - Every request needs the header "Metadata: true" and must not carry X-Forwarded-For; it
//     needs one api-version that the endpoint knows. Otherwise: 400 with a JSON error.
//   - GET /metadata/scheduledevents serves {"DocumentIncarnation", "Events"}; each change to the
//     events (AddEvent, RemoveEvent, SetStatus, an approval) increments DocumentIncarnation.
//     NotBefore is RFC 1123 in GMT while an event is Scheduled and "" once it is Started.
//   - POST /metadata/scheduledevents with {"StartRequests": [{"EventId": ...}]} approves events:
//     200 when every EventId is listed (again for one already Started), 400 for a malformed body
//     or an unknown EventId (then nothing changes).
//   - GET /metadata/instance/compute serves name, vmScaleSetName and a few other fields, every
//     primitive a string as IMDS serves them.
//   - Throttle(n) makes the next n requests answer 429, as IMDS does above 5 requests a second.
//   - SetFirstAnswerDelay(d): the first GET of scheduled events is answered d after it
//     arrives, with the document as it is then, and so is every GET arriving meanwhile:
//     "the first call ... enables the service ... expect a delayed response in your first call
//     of up to two minutes" (Scheduled Events for Linux VMs, "Enabling and disabling").
//     A client that gives up before the answer has not enabled anything: the next GET waits
//     the whole delay again, as issue 13 saw with a 3 s per-poll timeout ("aborts it over and
//     over ... a Preempt in those minutes is missed").
//   - SetApprovalStartDelay(d): an approved event turns Started d after the approval rather
//     than at once: approval lets the platform start the event, which it then does on its own
//     schedule ("the event may take a while to start": the document shows it Scheduled until
//     then; Scheduled Events, "Start an event").
//
// What it decides where the documentation is silent:
//   - An approved Scheduled event becomes Started at once unless SetApprovalStartDelay says
//     otherwise (Azure may wait for other tenants of the host) and stays listed until the test calls RemoveEvent: Azure removes it when the
//     event completes, about ten minutes later, on no signal from the VM.
//   - AddEvent with the EventId of a listed event replaces it in place (a rescheduled event).
//   - Unknown paths answer 404, other methods 405.
package azureevents

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The documented values of Event's fields.
const (
	EventTypeFreeze    = "Freeze"
	EventTypeReboot    = "Reboot"
	EventTypeRedeploy  = "Redeploy"
	EventTypePreempt   = "Preempt"
	EventTypeTerminate = "Terminate"

	StatusScheduled = "Scheduled"
	StatusStarted   = "Started"

	SourcePlatform = "Platform"
	SourceUser     = "User"
)

// The paths the fake serves.
const (
	ScheduledEventsPath = "/metadata/scheduledevents"
	ComputePath         = "/metadata/instance/compute"
)

// notBeforeFormat is the documented NotBefore format, "Mon, 19 Sep 2016 18:29:47 GMT".
const notBeforeFormat = "Mon, 02 Jan 2006 15:04:05 GMT"

// The api-versions the documentation lists for each endpoint.
var (
	scheduledEventsVersions = []string{"2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"}
	instanceVersions        = []string{
		"2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01", "2018-04-02", "2018-10-01",
		"2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01", "2019-08-15", "2019-11-01",
		"2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01",
		"2021-05-01", "2021-08-01", "2021-10-01", "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01", "2023-11-15",
		"2024-03-15", "2024-07-17", "2025-04-07",
	}
)

// Event is one scheduled event as a test describes it.
type Event struct {
	// EventID is the event's GUID; AddEvent generates one when empty.
	EventID string
	// EventType is one of the EventType constants (any string is served as given).
	EventType string
	// ResourceType defaults to "VirtualMachine".
	ResourceType string
	// Resources names the affected VMs ("<vmss>_<instance id>" or a VM name).
	Resources []string
	// EventStatus defaults to Scheduled.
	EventStatus string
	// NotBefore is served in RFC 1123 while the event is Scheduled; zero serves "".
	NotBefore time.Time
	// Description is free text.
	Description string
	// EventSource defaults to Platform.
	EventSource string
	// DurationInSeconds is served as given (-1 means unknown to Azure).
	DurationInSeconds int
}

// Compute is the part of /metadata/instance/compute the fake serves.
type Compute struct {
	Name           string
	VMScaleSetName string
	ResourceID     string
	Location       string
	Priority       string // "Regular", "Spot" or ""
	EvictionPolicy string // "Deallocate", "Delete" or ""
}

// Counts are the requests the fake received, each counted once under its route.
type Counts struct {
	EventsGets  int // GET /metadata/scheduledevents
	EventsPosts int // POST /metadata/scheduledevents
	ComputeGets int // GET /metadata/instance/compute
	Other       int // any other route or method
	Throttled   int // answered 429
	BadRequests int // answered 400: header, api-version, body, unknown EventId
	MissingMeta int // of BadRequests: no "Metadata: true"
	Approvals   int // approval requests answered 200
	// LastRejected describes the last 400, for test failure messages.
	LastRejected string
}

// Server is the fake. Its zero value is not usable: call New.
type Server struct {
	mu          sync.Mutex
	incarnation int
	events      []Event
	compute     Compute
	approvals   []string
	throttle    int
	counts      Counts
	// firstDelay holds GETs of scheduled events until enabledAt, set by the first one.
	firstDelay   time.Duration
	enabledAt    time.Time
	approveDelay time.Duration
	timers       []*time.Timer
	closed       chan struct{}

	srv *http.Server
	ln  net.Listener
}

// New returns a fake whose compute.name is computeName. Nothing listens until Start; the Server
// is also an http.Handler for httptest.
func New(computeName string) *Server {
	return &Server{incarnation: 1, compute: Compute{Name: computeName, Location: "westeurope"}, closed: make(chan struct{})}
}

// SetFirstAnswerDelay makes the first GET of scheduled events (and every one that arrives
// before it is answered) wait until d after the first arrived, as Azure enabling the service
// does. Call it before the first request.
func (s *Server) SetFirstAnswerDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.firstDelay = d
}

// FirstAnswerAt returns when the delayed first answer is (or was) given; zero before the first
// GET of scheduled events or without SetFirstAnswerDelay.
func (s *Server) FirstAnswerAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.enabledAt
}

// SetApprovalStartDelay makes an approved event turn Started d after its approval.
func (s *Server) SetApprovalStartDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.approveDelay = d
}

// holdFirst waits, for a GET of scheduled events, until the service is enabled. It reports
// false when the client went away or the server closed first.
func (s *Server) holdFirst(r *http.Request) bool {
	s.mu.Lock()
	if s.firstDelay <= 0 {
		s.mu.Unlock()
		return true
	}
	if s.enabledAt.IsZero() {
		s.enabledAt = time.Now().Add(s.firstDelay)
	}
	wait := time.Until(s.enabledAt)
	s.mu.Unlock()
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		s.mu.Lock()
		if time.Now().Before(s.enabledAt) {
			s.enabledAt = time.Time{} // abandoned: the next call starts over
		}
		s.mu.Unlock()
		return false
	case <-s.closed:
		return false
	}
}

// Start listens on addr, which must be a loopback address ("127.0.0.1:0" when empty), and
// returns the base URL to give the client.
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("azureevents: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("azureevents: address %q is not loopback", addr)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return "", errors.New("azureevents: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("azureevents: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(ln) }(s.srv)
	return "http://" + ln.Addr().String(), nil
}

// Close stops a started server. It is safe to call more than once, and without Start.
func (s *Server) Close() {
	s.mu.Lock()
	srv := s.srv
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// AddEvent lists ev, or replaces the listed event with the same EventID, and returns its
// EventID.
func (s *Server) AddEvent(ev Event) string {
	if ev.EventID == "" {
		ev.EventID = newGUID()
	}
	ev.Resources = slices.Clone(ev.Resources)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.index(ev.EventID); i >= 0 {
		s.events[i] = ev
	} else {
		s.events = append(s.events, ev)
	}
	s.incarnation++
	return ev.EventID
}

// RemoveEvent unlists an event, as Azure does once it completed or was cancelled. It reports
// whether the event was listed.
func (s *Server) RemoveEvent(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.index(id)
	if i < 0 {
		return false
	}
	s.events = slices.Delete(s.events, i, i+1)
	s.incarnation++
	return true
}

// SetStatus changes an event's EventStatus. It reports whether the event was listed.
func (s *Server) SetStatus(id, status string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.index(id)
	if i < 0 {
		return false
	}
	if s.events[i].EventStatus != status {
		s.events[i].EventStatus = status
		s.incarnation++
	}
	return true
}

// SetCompute replaces the compute metadata.
func (s *Server) SetCompute(c Compute) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compute = c
}

// Events returns the listed events.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.events)
	for i := range out {
		out[i].Resources = slices.Clone(out[i].Resources)
	}
	return out
}

// DocumentIncarnation returns the incarnation the next GET serves.
func (s *Server) DocumentIncarnation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation
}

// Approvals returns the EventIds of every accepted StartRequest, in the order received.
func (s *Server) Approvals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.approvals)
}

// Throttle makes the next n requests, whatever their route, answer 429.
func (s *Server) Throttle(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle = n
}

// Counts returns the requests received so far.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

func (s *Server) index(id string) int {
	return slices.IndexFunc(s.events, func(e Event) bool { return e.EventID == id })
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read a body before taking the lock, so that a slow client cannot stall the fake.
	body, bodyErr := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if r.Method == http.MethodGet && r.URL.Path == ScheduledEventsPath && r.Header.Get("Metadata") == "true" && !s.holdFirst(r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	route := r.Method + " " + r.URL.Path
	switch route {
	case http.MethodGet + " " + ScheduledEventsPath:
		s.counts.EventsGets++
	case http.MethodPost + " " + ScheduledEventsPath:
		s.counts.EventsPosts++
	case http.MethodGet + " " + ComputePath:
		s.counts.ComputeGets++
	default:
		s.counts.Other++
	}
	if s.throttle > 0 {
		s.throttle--
		s.counts.Throttled++
		writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "Too many requests"})
		return
	}
	// Microsoft: requests must carry "Metadata: true" and no X-Forwarded-For.
	if r.Header.Get("Metadata") != "true" {
		s.counts.MissingMeta++
		s.badRequest(w, route, "Bad request. Required metadata header not specified", nil)
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		s.badRequest(w, route, "Bad request. X-Forwarded-For header is not allowed", nil)
		return
	}
	var versions []string
	switch r.URL.Path {
	case ScheduledEventsPath:
		versions = scheduledEventsVersions
	case ComputePath:
		versions = instanceVersions
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "Not found"})
		return
	}
	q := r.URL.Query()
	for _, vs := range q {
		if len(vs) > 1 {
			s.badRequest(w, route, "Bad request. Duplicate query parameters are not allowed", nil)
			return
		}
	}
	if !slices.Contains(versions, q.Get("api-version")) {
		s.badRequest(w, route, "Bad request. api-version is invalid or was not specified in the request. For more information refer to aka.ms/azureimds",
			versions)
		return
	}
	switch {
	case r.URL.Path == ComputePath && r.Method == http.MethodGet:
		s.serveCompute(w)
	case r.URL.Path == ScheduledEventsPath && r.Method == http.MethodGet:
		s.serveEvents(w)
	case r.URL.Path == ScheduledEventsPath && r.Method == http.MethodPost:
		if bodyErr != nil {
			s.badRequest(w, route, "Bad request. Invalid request body", nil)
			return
		}
		s.approve(w, body, route)
	default:
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "Method not allowed"})
	}
}

// The wire format, written from the documentation's examples (key order as in its sample).
type wireDocument struct {
	DocumentIncarnation int         `json:"DocumentIncarnation"`
	Events              []wireEvent `json:"Events"`
}

type wireEvent struct {
	EventID           string   `json:"EventId"`
	EventStatus       string   `json:"EventStatus"`
	EventType         string   `json:"EventType"`
	ResourceType      string   `json:"ResourceType"`
	Resources         []string `json:"Resources"`
	NotBefore         string   `json:"NotBefore"`
	Description       string   `json:"Description"`
	EventSource       string   `json:"EventSource"`
	DurationInSeconds int      `json:"DurationInSeconds"`
}

type wireStartRequests struct {
	StartRequests []struct {
		EventID string `json:"EventId"`
	} `json:"StartRequests"`
}

func (s *Server) serveEvents(w http.ResponseWriter) {
	doc := wireDocument{DocumentIncarnation: s.incarnation, Events: []wireEvent{}}
	for _, ev := range s.events {
		we := wireEvent{
			EventID:           ev.EventID,
			EventStatus:       or(ev.EventStatus, StatusScheduled),
			EventType:         ev.EventType,
			ResourceType:      or(ev.ResourceType, "VirtualMachine"),
			Resources:         ev.Resources,
			Description:       ev.Description,
			EventSource:       or(ev.EventSource, SourcePlatform),
			DurationInSeconds: ev.DurationInSeconds,
		}
		if we.Resources == nil {
			we.Resources = []string{}
		}
		// Documented: NotBefore "will be blank after the event starts".
		if we.EventStatus != StatusStarted && !ev.NotBefore.IsZero() {
			we.NotBefore = ev.NotBefore.UTC().Format(notBeforeFormat)
		}
		doc.Events = append(doc.Events, we)
	}
	writeJSON(w, http.StatusOK, doc)
}

func (s *Server) serveCompute(w http.ResponseWriter) {
	c := s.compute
	writeJSON(w, http.StatusOK, map[string]any{
		"azEnvironment":  "AzurePublicCloud",
		"evictionPolicy": c.EvictionPolicy,
		"location":       c.Location,
		"name":           c.Name,
		"osProfile":      map[string]string{"computerName": c.Name},
		"osType":         "Linux",
		"priority":       c.Priority,
		"resourceId":     c.ResourceID,
		"vmScaleSetName": c.VMScaleSetName,
		"vmSize":         "Standard_D4s_v5",
		"zone":           "",
	})
}

// approve handles POST StartRequests. The caller holds s.mu.
func (s *Server) approve(w http.ResponseWriter, body []byte, route string) {
	var req wireStartRequests
	if err := json.Unmarshal(body, &req); err != nil {
		s.badRequest(w, route, "Bad request. Invalid request body", nil)
		return
	}
	if len(req.StartRequests) == 0 {
		s.badRequest(w, route, "Bad request. StartRequests is empty", nil)
		return
	}
	var idx []int
	for _, sr := range req.StartRequests {
		i := s.index(sr.EventID)
		if sr.EventID == "" || i < 0 {
			s.badRequest(w, route, fmt.Sprintf("Bad request. Unknown EventId %q", sr.EventID), nil)
			return
		}
		idx = append(idx, i)
	}
	changed := false
	for k, i := range idx {
		s.approvals = append(s.approvals, req.StartRequests[k].EventID)
		if s.events[i].EventStatus != StatusStarted && s.approveDelay <= 0 {
			s.events[i].EventStatus = StatusStarted
			changed = true
		}
	}
	if changed {
		s.incarnation++
	}
	if s.approveDelay > 0 {
		ids := make([]string, 0, len(req.StartRequests))
		for _, sr := range req.StartRequests {
			ids = append(ids, sr.EventID)
		}
		s.timers = append(s.timers, time.AfterFunc(s.approveDelay, func() {
			for _, id := range ids {
				s.SetStatus(id, StatusStarted)
			}
		}))
	}
	s.counts.Approvals++
	w.WriteHeader(http.StatusOK)
}

// badRequest answers 400 as IMDS does; versions, when given, fills "newest-versions".
func (s *Server) badRequest(w http.ResponseWriter, route, msg string, versions []string) {
	s.counts.BadRequests++
	s.counts.LastRejected = route + ": " + msg
	body := map[string]any{"error": msg}
	if len(versions) > 0 {
		newest := slices.Clone(versions[max(0, len(versions)-3):])
		slices.Reverse(newest)
		body["newest-versions"] = newest
	}
	writeJSON(w, http.StatusBadRequest, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// newGUID returns a random GUID in Azure's upper-case form.
func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return strings.ToUpper(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}
