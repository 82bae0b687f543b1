// Package notify posts optional webhook notifications when an interruption notice arrives and
// when it has been handled. Notify only enqueues, so the eviction path never waits on a webhook;
// Run delivers in the background with bounded retries.
package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Message kinds.
const (
	KindNotice  = "notice"
	KindHandled = "handled"
)

// Message is one notification; the body template is executed with it.
type Message struct {
	Kind       string // KindNotice or KindHandled
	Node       string
	Provider   string
	NoticeKind string
	NoticeID   string
	Action     string
	Deadline   time.Time
	NoticeTime time.Time
	Pods       int
	PodsInTime int
	PodsMissed int
	Text       string // a one-line human summary the agent fills
}

// Retry timing: 500 ms doubling to 30 s. The cap also bounds a receiver's Retry-After: a spot
// notice gives two minutes, and a message held longer is stale and holds up the ones behind it.
const (
	backoffBase = 500 * time.Millisecond
	backoffMax  = 30 * time.Second
)

// Response bodies are logged up to bodyLogLimit bytes; up to drainLimit bytes are read so that
// the connection can be reused.
const (
	bodyLogLimit = 256
	drainLimit   = 64 << 10
)

// Notifier queues messages and delivers them to a webhook. Create it with New.
type Notifier struct {
	url     string
	tmpl    *template.Template
	headers http.Header
	timeout time.Duration
	max     int
	client  *http.Client
	clock   clock.WithTicker
	rand    func() float64 // jitter source in [0, 1)
	queue   chan Message
	metrics *metrics
	stopped atomic.Bool
	// unlogged counts drops that Run has not logged yet: Notify only counts, Run logs.
	unlogged atomic.Int64
	// flush is closed by Flush: Run then delivers what is queued and returns.
	flush     chan struct{}
	flushOnce sync.Once
}

// Option changes a Notifier's dependencies.
type Option func(*Notifier)

// WithHTTPClient sets the client requests are sent with (default: a client on
// http.DefaultTransport, which honours HTTPS_PROXY). Its own Timeout, if any, applies on top of
// Config.Timeout. A copy is used, which never follows redirects (refuseRedirect).
func WithHTTPClient(c *http.Client) Option {
	return func(n *Notifier) {
		cc := *c
		cc.CheckRedirect = refuseRedirect
		n.client = &cc
	}
}

// errRedirect is the error of a webhook request the receiver redirected.
var errRedirect = errors.New("the receiver answered with a redirect, which reprieve does not follow")

// refuseRedirect refuses every redirect. Go's client forwards custom headers (an API key from the
// headers file) to a redirect's target on the same domain and, before it strips them, a redirect
// is also a way to turn an https URL into an http one; a webhook has no reason to redirect.
func refuseRedirect(*http.Request, []*http.Request) error { return errRedirect }

// WithClock sets the clock that retry backoff waits on (default: the real clock).
func WithClock(c clock.WithTicker) Option {
	return func(n *Notifier) { n.clock = c }
}

// New validates cfg and returns a Notifier. Nothing is sent until Run.
func New(cfg Config, opts ...Option) (*Notifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuring webhook notifications: %w", err)
	}
	tmpl, err := parseTemplate(cfg.Template)
	if err != nil {
		return nil, fmt.Errorf("configuring webhook notifications: %w", err)
	}
	headers := http.Header{}
	headers.Set("Content-Type", "application/json")
	headers.Set("User-Agent", "reprieve")
	for k, v := range cfg.Headers {
		headers.Set(k, v)
	}
	n := &Notifier{
		url:     cfg.URL,
		tmpl:    tmpl,
		headers: headers,
		timeout: cfg.Timeout,
		max:     cfg.MaxAttempts,
		client:  &http.Client{CheckRedirect: refuseRedirect},
		clock:   clock.RealClock{},
		rand:    rand.Float64,
		queue:   make(chan Message, cfg.QueueSize),
		flush:   make(chan struct{}),
		metrics: newMetrics(),
	}
	for _, o := range opts {
		o(n)
	}
	return n, nil
}

// Notify enqueues m and returns at once: it never blocks and never does I/O, because it is
// called on the eviction path. It returns false when m was dropped, because the queue is full or
// Run has stopped. On a nil Notifier it returns false and counts nothing, so callers need not
// check whether webhooks are configured.
func (n *Notifier) Notify(m Message) bool {
	if n == nil {
		return false
	}
	if !n.stopped.Load() {
		select {
		case n.queue <- m:
			return true
		default:
		}
	}
	n.metrics.dropped.Inc()
	n.unlogged.Add(1)
	return false
}

// Run delivers queued messages one at a time until ctx ends, then drops what is left (logging
// how many) and returns. After Flush it delivers what is queued and returns. Call it once.
func (n *Notifier) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		n.logDrops(logger)
		select {
		case <-ctx.Done():
			n.stop(logger, 0)
			return
		case <-n.flush:
			n.deliverQueued(ctx, logger)
			return
		case m := <-n.queue:
			if ctx.Err() != nil {
				n.stop(logger, 1)
				return
			}
			if !n.deliver(ctx, m) {
				n.stop(logger, 1)
				return
			}
		}
	}
}

// Flush asks Run to deliver the queued messages and return; messages notified after it are
// dropped. Run's ctx still bounds the delivery: cancel it to give up.
func (n *Notifier) Flush() {
	if n == nil {
		return
	}
	n.flushOnce.Do(func() { close(n.flush) })
}

// deliverQueued delivers the queued messages until the queue is empty or ctx ends, then stops.
func (n *Notifier) deliverQueued(ctx context.Context, logger klog.Logger) {
	for {
		select {
		case m := <-n.queue:
			if ctx.Err() != nil || !n.deliver(ctx, m) {
				n.stop(logger, 1)
				return
			}
		default:
			n.stop(logger, 0)
			return
		}
	}
}

func (n *Notifier) logDrops(logger klog.Logger) {
	if d := n.unlogged.Swap(0); d > 0 {
		logger.Info("Webhook queue was full, dropped messages", "dropped", d, "queueSize", cap(n.queue))
	}
}

// stop refuses further messages and drops the queued ones plus inFlight abandoned by deliver.
func (n *Notifier) stop(logger klog.Logger, inFlight int) {
	n.stopped.Store(true)
	left := inFlight
	for draining := true; draining; {
		select {
		case <-n.queue:
			left++
		default:
			draining = false
		}
	}
	n.metrics.dropped.Add(float64(left))
	n.logDrops(logger)
	logger.Info("Webhook notifier stopped", "dropped", left)
}

// deliver sends m, retrying as the receiver's answers allow. It returns false when ctx ended
// before m was delivered or given up on; m is then counted by the caller.
func (n *Notifier) deliver(ctx context.Context, m Message) bool {
	logger := klog.FromContext(ctx).WithValues("kind", m.Kind, "noticeID", m.NoticeID)
	start := n.clock.Now()
	var body bytes.Buffer
	if err := n.tmpl.Execute(&body, m); err != nil {
		logger.Error(err, "Rendering webhook body failed, message not sent")
		n.finish(start, n.metrics.failed)
		return true
	}
	logger.V(5).Info("Webhook body", "body", body.String())
	for attempt := 1; ; attempt++ {
		res := n.post(ctx, body.Bytes())
		if res.err == nil {
			logger.V(2).Info("Delivered webhook", "attempt", attempt, "status", res.status)
			n.finish(start, n.metrics.delivered)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !res.retry || attempt >= n.max {
			logger.Error(res.err, "Webhook delivery failed", "attempt", attempt, "maxAttempts", n.max,
				"status", res.status, "body", res.body, "retryable", res.retry)
			n.finish(start, n.metrics.failed)
			return true
		}
		wait := backoff(attempt, res.retryAfter, n.rand())
		logger.Info("Webhook delivery attempt failed, retrying", "err", res.err, "attempt", attempt,
			"status", res.status, "body", res.body, "retryIn", wait)
		if !n.sleep(ctx, wait) {
			return false
		}
	}
}

func (n *Notifier) finish(start time.Time, outcome interface{ Inc() }) {
	n.metrics.duration.Observe(n.clock.Since(start).Seconds())
	outcome.Inc()
}

func (n *Notifier) sleep(ctx context.Context, d time.Duration) bool {
	t := n.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// result is the outcome of one attempt; err is nil when it was delivered.
type result struct {
	err        error
	status     int
	body       string // truncated, for the log
	retry      bool
	retryAfter time.Duration
}

func (n *Notifier) post(ctx context.Context, body []byte) result {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return result{err: fmt.Errorf("building webhook request: %w", redact(err))}
	}
	req.Header = n.headers.Clone()
	resp, err := n.client.Do(req)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return result{err: fmt.Errorf("posting webhook: no answer within %s", n.timeout), retry: true}
	}
	if err != nil && errors.Is(err, errRedirect) {
		// A configuration problem, not a passing one: retrying gets the same redirect.
		return result{err: fmt.Errorf("posting webhook: %w", errRedirect)}
	}
	if err != nil {
		// Connection refused, reset, timed out: the receiver may be back on the next attempt.
		return result{err: fmt.Errorf("posting webhook: %w", redact(err)), retry: true}
	}
	defer func() { _ = resp.Body.Close() }()
	snippet := readSnippet(resp.Body)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	res := result{status: resp.StatusCode, body: snippet}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return res
	}
	res.err = fmt.Errorf("posting webhook: receiver answered %s", resp.Status)
	res.retry = resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		res.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), n.clock.Now())
	}
	return res
}

// redact drops the URL that net/http puts in its errors: webhook URLs often carry a token.
func redact(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return fmt.Errorf("%s: %w", uerr.Op, uerr.Err)
	}
	return err
}

func readSnippet(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, bodyLogLimit+1))
	s := strings.ToValidUTF8(string(b), "?")
	if len(b) > bodyLogLimit {
		s = strings.ToValidUTF8(string(b[:bodyLogLimit]), "?") + "...(truncated)"
	}
	return s
}

// parseRetryAfter reads a Retry-After header in either form RFC 9110 allows, delay-seconds or
// an HTTP date; 0 when absent or unusable.
func parseRetryAfter(h string, now time.Time) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil {
		if s < 0 {
			return 0
		}
		return min(time.Duration(s)*time.Second, backoffMax)
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// backoff returns the wait after the attempt-th failed attempt (counting from 1): exponential
// with equal jitter, so that the agents of a fleet, all told of the same reclaim wave, do not
// retry in step; at least retryAfter, at most backoffMax. r is in [0, 1).
func backoff(attempt int, retryAfter time.Duration, r float64) time.Duration {
	d := backoffMax
	if attempt < 8 { // 500ms << 7 is past the cap; larger shifts would overflow
		d = min(backoffBase<<(attempt-1), backoffMax)
	}
	d = d/2 + time.Duration(r*float64(d/2))
	return min(max(d, retryAfter), backoffMax)
}

// jsonString is the template func json: v encoded as JSON, for example a string quoted and
// escaped for use as a JSON string value.
func jsonString(v any) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the body is not HTML; keep <, > and & readable
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("encoding %T as JSON: %w", v, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
