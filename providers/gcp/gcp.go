// Package gcp reads interruption notices from the GCE metadata server: preemption of Spot and
// preemptible VMs (instance/preempted), host maintenance (instance/maintenance-event) and
// scheduled host maintenance (instance/upcoming-maintenance). It polls, or follows the first two
// with hanging GETs so that a change is seen within a round trip, and the third with a poll.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/compute/metadata"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/providers"
)

// Name is the provider's flag value.
const Name = "gcp"

// The metadata paths reprieve reads, relative to /computeMetadata/v1/.
const (
	PathPreempted         = "instance/preempted"
	PathMaintenanceEvent  = "instance/maintenance-event"
	PathPreemptible       = "instance/scheduling/preemptible"
	PathProvisioningModel = "instance/scheduling/provisioning-model"
	PathOnHostMaintenance = "instance/scheduling/on-host-maintenance"
	// PathMachineType is projects/NUMBER/machineTypes/NAME (GCE "Predefined metadata keys").
	PathMachineType = "instance/machine-type"
	// PathUpcomingMaintenance is a directory, read whole with ?recursive=true; 404 when no
	// maintenance is scheduled.
	PathUpcomingMaintenance = "instance/upcoming-maintenance/"
)

// noticePaths are the values that carry notices, in a fixed order so results are deterministic.
var noticePaths = []string{PathPreempted, PathMaintenanceEvent}

// answerSources are the sources Answered reports: every path a notice can come from.
var answerSources = []string{PathPreempted, PathMaintenanceEvent, PathUpcomingMaintenance}

const (
	// readTimeout bounds a plain read, including the library's own retries of 5xx answers
	// and refused or reset connections (5 attempts, at most about 3 s of backoff).
	readTimeout = 10 * time.Second
	// waitSeconds is the hanging GET's server-side bound and waitTimeout its client-side one.
	// Google's guest agent uses 60 s and 70 s; a metadata server that stalls (the connection
	// stays open, nothing comes back, no reset) would then hide a preemption, which leaves
	// 30 s, for up to 70 s. With 10 s re-issued at once a stall is noticed within 15 s, a
	// change is still seen within a round trip, and the cost is one request per value every
	// 10 s (docs/benchmarks.md).
	waitSeconds = 10
	waitTimeout = 15 * time.Second
)

// ErrNoAnswer marks a request that the metadata server did not answer within its bound: a
// stall (the connection stays open, nothing comes back, no reset) or an overloaded server.
var ErrNoAnswer = errors.New("no answer")

// errNotDefined is a 404 on a value GCE always serves: a wrong endpoint rather than "no notice".
var errNotDefined = errors.New("not defined (404)")

// Options configures the provider.
type Options struct {
	// Endpoint is the metadata server as host:port or http://host:port. Empty means what the
	// library uses: GCE_METADATA_HOST, else 169.254.169.254.
	Endpoint string
	// HTTPClient carries the requests (main passes one instrumented with RequestMetrics). It is
	// copied: its Timeout is dropped, because hanging GETs last a minute and each request
	// gets its own deadline instead. Nil means a client on DefaultTransport().
	HTTPClient *http.Client
	// Clock stamps notices with when they were first seen; nil is the real clock.
	Clock clock.PassiveClock
	// Timers paces Watch's pauses (backoff after a failure, the fallback for a server that
	// answers every hanging GET at once, the upcoming-maintenance poll) and bounds each
	// request (waitTimeout, readTimeout); nil is the real clock.
	Timers clock.Clock
	// MaintenanceNotice is the deadline of TERMINATE_ON_HOST_MAINTENANCE, counted from when
	// reprieve first saw the value, when upcoming-maintenance gives no window-start-time. Zero
	// means decide from the VM: GPUMaintenanceNotice for a GPU VM (its machine family, or the
	// node's accelerators through NodeAccelerator), VMMaintenanceNotice for any other, and for
	// one that cannot be told.
	MaintenanceNotice time.Duration
	// GPUMaintenanceNotice and VMMaintenanceNotice replace GCE's figures (one hour, 60 s) when
	// non-zero; tests shrink them.
	GPUMaintenanceNotice, VMMaintenanceNotice time.Duration
	// PreemptionNotice is the VM's extended preemption notice (scheduling.preemptionNoticeDuration,
	// beta): preempted=TRUE comes that long before the soft-off, and the power-off 30 s after
	// it. Zero is GCE's default: no wait before the soft-off. The metadata server does not
	// serve the value ("Predefined metadata keys" lists no such key under scheduling/), so it
	// comes from a flag.
	PreemptionNotice time.Duration
	// NodeAccelerator, when not nil, says whether the node shows an accelerator (a device
	// plugin's resource in status.capacity, the cloud.google.com/gke-accelerator label), with
	// what it saw; known is false while the node has not been read. The provider asks it
	// whenever it computes a maintenance deadline, so the answer may come after New; it must
	// return at once (it is called with the provider's lock held).
	NodeAccelerator func() (gpu bool, why string, known bool)
}

// maxNotice bounds the notice options: GCE's longest documented notice is a GPU VM's hour; a
// larger value is a typo (2h for 2m) that would keep every pod until it is too late.
const maxNotice = 24 * time.Hour

// Provider reads the GCE metadata server. Poll is for one poller at a time; Watch replaces it.
type Provider struct {
	client *metadata.Client
	clock  clock.PassiveClock
	timers clock.Clock

	mu sync.Mutex
	// st holds the last good value of each source, so a failing source neither invents nor
	// withdraws a notice.
	st state
	// schedulingKnown is set once the scheduling values were read; they do not change while
	// the VM runs.
	schedulingKnown bool
	// unknownLogged remembers the unknown maintenance-event values already logged.
	unknownLogged map[string]bool
	// answered holds the notice sources that have given a good answer since New: a valid
	// value, or for upcoming-maintenance a window that decoded or a 404 (none scheduled).
	answered map[string]bool
	// lastAnswer is when each of them last gave a good answer (a hanging GET that returned the
	// same value counts: the watch publishes only changes, readiness needs every answer).
	lastAnswer map[string]time.Time
	// inflight counts the requests under way.
	inflight atomic.Int64
}

// New returns a provider for the metadata server at opts.Endpoint.
func New(opts Options) (*Provider, error) {
	host, err := endpointHost(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Timers == nil {
		opts.Timers = clock.RealClock{}
	}
	for _, o := range []struct {
		name string
		d    time.Duration
	}{{"maintenance notice", opts.MaintenanceNotice}, {"GPU maintenance notice", opts.GPUMaintenanceNotice},
		{"VM maintenance notice", opts.VMMaintenanceNotice}, {"preemption notice", opts.PreemptionNotice}} {
		if o.d < 0 || o.d > maxNotice {
			return nil, fmt.Errorf("gcp provider: %s %s: must be between 0 and %s", o.name, o.d, maxNotice)
		}
	}
	var hc http.Client
	if opts.HTTPClient != nil {
		hc = *opts.HTTPClient
	}
	// google-cloud-go#11035: a client-wide timeout (the library's default is 5 s) cuts every
	// hanging GET short. Each request gets a deadline from its context instead.
	hc.Timeout = 0
	next := hc.Transport
	if next == nil {
		next = DefaultTransport()
	}
	hc.Transport = &transport{next: next, host: host}
	return &Provider{
		client: metadata.NewWithOptions(&metadata.Options{Client: &hc}),
		clock:  opts.Clock,
		timers: opts.Timers,
		// Until the scheduling values are read, assume a Spot VM that stops on host
		// maintenance: acting early costs less than being powered off with pods running.
		st: state{spot: true, win: windows{
			maintenance: opts.MaintenanceNotice, gpu: opts.GPUMaintenanceNotice, vm: opts.VMMaintenanceNotice,
			preemption: opts.PreemptionNotice, preemptionSource: "--gcp-preemption-notice", node: opts.NodeAccelerator,
		}},
		unknownLogged: map[string]bool{},
		answered:      map[string]bool{},
		lastAnswer:    map[string]time.Time{},
	}, nil
}

// DefaultTransport returns a transport fit for the metadata server: no proxy (HTTP_PROXY must
// not capture link-local requests) and a short dial timeout, as the library's own.
func DefaultTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // hanging GETs: bounded by each request's context
	}
}

// endpointHost turns host:port or http://host:port into the host the transport sends to.
func endpointHost(endpoint string) (string, error) {
	if endpoint == "" {
		return "", nil
	}
	s := endpoint
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("gcp provider: endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("gcp provider: endpoint %q: want host:port or http://host:port", endpoint)
	}
	return u.Host, nil
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Poll reads the notice sources (and, until they are known, the scheduling values)
// concurrently and returns every notice in force. A source that fails keeps its last good
// value; the error names each failed source.
func (p *Provider) Poll(ctx context.Context) ([]providers.Notice, error) {
	errs := make([]error, len(noticePaths)+2)
	var wg sync.WaitGroup
	for i, path := range noticePaths {
		wg.Go(func() { _, _, errs[i] = p.refresh(ctx, path, "") })
	}
	wg.Go(func() { _, errs[len(noticePaths)] = p.refreshUpcoming(ctx) })
	wg.Go(func() { errs[len(noticePaths)+1] = p.readScheduling(ctx) })
	wg.Wait()
	return p.notices(), errors.Join(errs...)
}

// refreshUpcoming reads instance/upcoming-maintenance and records it: 404 means none, which
// withdraws a window seen before; a window that moved is a new one. A failed read or a
// payload that does not decode keeps the last good answer.
func (p *Provider) refreshUpcoming(ctx context.Context) (changed bool, err error) {
	body, _, found, err := p.get(ctx, PathUpcomingMaintenance, "")
	if err != nil {
		return false, err
	}
	var u *Upcoming
	if found {
		if u, err = ParseUpcoming([]byte(body)); err != nil {
			return false, &SourceError{Path: PathUpcomingMaintenance, Err: err}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answered[PathUpcomingMaintenance] = true
	p.lastAnswer[PathUpcomingMaintenance] = p.clock.Now()
	if p.st.upcoming.same(u) {
		return false, nil
	}
	if u != nil {
		u.since = p.clock.Now()
		if prev := p.st.upcoming; prev != nil && prev.Type == u.Type && prev.WindowStart.Equal(u.WindowStart) {
			u.since = prev.since // the same window with another status keeps its first-seen time
		}
	}
	p.st.upcoming = u
	return true, nil
}

// Answered implements providers.SourceReporter, in Poll and Watch alike: instance/preempted
// and instance/maintenance-event once a valid value was read (a 404 on them is a wrong
// endpoint, not "no notice", so it is no answer), instance/upcoming-maintenance/ once a
// window decoded or a 404 said none is scheduled. The scheduling values raise no notice and
// are not reported.
func (p *Provider) Answered() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]bool, len(answerSources))
	for _, src := range answerSources {
		out[src] = p.answered[src]
	}
	return out
}

// LastAnswers implements providers.AnswerTimes, for the sources of Answered: when each last
// gave a good answer (zero: not since New), in Poll and Watch alike.
func (p *Provider) LastAnswers() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(answerSources))
	for _, src := range answerSources {
		out[src] = p.lastAnswer[src]
	}
	return out
}

// notices returns the notices in force according to the last good values.
func (p *Provider) notices() []providers.Notice {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.notices()
}

// refresh reads path, waiting for a change from etag when it is not empty, and records the
// value. newTag is the answer's ETag, also when its value is unknown (err set): the caller can
// wait for the next value instead of asking again at once. It is empty when nothing was read.
func (p *Provider) refresh(ctx context.Context, path, etag string) (newTag string, changed bool, err error) {
	value, newTag, found, err := p.get(ctx, path, etag)
	if err != nil {
		return "", false, err
	}
	if !found {
		return "", false, &SourceError{Path: path, Err: errNotDefined}
	}
	changed, err = p.observe(ctx, path, value)
	if err != nil {
		return newTag, false, &SourceError{Path: path, Err: err}
	}
	return newTag, changed, nil
}

// observe validates a value of path and records it, stamping when a new one was first seen.
// A malformed value is an error and leaves the last good one in place. An unknown
// maintenance-event value is not an error (GCE adds values): it is logged once and recorded.
func (p *Provider) observe(ctx context.Context, path, raw string) (changed bool, err error) {
	var v string
	known := true
	switch path {
	case PathPreempted:
		v, err = parsePreempted(raw)
	case PathMaintenanceEvent:
		v, known, err = parseMaintenanceEvent(raw)
	default:
		return false, fmt.Errorf("no notices at %s", path)
	}
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answered[path] = true
	p.lastAnswer[path] = p.clock.Now()
	if !known && !p.unknownLogged[v] {
		p.unknownLogged[v] = true
		klog.FromContext(ctx).Info("Unknown instance/maintenance-event value: treating it as maintenance without a deadline (new pods kept off the node, nothing evicted)",
			"value", v)
	}
	cur, since := &p.st.preempted, &p.st.preemptedSince
	if path == PathMaintenanceEvent {
		cur, since = &p.st.maintenance, &p.st.maintenanceSince
	}
	if *cur == v {
		// The same value read again keeps its first-seen time, so deadlines stay put.
		return false, nil
	}
	*cur, *since = v, p.clock.Now()
	return true, nil
}

// readScheduling learns whether the VM is Spot or preemptible, once per provider: 404 on
// either value means absent. Until both were read, the provider assumes Spot.
func (p *Provider) readScheduling(ctx context.Context) error {
	p.mu.Lock()
	known := p.schedulingKnown
	p.mu.Unlock()
	if known {
		return nil
	}
	var (
		pv, mv, hv, tv                 string
		pFound, mFound, hFound, tFound bool
		pErr, mErr, hErr, tErr         error
		wg                             sync.WaitGroup
	)
	// provisioning-model (SPOT, STANDARD) is the current key; preemptible is kept as the
	// fallback for preemptible VMs, which predate it.
	wg.Go(func() { pv, _, pFound, pErr = p.get(ctx, PathPreemptible, "") })
	wg.Go(func() { mv, _, mFound, mErr = p.get(ctx, PathProvisioningModel, "") })
	wg.Go(func() { hv, _, hFound, hErr = p.get(ctx, PathOnHostMaintenance, "") })
	// The machine type tells a GPU VM's hour of maintenance notice from an ordinary VM's
	// minute; 404 (a metadata server that serves a subset, such as GKE's) leaves it unknown.
	wg.Go(func() { tv, _, tFound, tErr = p.get(ctx, PathMachineType, "") })
	wg.Wait()
	if err := errors.Join(pErr, mErr, hErr, tErr); err != nil {
		return err
	}
	preemptible, err := parsePreemptible(pv, pFound)
	if err != nil {
		return &SourceError{Path: PathPreemptible, Err: err}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.spot = preemptible || parseProvisioningModel(mv, mFound)
	p.st.migrates = parseOnHostMaintenance(hv, hFound)
	if tFound {
		p.st.machineType = strings.TrimSpace(tv)
	}
	p.schedulingKnown = true
	logger := klog.FromContext(ctx)
	for _, w := range p.st.windows() {
		logger.Info("GCP notice window", "notice", w.Name, "window", w.Duration, "source", w.Source)
	}
	return nil
}

// Windows implements providers.WindowReporter: the maintenance notice that applies to this VM
// (flag, machine family, node) and the time from preempted=TRUE to the power-off.
func (p *Provider) Windows() []providers.Window {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.windows()
}

func (s state) windows() []providers.Window {
	md, msrc := s.win.maintenanceWindow(s.machineType)
	pd, psrc := s.win.preemptionWindow()
	return []providers.Window{
		{Name: PathMaintenanceEvent + " " + MaintenanceTerminate + " without an upcoming-maintenance window", Duration: md, Source: msrc},
		{Name: PathPreempted + " TRUE to power-off", Duration: pd, Source: psrc},
	}
}

// get reads one metadata path; with etag, as a hanging GET that returns when the value's ETag
// differs from it or after waitSeconds. found is false for a 404.
func (p *Provider) get(ctx context.Context, path, etag string) (value, newTag string, found bool, err error) {
	suffix, timeout := path, readTimeout
	if strings.HasSuffix(path, "/") {
		suffix += "?recursive=true" // a directory, read whole as JSON
	}
	if etag != "" {
		suffix = fmt.Sprintf("%s?wait_for_change=true&last_etag=%s&timeout_sec=%d", path, url.QueryEscape(etag), waitSeconds)
		timeout = waitTimeout
	}
	// Counted before the bound's timer exists and after it is stopped, so that a test on a
	// fake clock can tell a pause's timer from a request's.
	p.inflight.Add(1)
	defer p.inflight.Add(-1)
	rctx, cancel := p.withTimeout(ctx, timeout)
	defer cancel()
	sink := new(etagSink)
	value, err = p.client.GetWithContext(context.WithValue(rctx, etagKey{}, sink), suffix)
	var nd metadata.NotDefinedError
	switch {
	case errors.As(err, &nd):
		return "", "", false, nil
	case err != nil && rctx.Err() != nil && ctx.Err() == nil:
		// Our own bound, not the caller's: the server stalled (or is too slow to matter).
		return "", "", false, &SourceError{Path: path, Err: fmt.Errorf("%w within %s; the request was abandoned", ErrNoAnswer, timeout)}
	case err != nil:
		return "", "", false, &SourceError{Path: path, Err: err}
	}
	return value, sink.get(), true, nil
}

// withTimeout is providers.WithTimeout on the provider's timers.
func (p *Provider) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return providers.WithTimeout(ctx, p.timers, d)
}

// SourceError says which metadata path failed, so logs and metrics can name it.
type SourceError struct {
	Path string
	Err  error
}

func (e *SourceError) Error() string { return fmt.Sprintf("reading %s: %v", e.Path, e.Err) }
func (e *SourceError) Unwrap() error { return e.Err }

// StatusCode returns the HTTP status of a failed request, or 0 when none was received.
func (e *SourceError) StatusCode() int {
	var me *metadata.Error
	if errors.As(e.Err, &me) {
		return me.Code
	}
	return 0
}
