// Package azure reads interruption notices from Azure Scheduled Events, part of the instance
// metadata service (IMDS), and approves events early once the node is drained.
//
// Which events are this machine's: Scheduled Events reaches every VM of an availability set or
// of a scale set placement group, and Resources names the affected ones. The name to look for
// is the VM's resource name, which IMDS serves as compute.name:
//
//   - a Uniform scale set instance is "<vmss>_<instance id>" ("aks-nodepool1-38290525-vmss_3"),
//     the same name ResourceNameFromProviderID derives from an AKS node's spec.providerID
//     (".../virtualMachineScaleSets/<vmss>/virtualMachines/<instance id>");
//   - a Flexible scale set instance is a VM of its own, "<vmss>_<8 hex digits>", and its provider
//     ID has the standalone form ".../virtualMachines/<name>";
//   - a standalone VM is its name.
//
// The node name is not the resource name: on AKS it is the computer name (osProfile.computerName,
// the hostname), "<prefix><instance id in base 36, 6 digits>" ("aks-nodepool1-38290525-vmss000003"
// for instance 3), and it can be changed from inside the guest. Never match Resources against it.
package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/providers"
)

// Name is the provider's flag value.
const Name = "azure"

// SourceScheduledEvents is the one source of the provider, as Notice.Source and in Answered.
const SourceScheduledEvents = "scheduledevents"

// DefaultEndpoint is the IMDS address inside every Azure VM.
const DefaultEndpoint = "http://169.254.169.254"

// The IMDS paths and API versions reprieve uses. 2020-07-01 is the newest Scheduled Events
// version (it added DurationInSeconds); 2021-02-01 serves compute.name and vmScaleSetName.
const (
	ScheduledEventsPath = "/metadata/scheduledevents?api-version=2020-07-01"
	ComputePath         = "/metadata/instance/compute?api-version=2021-02-01"
)

const (
	// maxBody bounds what is read of an answer; a real document is a few kilobytes.
	maxBody = 1 << 20
	// defaultRequestTimeout bounds a request whose context has no deadline. The first request
	// for scheduled events can take up to two minutes while Azure enables the service.
	defaultRequestTimeout = 2*time.Minute + 10*time.Second
	// DefaultFirstCallTimeout bounds the first request for scheduled events of the process,
	// and the first after IMDS answered 404 or 503: "expect a delayed response in your first
	// call of up to two minutes" (Microsoft, "Azure Metadata Service: Scheduled Events for
	// Linux VMs"), plus a margin.
	DefaultFirstCallTimeout = defaultRequestTimeout
)

// Options configures the provider.
type Options struct {
	// Endpoint is the IMDS base URL; empty means DefaultEndpoint.
	Endpoint string
	// ResourceName is this machine's name in Resources. Empty means ask IMDS compute.name once.
	// ResourceNameFromProviderID derives it from the node's spec.providerID.
	ResourceName string
	// FreezeInterrupts makes a Freeze evict like a Reboot, with NotBefore as its deadline. By
	// default a Freeze is a soft notice: it only keeps new pods off the node.
	FreezeInterrupts bool
	// HTTPClient sends the requests (an instrumented one, from main). Nil means a client whose
	// transport comes from NewTransport. Azure requires that IMDS requests bypass proxies: give
	// a custom client a transport without Proxy too.
	HTTPClient *http.Client
	// Clock stamps first-seen times; nil means the real clock.
	Clock clock.PassiveClock
	// Timers bounds the first call (FirstCallTimeout); nil means the real clock.
	Timers clock.Clock
	// FirstCallTimeout bounds the first request for scheduled events, which Azure may hold for
	// up to two minutes while it enables the service, and the first after a 404 or 503. That
	// request runs on its own, not bounded by Poll's context: Poll returns at its context's
	// end with what is known, and a later Poll picks the answer up. Zero means
	// DefaultFirstCallTimeout.
	FirstCallTimeout time.Duration
}

// Provider polls Scheduled Events. Poll is meant for one poller; Approve may be called
// concurrently with it.
type Provider struct {
	eventsURL  string
	computeURL string
	client     *http.Client
	clock      clock.PassiveClock
	freeze     bool

	// pollMu serialises Polls, so that two polls cannot interleave their updates.
	pollMu sync.Mutex

	mu sync.Mutex
	// resource is this machine's name in Resources, once known.
	resource string
	// parsed is true once a document has been decoded; incarnation, last and lastErr are its
	// DocumentIncarnation and what Poll made of it, returned again while it does not change.
	parsed      bool
	incarnation int
	last        []providers.Notice
	lastErr     error
	// seen remembers each live event naming this machine, by EventId.
	seen map[string]*seenEvent
	// answered is set once a Scheduled Events document was read and decoded.
	answered bool

	timers           clock.Clock
	firstCallTimeout time.Duration
	// enabled is set by a 200 for scheduled events and cleared by a 404 or 503: until it is
	// set, requests for scheduled events are first calls (see Options.FirstCallTimeout).
	enabled bool
	// first is the outstanding first call; nil when none is.
	first *firstCall
}

// firstCall is a request for scheduled events that may take up to two minutes.
type firstCall struct {
	started time.Time
	done    chan struct{}
	body    []byte // set before done is closed
	err     error
	logged  bool // the wait was logged
}

// seenEvent is what reprieve remembers of an event between documents.
type seenEvent struct {
	first   time.Time // when reprieve first saw the event
	started time.Time // when it first saw it under way; zero while it is not
	others  []string  // the other resources the last document listed for it
}

// NewTransport returns a transport for IMDS: http.DefaultTransport's settings without a proxy.
// Microsoft requires IMDS clients to bypass proxies, even ones the environment configures.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	return t
}

// New returns a provider for the IMDS at opts.Endpoint. It makes no request.
func New(opts Options) (*Provider, error) {
	endpoint := strings.TrimRight(strings.TrimSpace(opts.Endpoint), "/")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, fmt.Errorf("azure provider: IMDS endpoint %q: want http://host[:port]", opts.Endpoint)
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: NewTransport()}
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Timers == nil {
		opts.Timers = clock.RealClock{}
	}
	if opts.FirstCallTimeout < 0 {
		return nil, fmt.Errorf("azure provider: first call timeout %s: must not be negative", opts.FirstCallTimeout)
	}
	if opts.FirstCallTimeout == 0 {
		opts.FirstCallTimeout = DefaultFirstCallTimeout
	}
	return &Provider{
		timers:           opts.Timers,
		firstCallTimeout: opts.FirstCallTimeout,
		eventsURL:        endpoint + ScheduledEventsPath,
		computeURL:       endpoint + ComputePath,
		client:           opts.HTTPClient,
		clock:            opts.Clock,
		freeze:           opts.FreezeInterrupts,
		resource:         strings.TrimSpace(opts.ResourceName),
		seen:             map[string]*seenEvent{},
	}, nil
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Poll reads the Scheduled Events document and returns a notice for every event that names this
// machine. A document whose DocumentIncarnation has not changed is not decoded again.
//
// When IMDS fails (transport error, timeout, a status other than 200, a body that is not a
// document), Poll returns the last good notices with the error. When the document holds events
// for this machine that cannot be used (an unknown EventType, a NotBefore that does not parse,
// no EventId), Poll returns the others, keeps the last good notice of such an event if it had
// one, and reports each problem in the error. Poll makes one request for events, plus one for
// compute.name until that succeeds; it never retries: the agent's poll loop does, with backoff.
func (p *Provider) Poll(ctx context.Context) ([]providers.Notice, error) {
	p.pollMu.Lock()
	defer p.pollMu.Unlock()

	resource, err := p.resourceName(ctx)
	if err != nil {
		return p.lastNotices(), err
	}
	body, pending, err := p.readEvents(ctx)
	if pending {
		// Not a failure: Azure is enabling the service, as documented. Readiness says so.
		return p.lastNotices(), nil
	}
	if err != nil {
		return p.lastNotices(), err
	}
	inc, _, err := decodeHeader(body)
	if err != nil {
		return p.lastNotices(), err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.parsed && inc == p.incarnation {
		return slices.Clone(p.last), p.lastErr
	}
	doc, err := ParseDocument(body)
	if err != nil {
		return slices.Clone(p.last), err
	}
	// A document, even one with events that cannot be used (apply keeps their last good
	// notices): an event it does not list is gone.
	p.answered = true
	notices, err := p.apply(doc, resource, p.clock.Now())
	p.parsed, p.incarnation, p.last, p.lastErr = true, inc, notices, err
	// A copy, so that a caller that sorts or edits what it got cannot change what a later poll
	// of the same incarnation, or a failed one, reports.
	return slices.Clone(notices), err
}

// readEvents reads the scheduled events document. Once the service answered, that is one
// request bounded by ctx. Before (the first call of the process, or the first after a 404 or
// 503), the request runs on its own bounded by FirstCallTimeout, because Azure may hold it
// for up to two minutes while it enables the service, and cutting it at every poll would never
// let it finish; readEvents then waits for it until ctx ends and reports pending when it has
// not answered by then.
func (p *Provider) readEvents(ctx context.Context) (body []byte, pending bool, err error) {
	p.mu.Lock()
	enabled, fc := p.enabled, p.first
	if !enabled && fc == nil {
		fc = &firstCall{started: p.timers.Now(), done: make(chan struct{})}
		p.first = fc
		// Detached from ctx (a poll's few seconds) but not from its values (the logger).
		rctx, cancel := p.withTimeout(context.WithoutCancel(ctx), p.firstCallTimeout)
		go func() {
			defer cancel()
			fc.body, fc.err = p.do(rctx, http.MethodGet, p.eventsURL, nil, "reading scheduled events (first call)")
			if fc.err != nil && rctx.Err() != nil {
				fc.err = fmt.Errorf("reading scheduled events (first call): no answer within %s: %w", p.firstCallTimeout, fc.err)
			}
			close(fc.done)
		}()
	}
	p.mu.Unlock()

	if enabled {
		body, err = p.do(ctx, http.MethodGet, p.eventsURL, nil, "reading scheduled events")
		p.noteStatus(err)
		return body, false, err
	}
	select {
	case <-fc.done:
	case <-ctx.Done():
		p.mu.Lock()
		if !fc.logged {
			fc.logged = true
			klog.FromContext(ctx).Info("Waiting for the first answer of Azure Scheduled Events: the first call enables the service and can take up to two minutes; not ready until it answers",
				"timeout", p.firstCallTimeout)
		}
		p.mu.Unlock()
		return nil, true, nil
	}
	p.mu.Lock()
	if p.first == fc {
		p.first = nil
	}
	p.mu.Unlock()
	p.noteStatus(fc.err)
	return fc.body, false, fc.err
}

// noteStatus records whether the service answered: a 200 enables it; a 404 or 503 means it
// is (being) enabled again, so the next request is a first call.
func (p *Provider) noteStatus(err error) {
	var se *StatusError
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.enabled = true
	case errors.As(err, &se) && (se.StatusCode == http.StatusNotFound || se.StatusCode == http.StatusServiceUnavailable):
		p.enabled = false
	}
}

// Ready implements providers.Readiness: nil once Scheduled Events answered, else why not.
func (p *Provider) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.enabled:
		return nil
	case p.first != nil:
		return fmt.Errorf("waiting %s for the first answer of Azure Scheduled Events (the first call enables the service and can take up to two minutes)",
			p.timers.Since(p.first.started).Round(time.Second))
	default:
		return errors.New("azure Scheduled Events has not answered yet")
	}
}

// Answered implements providers.SourceReporter with the provider's one source,
// SourceScheduledEvents: true once a Scheduled Events document was read and decoded since New.
// Not while the first call is outstanding (Poll then returns what it knows and no error, as
// documented), not after a 404, a 503, a timeout or a body that is not a document: until
// then, no notice is known to be absent.
func (p *Provider) Answered() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]bool{SourceScheduledEvents: p.answered}
}

// withTimeout is providers.WithTimeout on the provider's timers.
func (p *Provider) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return providers.WithTimeout(ctx, p.timers, d)
}

// apply turns a new document into notices and updates what the provider remembers of each
// event. The caller holds p.mu.
func (p *Provider) apply(doc ScheduledEventsDocument, resource string, now time.Time) ([]providers.Notice, error) {
	notices := []providers.Notice{} // not nil: a parsed document is an answer, even when empty
	var errs []error
	live := map[string]bool{}
	for _, ev := range doc.Events {
		if !names(ev.Resources, resource) {
			continue
		}
		id := strings.TrimSpace(ev.EventId)
		if id == "" {
			// Nothing could approve or track it; Azure always sends an ID.
			errs = append(errs, fmt.Errorf("%s event for %s without an EventId", ev.EventType, resource))
			continue
		}
		if live[id] {
			errs = append(errs, fmt.Errorf("event %q listed twice; using the first", id))
			continue
		}
		live[id] = true
		st, ok := p.seen[id]
		if !ok {
			st = &seenEvent{first: now}
			p.seen[id] = st
		}
		st.others = others(ev.Resources, resource)
		switch {
		case !started(ev):
			st.started = time.Time{}
		case st.started.IsZero():
			st.started = now
		}
		ev.EventId = id
		n, err := toNotice(ev, p.freeze, st.first, st.started)
		if err != nil {
			errs = append(errs, err)
			if prev, ok := p.lastNotice(id); ok {
				notices = append(notices, prev)
			}
			continue
		}
		notices = append(notices, n)
	}
	// Forget events that are gone (finished or cancelled), so the map does not grow forever
	// and an ID Azure reused would be new again.
	for id := range p.seen {
		if !live[id] {
			delete(p.seen, id)
		}
	}
	providers.Sort(notices)
	return notices, errors.Join(errs...)
}

// lastNotice finds the notice the last document gave for an event. The caller holds p.mu.
func (p *Provider) lastNotice(id string) (providers.Notice, bool) {
	for _, n := range p.last {
		if n.ID == id {
			return n, true
		}
	}
	return providers.Notice{}, false
}

func (p *Provider) lastNotices() []providers.Notice {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.last)
}

// resourceName returns this machine's name in Resources, asking IMDS compute.name the first
// time when Options gave none. A failure is returned, never guessed around: a wrong name would
// hide every event of this machine.
func (p *Provider) resourceName(ctx context.Context) (string, error) {
	p.mu.Lock()
	name := p.resource
	p.mu.Unlock()
	if name != "" {
		return name, nil
	}
	body, err := p.do(ctx, http.MethodGet, p.computeURL, nil, "reading instance compute metadata")
	if err != nil {
		return "", err
	}
	var compute struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(body, &compute); err != nil {
		return "", fmt.Errorf("decoding instance compute metadata %q: %w", truncate(body), err)
	}
	name = strings.TrimSpace(compute.Name)
	if name == "" {
		return "", fmt.Errorf("instance compute metadata %q has no name", truncate(body))
	}
	p.mu.Lock()
	p.resource = name
	p.mu.Unlock()
	return name, nil
}

// startRequests is the body of an approval.
type startRequests struct {
	StartRequests []startRequest `json:"StartRequests"`
}

type startRequest struct {
	EventID string `json:"EventId"`
}

// ErrTooLarge marks an answer longer than maxBody, which is not read past it.
var ErrTooLarge = errors.New("answer exceeds the size limit")

// ErrSharedEvent marks a refused approval of an event that also names other machines.
var ErrSharedEvent = errors.New("the event also names other machines")

// Approve implements providers.Approver: it asks Azure to start the notice's event now rather
// than at NotBefore. Azure then starts it for every VM in its Resources, at once. Approve
// refuses notices of other providers, events that the last document did not list for this
// machine, and events that also name other machines (ErrSharedEvent): this node being drained
// says nothing of theirs, and declining costs only the early start, never the notice.
func (p *Provider) Approve(ctx context.Context, n providers.Notice) error {
	if n.Provider != Name {
		return fmt.Errorf("azure provider: refusing to approve a notice of provider %q", n.Provider)
	}
	if n.ID == "" {
		return errors.New("azure provider: refusing to approve a notice without an ID")
	}
	p.mu.Lock()
	st, ours := p.seen[n.ID]
	var others []string
	if ours {
		others = st.others
	}
	resource := p.resource
	p.mu.Unlock()
	if !ours {
		return fmt.Errorf("approving event %q: the last scheduled events document lists no such event for %s", n.ID, resource)
	}
	if len(others) > 0 {
		return fmt.Errorf("approving event %q: refused: %w (%s)", n.ID, ErrSharedEvent, strings.Join(others, ", "))
	}
	body, err := json.Marshal(startRequests{StartRequests: []startRequest{{EventID: n.ID}}})
	if err != nil {
		return fmt.Errorf("approving event %q: %w", n.ID, err)
	}
	_, err = p.do(ctx, http.MethodPost, p.eventsURL, body, fmt.Sprintf("approving event %q", n.ID))
	return err
}

// StatusError is an IMDS answer with an unexpected HTTP status: 400 (a missing Metadata header
// or a malformed request), 429 (more than 5 requests a second), 5xx.
type StatusError struct {
	// Op says what failed ("reading scheduled events").
	Op string
	// StatusCode is the HTTP status.
	StatusCode int
	// Body is the start of the answer's body.
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s: %q", e.Op, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// do sends one request with the Metadata header and returns the body of a 200 answer (any 2xx
// for a POST).
func (p *Provider) do(ctx context.Context, method, u string, body []byte, op string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	// Without it IMDS answers 400: the header proves the request was meant for IMDS and not
	// redirected there.
	req.Header.Set("Metadata", "true")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	// One byte past the limit tells a long answer from one of exactly maxBody: a long one is
	// an error, never a prefix read as if it were the whole (a document followed by padding
	// would decode).
	if resp.ContentLength > maxBody {
		return nil, fmt.Errorf("%s: reading the answer (HTTP %d): %w of %d bytes (%d MiB): Content-Length %d", op, resp.StatusCode, ErrTooLarge, maxBody, maxBody>>20, resp.ContentLength)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%s: reading the answer (HTTP %d): %w", op, resp.StatusCode, err)
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("%s: reading the answer (HTTP %d): %w of %d bytes (%d MiB)", op, resp.StatusCode, ErrTooLarge, maxBody, maxBody>>20)
	}
	ok := resp.StatusCode == http.StatusOK
	if method != http.MethodGet {
		ok = resp.StatusCode >= 200 && resp.StatusCode < 300
	}
	if !ok {
		return nil, &StatusError{Op: op, StatusCode: resp.StatusCode, Body: truncate(b)}
	}
	return b, nil
}
