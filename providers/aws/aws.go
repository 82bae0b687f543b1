// Package aws reads interruption notices from the EC2 instance metadata service (IMDSv2).
package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/providers"
)

// Name is the provider's flag value.
const Name = "aws"

// The metadata paths reprieve reads, relative to /latest/meta-data/.
const (
	PathSpotInstanceAction = "spot/instance-action"
	PathRebalance          = "events/recommendations/rebalance"
	PathScheduledEvents    = "events/maintenance/scheduled"
)

// scheduledTimeLayout is the date format of NotBefore in events/maintenance/scheduled
// ("21 Jan 2019 09:00:43 GMT"), which is not RFC 3339 like the spot notice's.
// AWS always writes GMT; a literal zone keeps a date in any other zone from being read as UTC.
const scheduledTimeLayout = "2 Jan 2006 15:04:05 GMT"

// sources lists what one poll reads, in a fixed order so that results are deterministic.
var sources = []string{PathSpotInstanceAction, PathRebalance, PathScheduledEvents}

// Options configures the provider.
type Options struct {
	// Endpoint is the IMDS base URL, for example http://169.254.169.254.
	Endpoint string
	// HTTPClient overrides the SDK's HTTP client (main passes one instrumented with
	// RequestMetrics). The SDK's own client dials within 250 ms and wants response headers
	// within 500 ms; a caller's client has neither, so New bounds each request's time to its
	// response headers with ResponseHeaderTimeout: a token PUT lost to the IMDS hop limit then
	// fails in half a second instead of costing a whole poll.
	HTTPClient imds.HTTPClient
	// ResponseHeaderTimeout bounds, for a caller's HTTPClient, the time from sending a request
	// (dial included) to its response headers. Zero means DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout time.Duration
	// Clock stamps notices that carry no time of their own.
	Clock clock.PassiveClock
	// Timers runs ResponseHeaderTimeout's timer; nil is the real clock (tests give a fake).
	Timers clock.WithDelayedExecution
}

// Provider polls IMDSv2. It is safe for use by one poller at a time.
type Provider struct {
	client *imds.Client
	clock  clock.PassiveClock

	mu sync.Mutex
	// last holds each source's last good answer, so that a failing source neither invents
	// nor withdraws a notice.
	last map[string][]providers.Notice
	// firstSeen stamps notices whose payload carries no notice time.
	firstSeen map[string]time.Time
	// answered holds the sources that have answered (200 and parsed, or 404) since New, and
	// lastAnswer when each last did.
	answered   map[string]bool
	lastAnswer map[string]time.Time
}

// New returns a provider for the IMDS at opts.Endpoint. IMDSv1 fallback is disabled: a token
// failure is an error, never a silent downgrade.
func New(opts Options) (*Provider, error) {
	if opts.Endpoint == "" {
		return nil, errors.New("aws provider: empty IMDS endpoint")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ResponseHeaderTimeout < 0 {
		return nil, fmt.Errorf("aws provider: response header timeout %s: must not be negative", opts.ResponseHeaderTimeout)
	}
	if opts.ResponseHeaderTimeout == 0 {
		opts.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	}
	if opts.Timers == nil {
		opts.Timers = clock.RealClock{}
	}
	if opts.HTTPClient != nil {
		opts.HTTPClient = headerTimeoutClient{next: opts.HTTPClient, timeout: opts.ResponseHeaderTimeout, timers: opts.Timers}
	}
	client := imds.New(imds.Options{
		Endpoint:          strings.TrimRight(opts.Endpoint, "/"),
		EnableFallback:    awssdk.FalseTernary,
		ClientEnableState: imds.ClientEnabled,
		HTTPClient:        opts.HTTPClient,
		// One quick retry covers a token that expired between calls (401 drops the cached
		// token); anything longer is the agent's poll loop's job, with its own backoff and
		// jitter, so that one poll never blocks for the SDK's default of several seconds.
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 2
			o.MaxBackoff = 100 * time.Millisecond
			// The standard retryer's token bucket would run dry during a long IMDS outage and
			// then refuse even the one retry after a 401; the poll loop bounds retries instead.
			o.RateLimiter = ratelimit.None
			// A request that got no headers within the bound is not retried: a black hole
			// stays one, and the retry would double the poll's blind time. Nor is an answer
			// over MaxBody: the next one would be as long.
			o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) awssdk.Ternary {
				if errors.Is(err, ErrNoResponse) || errors.Is(err, ErrTooLarge) {
					return awssdk.FalseTernary
				}
				return awssdk.UnknownTernary
			})}, o.Retryables...)
		}),
		// Without this, imds.New wraps the Retryer in retry.AddWithMaxBackoffDelay(1s),
		// whose backoff replaces the 100 ms above.
		DisableDefaultMaxBackoff: true,
		// The SDK reads every answer whole (its OperationDeserializer's io.ReadAll) before
		// GetMetadata returns, so a limit on out.Content would come too late: the bound sits
		// under that read, on the raw response, for every operation (the token's too).
		APIOptions: []func(*middleware.Stack) error{addBodyLimit},
	})
	return &Provider{
		client:     client,
		clock:      opts.Clock,
		last:       map[string][]providers.Notice{},
		firstSeen:  map[string]time.Time{},
		answered:   map[string]bool{},
		lastAnswer: map[string]time.Time{},
	}, nil
}

// DefaultResponseHeaderTimeout is the SDK's own client's response-header timeout
// (feature/ec2/imds, defaultResponseHeaderTimeout); its 250 ms dial timeout fits inside it.
const DefaultResponseHeaderTimeout = 500 * time.Millisecond

// MaxBody bounds what is read of one IMDS answer, the token's included; a real one is a few
// hundred bytes.
const MaxBody = providers.MaxAnswer

// ErrTooLarge marks an answer longer than MaxBody (providers.ErrTooLarge).
var ErrTooLarge = providers.ErrTooLarge

// bodyLimitID names addBodyLimit's middleware in the SDK's stack.
const bodyLimitID = "reprieveBodyLimit"

// addBodyLimit puts limitBody last in the deserialize step: the innermost, so that it sees the
// raw response before the SDK's deserializer reads it.
func addBodyLimit(stack *middleware.Stack) error {
	return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc(bodyLimitID, limitBody), middleware.After)
}

// limitBody makes the body of every answer fail with ErrTooLarge past MaxBody bytes, instead of
// being read to its end: an answer that declares a longer Content-Length fails unread.
func limitBody(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
	middleware.DeserializeOutput, middleware.Metadata, error,
) {
	out, md, err := next.HandleDeserialize(ctx, in)
	if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp != nil && resp.Body != nil {
		b := providers.NewLimitedBody(resp.Body, resp.ContentLength, MaxBody)
		// The sources share one token: a token answer over the limit ends the poll, as one
		// that got no headers does (headerTimeoutClient), or each source would read its own.
		if end, ok := ctx.Value(noResponseKey{}).(context.CancelCauseFunc); ok && resp.Request != nil && resp.Request.URL.Path == tokenPath {
			b.OnTooLarge = func(err error) { end(fmt.Errorf("%s %s: %w", resp.Request.Method, tokenPath, err)) }
		}
		resp.Body = b
	}
	return out, md, err
}

// tokenPath is where IMDSv2 hands out tokens.
const tokenPath = "/latest/api/token"

// ErrNoResponse marks a request that got no response headers within the bound: a black hole
// (the token PUT's answer dropped by the hop limit, a stalled IMDS).
var ErrNoResponse = errors.New("no response headers")

// headerTimeoutClient gives a caller's HTTP client the short bound the SDK's own client has:
// the request is abandoned when no response headers arrived within timeout. Once they did, the
// body is read under the request's own context only. The error is not one the SDK retries:
// the agent's poll loop retries, with backoff.
type headerTimeoutClient struct {
	next    imds.HTTPClient
	timeout time.Duration
	timers  clock.WithDelayedExecution
}

func (c headerTimeoutClient) Do(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	t := c.timers.AfterFunc(c.timeout, func() { cancel(ErrNoResponse) })
	resp, err := c.next.Do(req.WithContext(ctx))
	t.Stop()
	if err != nil {
		timedOut := errors.Is(context.Cause(ctx), ErrNoResponse)
		cancel(context.Canceled)
		if timedOut {
			err := fmt.Errorf("%s %s: %w within %s", req.Method, req.URL.Path, ErrNoResponse, c.timeout)
			if end, ok := req.Context().Value(noResponseKey{}).(context.CancelCauseFunc); ok {
				end(err)
			}
			return nil, err
		}
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(context.Canceled) }}
	return resp, nil
}

// noResponseKey is the context key of the function that ends a poll whose request got no
// response headers, or whose token answer was over MaxBody.
type noResponseKey struct{}

// cancelOnClose releases a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Poll reads the three notice sources concurrently and returns every notice in force. A source
// that fails keeps its last good answer; the error names each failed source.
func (p *Provider) Poll(ctx context.Context) ([]providers.Notice, error) {
	type result struct {
		notices []providers.Notice
		err     error
	}
	results := make([]result, len(sources))
	// The sources share one token: when its PUT gets no answer, or one over MaxBody, the
	// others would each try again in turn (the SDK serialises token fetches). The first such
	// failure ends the poll. The SDK does not keep the token error's chain, so
	// headerTimeoutClient and limitBody report it here.
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pctx = context.WithValue(pctx, noResponseKey{}, cancel)
	var wg sync.WaitGroup
	for i, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, found, err := p.get(pctx, src)
			if cause := context.Cause(pctx); err != nil && ctx.Err() == nil && (errors.Is(cause, ErrNoResponse) || errors.Is(cause, ErrTooLarge)) {
				err = &SourceError{Path: src, Err: cause}
			}
			if err != nil {
				results[i] = result{err: err}
				return
			}
			ns, err := parse(src, body, found)
			results[i] = result{notices: ns, err: err}
		}()
	}
	wg.Wait()

	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	var all []providers.Notice
	var errs []error
	for i, src := range sources {
		if results[i].err != nil {
			errs = append(errs, results[i].err)
		} else {
			// Stamped here, under p.mu, not in the goroutines: they run concurrently and
			// firstSeen is shared.
			p.stampFirstSeen(results[i].notices, now)
			hibernateNow(results[i].notices)
			p.last[src] = results[i].notices
			p.answered[src] = true
			p.lastAnswer[src] = now
		}
		all = append(all, p.last[src]...)
	}
	// Forget first-seen times of notices that are gone, so the map does not grow forever.
	live := map[string]bool{}
	for _, n := range all {
		live[n.ID] = true
	}
	for id := range p.firstSeen {
		if !live[id] {
			delete(p.firstSeen, id)
		}
	}
	providers.Sort(all)
	return all, errors.Join(errs...)
}

// Answered implements providers.SourceReporter: each of the three paths, true once a GET of
// it was answered 200 with a document that parsed, or 404 (nothing pending).
func (p *Provider) Answered() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]bool, len(sources))
	for _, src := range sources {
		out[src] = p.answered[src]
	}
	return out
}

// LastAnswers implements providers.AnswerTimes: when each of the three paths last answered
// (the poll's time; zero when not since New).
func (p *Provider) LastAnswers() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(sources))
	for _, src := range sources {
		out[src] = p.lastAnswer[src]
	}
	return out
}

// get fetches one metadata path. found is false for a 404, which IMDS uses for "nothing
// pending"; every other non-2xx answer is an error.
func (p *Provider) get(ctx context.Context, path string) (body []byte, found bool, err error) {
	out, err := p.client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
			return nil, false, nil
		}
		return nil, false, &SourceError{Path: path, Err: err}
	}
	defer out.Content.Close()
	// out.Content is the SDK's copy of a body limitBody already bounded.
	body, err = io.ReadAll(out.Content)
	if err != nil {
		return nil, false, &SourceError{Path: path, Err: fmt.Errorf("reading body: %w", err)}
	}
	return body, true, nil
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
	var re *smithyhttp.ResponseError
	if errors.As(e.Err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func parse(src string, body []byte, found bool) ([]providers.Notice, error) {
	if !found {
		return nil, nil
	}
	var (
		ns  []providers.Notice
		err error
	)
	switch src {
	case PathSpotInstanceAction:
		ns, err = ParseSpotInstanceAction(body)
	case PathRebalance:
		ns, err = ParseRebalance(body)
	case PathScheduledEvents:
		ns, err = ParseScheduledEvents(body)
	}
	if err != nil {
		return nil, &SourceError{Path: src, Err: err}
	}
	return ns, nil
}

// stampFirstSeen gives notices without a time of their own the time reprieve first saw them.
// The caller holds p.mu.
func (p *Provider) stampFirstSeen(ns []providers.Notice, now time.Time) {
	for i := range ns {
		if ns[i].NoticeTime.IsZero() {
			t, ok := p.firstSeen[ns[i].ID]
			if !ok {
				t = now
				p.firstSeen[ns[i].ID] = t
			}
			ns[i].NoticeTime = t
		}
	}
}

// ActionHibernate is the spot instance action of an instance that hibernates. Its Notice.Action
// carries HibernateNote, so that the agent's Event for the notice says why it evicts at once.
const (
	ActionHibernate = "hibernate"
	HibernateNote   = "hibernate: no two-minute warning, hibernation begins immediately; evicting at once"
)

// hibernateNow moves the deadline of a hibernation notice to when it was first seen, if that
// is earlier: AWS sends no two-minute warning for hibernation, "the hibernation process begins
// immediately" (AWS, "Spot Instance interruption notices"), so the time in the document is no
// deadline to plan on. First seen, not now: the deadline must stay put from poll to poll.
func hibernateNow(ns []providers.Notice) {
	for i := range ns {
		n := &ns[i]
		if n.Kind != providers.KindSpotInterruption || n.Action != HibernateNote {
			continue
		}
		if !n.NoticeTime.IsZero() && n.NoticeTime.Before(n.Deadline) {
			n.Deadline = n.NoticeTime
			n.FromFirstSeen = true
		}
	}
}

// spotInstanceAction is the document at spot/instance-action.
type spotInstanceAction struct {
	Action string `json:"action"`
	Time   string `json:"time"`
}

// ParseSpotInstanceAction turns a spot/instance-action document into a notice whose deadline
// is the document's time.
func ParseSpotInstanceAction(body []byte) ([]providers.Notice, error) {
	var doc spotInstanceAction
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("decoding spot instance action %q: %w", truncate(body), err)
	}
	switch doc.Action {
	case "terminate", "stop", "hibernate":
	default:
		return nil, fmt.Errorf("spot instance action: unknown action %q", doc.Action)
	}
	deadline, err := time.Parse(time.RFC3339, doc.Time)
	if err != nil {
		return nil, fmt.Errorf("spot instance action: parsing time %q: %w", doc.Time, err)
	}
	n := providers.Notice{
		Provider:    Name,
		Kind:        providers.KindSpotInterruption,
		ID:          providers.HashID(Name, PathSpotInstanceAction, doc.Action, doc.Time),
		Deadline:    deadline,
		Action:      doc.Action,
		Description: "spot instance " + doc.Action,
		Source:      PathSpotInstanceAction,
	}
	if doc.Action == ActionHibernate {
		// The deadline becomes min(time, first seen) in Poll, which knows when that was.
		n.Action = HibernateNote
		n.Description = "spot instance hibernate: AWS gives no two-minute warning for hibernation, it begins immediately; the deadline is when reprieve first saw the notice, if earlier than the document's time"
	}
	return []providers.Notice{n}, nil
}

// rebalance is the document at events/recommendations/rebalance.
type rebalance struct {
	NoticeTime string `json:"noticeTime"`
}

// ParseRebalance turns a rebalance recommendation into a soft notice without a deadline.
func ParseRebalance(body []byte) ([]providers.Notice, error) {
	var doc rebalance
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("decoding rebalance recommendation %q: %w", truncate(body), err)
	}
	t, err := time.Parse(time.RFC3339, doc.NoticeTime)
	if err != nil {
		return nil, fmt.Errorf("rebalance recommendation: parsing noticeTime %q: %w", doc.NoticeTime, err)
	}
	return []providers.Notice{{
		Provider: Name,
		Kind:     providers.KindRebalanceRecommendation,
		// An instance has at most one rebalance recommendation, and it is never withdrawn once
		// posted: a fixed ID keeps a noticeTime that moves (amazon-ec2-metadata-mock recomputes
		// it on every request) from looking like a new notice at every poll.
		ID:          providers.HashID(Name, PathRebalance),
		NoticeTime:  t,
		Description: "EC2 instance rebalance recommendation",
		Source:      PathRebalance,
	}}, nil
}

// ScheduledEvent is one entry of events/maintenance/scheduled.
type ScheduledEvent struct {
	NotBefore   string `json:"NotBefore"`
	NotAfter    string `json:"NotAfter"`
	Code        string `json:"Code"`
	Description string `json:"Description"`
	EventID     string `json:"EventId"`
	State       string `json:"State"`
}

// ParseScheduledEvents turns the active scheduled events into notices with NotBefore as their
// deadline. Cancelled and completed events are not in force: leaving them out undoes what
// they did while active.
func ParseScheduledEvents(body []byte) ([]providers.Notice, error) {
	var events []ScheduledEvent
	if err := json.Unmarshal(body, &events); err != nil {
		return nil, fmt.Errorf("decoding scheduled events %q: %w", truncate(body), err)
	}
	var ns []providers.Notice
	var errs []error
	for _, ev := range events {
		if !strings.EqualFold(ev.State, "active") {
			continue
		}
		nb, err := time.Parse(scheduledTimeLayout, ev.NotBefore)
		if err != nil {
			errs = append(errs, fmt.Errorf("scheduled event %q: parsing NotBefore %q: %w", ev.EventID, ev.NotBefore, err))
			continue
		}
		id := ev.EventID
		if id == "" {
			id = providers.HashID(Name, PathScheduledEvents, ev.Code, ev.NotBefore)
		}
		ns = append(ns, providers.Notice{
			Provider:    Name,
			Kind:        providers.KindScheduledMaintenance,
			ID:          id,
			Deadline:    nb,
			Action:      ev.Code,
			Description: ev.Description,
			Source:      PathScheduledEvents,
		})
	}
	if len(errs) > 0 {
		// An event we cannot date must not be half-applied: fail the source so that its last
		// good answer stands.
		return nil, errors.Join(errs...)
	}
	return ns, nil
}

func truncate(b []byte) string {
	const max = 120
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
