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
	// HTTPClient overrides the SDK's HTTP client (tests).
	HTTPClient imds.HTTPClient
	// Clock stamps notices that carry no time of their own.
	Clock clock.PassiveClock
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
		}),
		// Without this, imds.New wraps the Retryer in retry.AddWithMaxBackoffDelay(1s),
		// whose backoff replaces the 100 ms above.
		DisableDefaultMaxBackoff: true,
	})
	return &Provider{
		client:    client,
		clock:     opts.Clock,
		last:      map[string][]providers.Notice{},
		firstSeen: map[string]time.Time{},
	}, nil
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
	var wg sync.WaitGroup
	for i, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, found, err := p.get(ctx, src)
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
			p.last[src] = results[i].notices
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
	body, err = io.ReadAll(io.LimitReader(out.Content, 1<<20))
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
	return []providers.Notice{{
		Provider:    Name,
		Kind:        providers.KindSpotInterruption,
		ID:          providers.HashID(Name, PathSpotInstanceAction, doc.Action, doc.Time),
		Deadline:    deadline,
		Action:      doc.Action,
		Description: "spot instance " + doc.Action,
	}}, nil
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
