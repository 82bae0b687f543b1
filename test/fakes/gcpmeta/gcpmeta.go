// Package gcpmeta is a GCE metadata server for tests, written from the documented protocol
// (https://cloud.google.com/compute/docs/metadata/querying-metadata): it refuses requests
// without Metadata-Flavor: Google, serves ETags, and implements hanging GETs
// (wait_for_change, last_etag, timeout_sec) fully, unlike the emulators we found.
// Faults (error statuses, dropped connections, an unreachable server, a stall) are injected
// per test.
//
// Behaviours emulated, with their source:
//   - every key is hyphenated, the provisioning model included:
//     instance/scheduling/provisioning-model is SPOT or STANDARD (GCE "About VM metadata",
//     the scheduling/ directory; gcloud's --provisioning-model);
//   - a directory read with ?recursive=true answers one JSON object whose keys are the
//     entries' names in camelCase (GCE "Query VM metadata": recursive contents);
//   - instance/upcoming-maintenance/ holds maintenance-status, type, window-start-time,
//     window-end-time, latest-window-start-time and can-reschedule while host maintenance is
//     scheduled, and is absent (404) otherwise (GCE "Monitor and plan for a host maintenance
//     event");
//   - a VM with a GPU attached sees maintenance-event TERMINATE_ON_HOST_MAINTENANCE one hour
//     before it is stopped, "while normal VMs receive only a 60-second notice" (GCE "Handling
//     GPU host maintenance events"): ScheduleGPUMaintenance, and StopForMaintenance for either;
//   - instance/machine-type is projects/NUMBER/machineTypes/NAME (GCE "Predefined metadata
//     keys"); a fresh server is an ordinary n2-standard-4, ScheduleGPUMaintenance makes it an
//     a2-highgpu-1g (GCE "Accelerator-optimized machine family": A2 comes with A100 GPUs);
//   - with an extended preemption notice (scheduling.preemptionNoticeDuration, beta: "the
//     Metadata Service preemption notice duration before the GCE ACPI G2 Soft Off signal is
//     triggered for Spot VMs only. If not specified, there will be no wait before the G2 Soft
//     Off signal is triggered", Compute Engine API reference, Scheduling), preempted turns TRUE
//     that long before the soft-off, and the power-off follows 30 s after the soft-off (GCE
//     "Preemption process"): Preempt. The metadata server serves no key with the duration.
//   - a stall keeps the connection open and answers nothing, without a reset, as a metadata
//     server that hangs does (issue 13): SetStall and StallHeld.
package gcpmeta

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Prefix is the path under which every metadata value is served.
const Prefix = "/computeMetadata/v1/"

// The paths reprieve reads, relative to Prefix.
const (
	PathPreempted         = "instance/preempted"
	PathMaintenanceEvent  = "instance/maintenance-event"
	PathPreemptible       = "instance/scheduling/preemptible"
	PathProvisioningModel = "instance/scheduling/provisioning-model"
	PathOnHostMaintenance = "instance/scheduling/on-host-maintenance"
	PathMachineType       = "instance/machine-type"
	// PathUpcomingMaintenance is a directory: read it with ?recursive=true.
	PathUpcomingMaintenance = "instance/upcoming-maintenance/"
	PathID                  = "instance/id"
	PathName                = "instance/name"
	PathZone                = "instance/zone"
	PathProjectID           = "project/project-id"
	PathNumericProjectID    = "project/numeric-project-id"
)

// defaults is what a fresh server holds: a standard VM with nothing pending. The scheduling
// values are absent (404) until a test sets them.
var defaults = map[string]string{
	PathPreempted:        "FALSE",
	PathMaintenanceEvent: "NONE",
	PathID:               "4520031799277581759",
	PathName:             "reprieve-test",
	PathZone:             "projects/123456789012/zones/europe-west1-b",
	PathProjectID:        "reprieve-test",
	PathNumericProjectID: "123456789012",
	PathMachineType:      "projects/123456789012/machineTypes/" + OrdinaryMachineType,
}

// OrdinaryMachineType is a fresh server's machine type, a VM without GPUs; GPUMachineType is
// the one ScheduleGPUMaintenance sets.
const (
	OrdinaryMachineType = "n2-standard-4"
	GPUMachineType      = "a2-highgpu-1g"
)

// DefaultWait bounds a hanging GET that gives no timeout_sec.
const DefaultWait = 5 * time.Minute

// Request is one answered request, as the request log keeps it.
type Request struct {
	Time time.Time // when it arrived
	// Path is relative to Prefix when under it, else the full URL path.
	Path   string
	Query  url.Values
	Flavor string // the Metadata-Flavor header
	Status int    // 0 when the client went away before an answer
	// Waited is how long the answer took: for a hanging GET, how long it was held.
	Waited time.Duration
}

type entry struct {
	value   string
	present bool
	version uint64 // bumped by every Set and Delete, so the ETag changes
}

func (e *entry) etag(path string) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%d\x00%s", path, e.version, e.value)
	return fmt.Sprintf("%016x", h.Sum64())
}

type failure struct {
	status int
	n      int
}

// Server is a fake GCE metadata server. Its zero value is not usable: call New.
type Server struct {
	mu      sync.Mutex
	entries map[string]*entry
	// gpusAttached marks a VM with GPUs whatever its machine type (SetGPUsAttached).
	gpusAttached bool
	failures     map[string]*failure
	// wake is closed and replaced by every change, waking every hanging GET to re-check.
	wake       chan struct{}
	waiting    map[string]int
	hits       map[string]int
	log        []Request
	ignoreWait bool
	offline    bool
	conns      map[net.Conn]struct{}
	// stalled makes every new request hang unanswered; stallGen is bumped by StallHeld, and
	// a hanging GET that sees it move stops answering.
	stalled  bool
	stallGen uint64
	timers   []*time.Timer

	srv       *http.Server
	addr      string
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a server holding the default values; Start serves it, or use it as an
// http.Handler (DropConnections and SetOffline then need Start).
func New() *Server {
	s := &Server{
		entries:  map[string]*entry{},
		failures: map[string]*failure{},
		wake:     make(chan struct{}),
		waiting:  map[string]int{},
		hits:     map[string]int{},
		conns:    map[net.Conn]struct{}{},
		done:     make(chan struct{}),
	}
	for p, v := range defaults {
		s.entries[p] = &entry{value: v, present: true, version: 1}
	}
	return s
}

// Start serves on addr ("127.0.0.1:0" when empty), which must be a loopback address, and
// returns the base URL ("http://127.0.0.1:port").
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("gcpmeta: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("gcpmeta: address %q is not loopback", addr)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return "", errors.New("gcpmeta: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("gcpmeta: %w", err)
	}
	s.addr = ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ConnState:         s.trackConn,
	}
	go s.srv.Serve(&listener{Listener: ln, s: s})
	return "http://" + s.addr, nil
}

// Addr returns host:port once started, the form GCE_METADATA_HOST takes.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Close stops the server and ends every hanging GET.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	s.mu.Lock()
	srv := s.srv
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// Set stores value at path (relative to Prefix), bumps its ETag even when the value is the
// same, and wakes the hanging GETs.
func (s *Server) Set(path, value string) {
	s.change(path, func(e *entry) { e.value, e.present = value, true })
}

// Delete makes path absent (404), waking the hanging GETs.
func (s *Server) Delete(path string) {
	s.change(path, func(e *entry) { e.value, e.present = "", false })
}

func (s *Server) change(path string, f func(*entry)) {
	path = normalize(path)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[path]
	if e == nil {
		e = &entry{}
		s.entries[path] = e
	}
	f(e)
	e.version++
	close(s.wake)
	s.wake = make(chan struct{})
}

// Get returns the value at path and whether it is present.
func (s *Server) Get(path string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[normalize(path)]
	if e == nil || !e.present {
		return "", false
	}
	return e.value, true
}

// SetError makes the next n requests for path fail with status (0 clears). Hanging GETs
// already waiting are not affected.
func (s *Server) SetError(path string, status, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[normalize(path)] = &failure{status: status, n: n}
}

// SetIgnoreWaitForChange makes hanging GETs answer at once with the current value, as the
// emulators that ignore last_etag do; clients that do not deduplicate then spin.
func (s *Server) SetIgnoreWaitForChange(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignoreWait = on
}

// DropConnections closes every open connection, idle or holding a hanging GET, as a
// metadata server restarting during maintenance does.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked()
}

func (s *Server) dropLocked() {
	for c := range s.conns {
		resetConn(c)
	}
}

// SetOffline drops every connection and, while on, resets each new one as soon as it is
// accepted: the server is unreachable but its values can still be changed.
func (s *Server) SetOffline(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offline = on
	if on {
		s.dropLocked()
	}
}

// SetStall makes every new request, whatever its path, hang: the connection stays open,
// nothing is answered and nothing is reset, until the client gives up or the server closes.
// Requests already held are not affected (see StallHeld). Off serves new requests again.
func (s *Server) SetStall(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = on
}

// StallHeld makes every hanging GET held now stall: it will never be answered, not even
// when its value changes or its timeout_sec passes, and its connection is not reset. New
// requests are served as usual. This is the silent stall of issue 13: a client that waits
// as long as its own timeout is blind for that long.
func (s *Server) StallHeld() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stallGen++
	close(s.wake)
	s.wake = make(chan struct{})
}

// UpcomingMaintenance is the content of instance/upcoming-maintenance/.
type UpcomingMaintenance struct {
	Status            string // maintenance-status: PENDING or ONGOING
	Type              string // SCHEDULED or UNSCHEDULED
	WindowStart       time.Time
	WindowEnd         time.Time
	LatestWindowStart time.Time // zero leaves the key out
	CanReschedule     bool
}

// SetUpcomingMaintenance publishes u under instance/upcoming-maintenance/.
func (s *Server) SetUpcomingMaintenance(u UpcomingMaintenance) {
	set := func(k, v string) { s.Set(PathUpcomingMaintenance+k, v) }
	set("maintenance-status", u.Status)
	set("type", u.Type)
	set("window-start-time", u.WindowStart.UTC().Format(time.RFC3339))
	set("window-end-time", u.WindowEnd.UTC().Format(time.RFC3339))
	if u.LatestWindowStart.IsZero() {
		s.Delete(PathUpcomingMaintenance + "latest-window-start-time")
	} else {
		set("latest-window-start-time", u.LatestWindowStart.UTC().Format(time.RFC3339))
	}
	set("can-reschedule", strconv.FormatBool(u.CanReschedule))
}

// ClearUpcomingMaintenance removes instance/upcoming-maintenance/ (404), as GCE does once
// the maintenance is done or was cancelled.
func (s *Server) ClearUpcomingMaintenance() {
	for _, k := range []string{"maintenance-status", "type", "window-start-time", "window-end-time", "latest-window-start-time", "can-reschedule"} {
		s.Delete(PathUpcomingMaintenance + k)
	}
}

// GPUMaintenanceNotice is how long before a GPU VM is stopped for host maintenance GCE sets
// maintenance-event to TERMINATE_ON_HOST_MAINTENANCE, and VMMaintenanceNotice the same for any
// other VM (GCE "Handling GPU host maintenance events").
const (
	GPUMaintenanceNotice = time.Hour
	VMMaintenanceNotice  = 60 * time.Second
)

// PreemptionGrace is the time from a preemption's soft-off to the power-off of a Spot VM (GCE
// "Preemption process").
const PreemptionGrace = 30 * time.Second

// SetGPUsAttached says the VM has GPUs attached whatever its machine type (an N1 VM with
// --accelerator): GCE gives it a GPU VM's notice, though its metadata does not say so.
func (s *Server) SetGPUsAttached(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpusAttached = on
}

// SetMachineType sets instance/machine-type to projects/NUMBER/machineTypes/name.
func (s *Server) SetMachineType(name string) {
	s.Set(PathMachineType, "projects/123456789012/machineTypes/"+name)
}

// ScheduleGPUMaintenance emulates a GPU VM (machine type GPUMachineType, on-host-maintenance
// TERMINATE) with host maintenance whose window starts at windowStart and lasts four hours:
// upcoming-maintenance says so at once (PENDING, SCHEDULED), maintenance-event turns to
// TERMINATE_ON_HOST_MAINTENANCE GPUMaintenanceNotice before windowStart (at once when that is
// already past), and the status turns ONGOING at windowStart.
func (s *Server) ScheduleGPUMaintenance(windowStart time.Time) {
	s.SetMachineType(GPUMachineType)
	s.Set(PathOnHostMaintenance, "TERMINATE")
	s.SetUpcomingMaintenance(UpcomingMaintenance{Status: "PENDING", Type: "SCHEDULED", WindowStart: windowStart, WindowEnd: windowStart.Add(4 * time.Hour)})
	s.at(windowStart.Add(-GPUMaintenanceNotice), func() { s.Set(PathMaintenanceEvent, "TERMINATE_ON_HOST_MAINTENANCE") })
	s.at(windowStart, func() { s.Set(PathUpcomingMaintenance+"maintenance-status", "ONGOING") })
}

// StopForMaintenance emulates host maintenance that stops the VM, without upcoming-maintenance
// (the key is populated only for some machine families): maintenance-event turns
// TERMINATE_ON_HOST_MAINTENANCE now, and the VM stops notice later, when stopped runs (it may
// be nil). notice is the VM's: GPUMaintenanceNotice when its machine family comes with GPUs,
// else VMMaintenanceNotice; a test may pass scaled figures (gpu, vm) to shrink both alike.
// The stop is returned.
func (s *Server) StopForMaintenance(gpu, vm time.Duration, stopped func()) time.Time {
	if gpu <= 0 {
		gpu = GPUMaintenanceNotice
	}
	if vm <= 0 {
		vm = VMMaintenanceNotice
	}
	notice := vm
	s.mu.Lock()
	attached := s.gpusAttached
	s.mu.Unlock()
	if mt, _ := s.Get(PathMachineType); attached || isGPUMachineType(mt) {
		notice = gpu
	}
	s.Set(PathOnHostMaintenance, "TERMINATE")
	now := time.Now()
	s.Set(PathMaintenanceEvent, "TERMINATE_ON_HOST_MAINTENANCE")
	stop := now.Add(notice)
	if stopped != nil {
		s.at(stop, stopped)
	}
	return stop
}

// isGPUMachineType reports whether the machine type's family comes with GPUs attached (GCE
// "Accelerator-optimized machine family": A2, A3, A4, A4X, G2, G4). An N1 VM with GPUs
// attached is not told apart here: the VM's GPUs are not in its metadata.
func isGPUMachineType(mt string) bool {
	name := mt[strings.LastIndex(mt, "/")+1:]
	family, _, _ := strings.Cut(name, "-")
	switch family {
	case "a2", "a3", "a4", "a4x", "g2", "g4":
		return true
	}
	return false
}

// Preempt emulates the preemption of a Spot VM whose preemptionNoticeDuration is notice (zero:
// none): preempted turns TRUE now, the soft-off comes notice later (softOff runs then) and the
// power-off PreemptionGrace after that (powerOff runs then); either func may be nil. It
// returns the soft-off and the power-off.
func (s *Server) Preempt(notice time.Duration, softOff, powerOff func()) (softOffAt, powerOffAt time.Time) {
	now := time.Now()
	s.Set(PathPreempted, "TRUE")
	softOffAt, powerOffAt = now.Add(notice), now.Add(notice+PreemptionGrace)
	if softOff != nil {
		s.at(softOffAt, softOff)
	}
	if powerOff != nil {
		s.at(powerOffAt, powerOff)
	}
	return softOffAt, powerOffAt
}

// at runs f at t (at once when t is past), on a timer Close stops.
func (s *Server) at(t time.Time, f func()) {
	d := time.Until(t)
	if d <= 0 {
		f()
		return
	}
	s.mu.Lock()
	s.timers = append(s.timers, time.AfterFunc(d, f))
	s.mu.Unlock()
}

// Waiting returns how many hanging GETs on path are held now.
func (s *Server) Waiting(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting[normalize(path)]
}

// Count returns how many requests for path have arrived, answered or not.
func (s *Server) Count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[normalize(path)]
}

// Requests returns the log of answered requests, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// ServeHTTP implements the metadata protocol.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Request{Time: time.Now(), Path: r.URL.Path, Query: r.URL.Query(), Flavor: r.Header.Get("Metadata-Flavor")}
	if p, ok := strings.CutPrefix(r.URL.Path, Prefix); ok {
		rec.Path = p
	}
	s.mu.Lock()
	s.hits[rec.Path]++
	s.mu.Unlock()
	rec.Status = s.serve(w, r, rec.Path, rec.Query)
	rec.Waited = time.Since(rec.Time)
	s.mu.Lock()
	s.log = append(s.log, rec)
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, path string, q url.Values) int {
	h := w.Header()
	h.Set("Metadata-Flavor", "Google")
	h.Set("Server", "Metadata Server for VM")
	h.Set("X-Frame-Options", "SAMEORIGIN")
	// GCE refuses requests without the header, and requests that went through a proxy, so that
	// a page tricked into fetching a metadata URL gets nothing.
	if r.Header.Get("Metadata-Flavor") != "Google" || r.Header.Get("X-Forwarded-For") != "" {
		return fail(w, http.StatusForbidden, "Missing Metadata-Flavor:Google header.")
	}
	if r.Method != http.MethodGet {
		return fail(w, http.StatusMethodNotAllowed, "Method not allowed.")
	}
	if !strings.HasPrefix(r.URL.Path, Prefix) {
		return fail(w, http.StatusNotFound, "Not found.")
	}
	wait, timeout, err := waitParams(q)
	if err != nil {
		return fail(w, http.StatusBadRequest, err.Error())
	}

	s.mu.Lock()
	if s.stalled {
		s.waiting[path]++
		s.mu.Unlock()
		stall(r, s.done)
		s.mu.Lock()
		s.waiting[path]--
		s.mu.Unlock()
		return 0
	}
	if strings.HasSuffix(path, "/") {
		return s.serveDirectory(w, path, q) // unlocks s.mu
	}
	if f := s.failures[path]; f != nil && f.n > 0 {
		f.n--
		s.mu.Unlock()
		return fail(w, f.status, http.StatusText(f.status))
	}
	e := s.entries[path]
	if e == nil {
		e = &entry{}
		s.entries[path] = e
	}
	if wait && !s.ignoreWait {
		// With last_etag, answer at once when the value has moved on from it; without, wait for
		// the next change, as GCE does.
		last, hasLast := q["last_etag"]
		if !hasLast || (len(last) > 0 && last[0] == e.etag(path)) {
			if !s.hold(r, path, e, timeout) {
				s.mu.Unlock()
				return 0
			}
		}
	}
	value, present, etag := e.value, e.present, e.etag(path)
	s.mu.Unlock()

	if !present {
		return fail(w, http.StatusNotFound, "Not found.")
	}
	h.Set("Content-Type", "application/text")
	h.Set("ETag", etag)
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, value)
	return http.StatusOK
}

// hold waits, with s.mu held on entry and on return, until e changes or timeout passes. It
// reports false when the client went away or the server closed.
func (s *Server) hold(r *http.Request, path string, e *entry, timeout time.Duration) bool {
	s.waiting[path]++
	defer func() { s.waiting[path]-- }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	start, gen := e.version, s.stallGen
	for {
		// The stall is checked first: StallHeld followed at once by a Set must not answer.
		if s.stallGen != gen {
			s.mu.Unlock()
			stall(r, s.done)
			s.mu.Lock()
			return false
		}
		if e.version != start {
			return true
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-timer.C:
			// Timed out: the unchanged value, with 200, unless the request stalled meanwhile.
			s.mu.Lock()
			if s.stallGen != gen {
				s.mu.Unlock()
				stall(r, s.done)
				s.mu.Lock()
				return false
			}
			return true
		case <-r.Context().Done():
			s.mu.Lock()
			return false
		case <-s.done:
			s.mu.Lock()
			return false
		}
		s.mu.Lock()
	}
}

// stall holds a request without answering until the client goes away or the server closes.
func stall(r *http.Request, done <-chan struct{}) {
	select {
	case <-r.Context().Done():
	case <-done:
	}
}

// serveDirectory answers a directory read with ?recursive=true: the present entries under
// path as one JSON object with camelCase keys, as GCE does; 404 when none is present. It is
// entered with s.mu held and releases it. Hanging GETs on a directory are answered at once.
func (s *Server) serveDirectory(w http.ResponseWriter, path string, q url.Values) int {
	if q.Get("recursive") != "true" {
		s.mu.Unlock()
		// GCE lists the entries' names; nothing reprieve reads.
		return fail(w, http.StatusBadRequest, "This fake serves directories only with recursive=true.")
	}
	if f := s.failures[path]; f != nil && f.n > 0 {
		f.n--
		s.mu.Unlock()
		return fail(w, f.status, http.StatusText(f.status))
	}
	obj := map[string]string{}
	h := fnv.New64a()
	for p, e := range s.entries {
		name, ok := strings.CutPrefix(p, path)
		if !ok || !e.present || strings.Contains(name, "/") {
			continue
		}
		obj[camel(name)] = e.value
		fmt.Fprintf(h, "%s\x00%d\x00", p, e.version)
	}
	s.mu.Unlock()
	if len(obj) == 0 {
		return fail(w, http.StatusNotFound, "Not found.")
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return fail(w, http.StatusInternalServerError, err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", fmt.Sprintf("%016x", h.Sum64()))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	return http.StatusOK
}

// camel turns a hyphenated key into the camelCase a recursive answer uses.
func camel(k string) string {
	parts := strings.Split(k, "-")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

func waitParams(q url.Values) (wait bool, timeout time.Duration, err error) {
	timeout = DefaultWait
	if v := q.Get("wait_for_change"); v != "" {
		if wait, err = strconv.ParseBool(v); err != nil {
			return false, 0, fmt.Errorf("invalid wait_for_change %q", v)
		}
	}
	if v := q.Get("timeout_sec"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return false, 0, fmt.Errorf("invalid timeout_sec %q", v)
		}
		timeout = time.Duration(n) * time.Second
	}
	return wait, timeout, nil
}

func fail(w http.ResponseWriter, status int, msg string) int {
	w.Header().Set("Content-Type", "text/html; charset=UTF-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body><p><b>%d.</b> %s</p></body></html>\n", status, msg)
	return status
}

func normalize(path string) string {
	path = strings.TrimPrefix(path, Prefix)
	return strings.TrimPrefix(path, "/")
}

func (s *Server) trackConn(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// resetConn closes c with a TCP reset rather than a FIN, as a crashed server's peer sees.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// listener resets new connections while the server is offline.
type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.s.mu.Lock()
		offline := l.s.offline
		l.s.mu.Unlock()
		if !offline {
			return c, nil
		}
		resetConn(c)
	}
}
