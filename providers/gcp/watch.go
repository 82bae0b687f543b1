package gcp

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/providers"
)

// sourceScheduling names the scheduling values among the watch's error sources.
const sourceScheduling = "instance/scheduling"

// errorOrder is the order in which the watch joins its sources' errors.
var errorOrder = []string{PathPreempted, PathMaintenanceEvent, PathUpcomingMaintenance, sourceScheduling}

const (
	// Backoff after a failed request: doubling from backoffBase to backoffCap, jittered.
	// The library has already retried a 5xx or a refused connection up to 5 times by then.
	// The cap keeps a notice posted once the server recovers within about 2 s of it, as the
	// polling providers' backoff (twice the 1 s poll interval) does; the server is local to
	// the VM, so the retries load nobody else.
	backoffBase = 200 * time.Millisecond
	backoffCap  = 2 * time.Second
	// minAnswerInterval paces a server that answers hanging GETs at once with an unchanged
	// value (emulators that ignore last_etag): reprieve then polls at this rate rather
	// than spinning.
	minAnswerInterval = time.Second
	// noETagInterval is the poll interval when the server sends no ETag to wait on.
	noETagInterval = time.Second
	// upcomingInterval is how often Watch reads instance/upcoming-maintenance. It is a poll,
	// not a hanging GET: the directory is absent (404) most of the time, and a window is
	// announced days or an hour ahead, so a few seconds of delay cost nothing.
	upcomingInterval = 5 * time.Second
)

// Watch implements providers.Watcher. It follows instance/preempted and
// instance/maintenance-event with hanging GETs and calls update with every notice in force
// whenever one of them, or a source's error, changes. A failed source keeps its last good
// value, is reported through update's err, and is retried with jittered exponential backoff.
// update is never called concurrently nor after Watch returns.
//
// Why not the library's SubscribeWithContext (cloud.google.com/go/compute/metadata v0.10.0):
// it gives up at once if the first read fails, swallows every later failure (reprieve could
// not report it), sleeps a fixed 5 s after one without watching its context, adds no
// timeout_sec, and calls back with every answer, so a server that ignores last_etag makes it
// spin. The loop here keeps the library's requests (header, host, per-request retries) and
// does the rest itself.
func (p *Provider) Watch(ctx context.Context, update func([]providers.Notice, error)) error {
	w := &watch{p: p, update: update, errs: map[string]error{}}

	// Read everything once before the first update, so that it is complete.
	etags := make([]string, len(noticePaths))
	errs := make([]error, len(noticePaths))
	var schedErr, upErr error
	var wg sync.WaitGroup
	for i, path := range noticePaths {
		wg.Go(func() { etags[i], _, errs[i] = p.refresh(ctx, path, "") })
	}
	wg.Go(func() { _, upErr = p.refreshUpcoming(ctx) })
	wg.Go(func() { schedErr = p.readScheduling(ctx) })
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for i, path := range noticePaths {
		w.errs[path] = errs[i]
	}
	w.errs[sourceScheduling] = schedErr
	w.errs[PathUpcomingMaintenance] = upErr
	w.publish(true)

	for i, path := range noticePaths {
		wg.Go(func() { w.follow(ctx, path, etags[i], errs[i]) })
	}
	wg.Go(func() { w.pollUpcoming(ctx) })
	if schedErr != nil {
		wg.Go(func() { w.retryScheduling(ctx) })
	}
	wg.Wait()
	return ctx.Err()
}

// watch is the state of one Watch call.
type watch struct {
	p      *Provider
	update func([]providers.Notice, error)

	// mu serialises updates, so that an older set never overtakes a newer one.
	mu   sync.Mutex
	errs map[string]error // each source's current error, nil when it is fine
	sent bool
	// sentNotices and sentErr are what update last got, to leave out updates that say nothing new.
	sentNotices []providers.Notice
	sentErr     string
}

// follow runs the hanging GETs on one path until ctx ends. etag and err are the outcome of
// the first read.
func (w *watch) follow(ctx context.Context, path, etag string, err error) {
	var bo backoff
	// quick counts the unchanged answers in a row that came back sooner than a hanging GET
	// should. One can happen (a value set again to itself moves the ETag on some servers); a
	// run of them means a server that ignores last_etag.
	quick := 0
	clk := w.p.timers
	if err != nil && etag == "" {
		if !sleep(ctx, clk, bo.next()) {
			return
		}
	}
	for {
		start := clk.Now()
		// With no ETag (first read failed, or the connection dropped) this reads the current
		// value without waiting, then waits on that answer's ETag. Waiting without last_etag
		// would only see the next change and miss one made while the connection was down.
		newTag, changed, err := w.p.refresh(ctx, path, etag)
		if ctx.Err() != nil {
			return
		}
		if changed && path == PathMaintenanceEvent {
			// The maintenance's deadline is upcoming-maintenance's window start: read it now
			// rather than at the next poll, so that the first update has the right deadline.
			_, uerr := w.p.refreshUpcoming(ctx)
			w.mu.Lock()
			w.errs[PathUpcomingMaintenance] = uerr
			w.mu.Unlock()
		}
		w.report(path, err)
		waited := etag != ""
		etag = newTag
		var pause time.Duration
		switch {
		case err != nil && newTag == "" && waited && errors.Is(err, ErrNoAnswer):
			// A hanging GET that stalled: read again at once (without last_etag, so a change
			// made meanwhile comes back without waiting). Only a second failure backs off.
			pause = 0
		case err != nil && newTag == "":
			pause = bo.next()
		case newTag == "":
			bo.reset()
			pause = noETagInterval
		default:
			bo.reset()
			if !waited || changed || clk.Since(start) >= minAnswerInterval {
				quick = 0
			} else if quick++; quick > 1 {
				pause = minAnswerInterval - clk.Since(start)
			}
		}
		if pause > 0 && !sleep(ctx, clk, pause) {
			return
		}
	}
}

// pollUpcoming reads instance/upcoming-maintenance every upcomingInterval until ctx ends.
func (w *watch) pollUpcoming(ctx context.Context) {
	for sleep(ctx, w.p.timers, upcomingInterval) {
		_, err := w.p.refreshUpcoming(ctx)
		if ctx.Err() != nil {
			return
		}
		w.report(PathUpcomingMaintenance, err)
	}
}

// retryScheduling reads the scheduling values until it succeeds; the termination deadline
// depends on them.
func (w *watch) retryScheduling(ctx context.Context) {
	var bo backoff
	for sleep(ctx, w.p.timers, bo.next()) {
		err := w.p.readScheduling(ctx)
		if ctx.Err() != nil {
			return
		}
		w.report(sourceScheduling, err)
		if err == nil {
			return
		}
	}
}

// report records the outcome of a read of source and publishes. A failure is always
// published; a success only when the notices or the errors changed.
func (w *watch) report(source string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs[source] = err
	w.publishLocked(err != nil)
}

func (w *watch) publish(force bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishLocked(force)
}

func (w *watch) publishLocked(force bool) {
	ns := w.p.notices()
	var errs []error
	for _, src := range errorOrder {
		if err := w.errs[src]; err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	if !force && w.sent && errText == w.sentErr && sameNotices(ns, w.sentNotices) {
		return
	}
	w.sent, w.sentNotices, w.sentErr = true, ns, errText
	w.update(ns, err)
}

func sameNotices(a, b []providers.Notice) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Kind != b[i].Kind || !a[i].Deadline.Equal(b[i].Deadline) {
			return false
		}
	}
	return true
}

// backoff doubles from backoffBase up to backoffCap. Each wait is drawn from [d/2, d]: the
// jitter spreads a fleet that lost its metadata servers at once, the floor keeps it from
// retrying at once.
type backoff struct{ d time.Duration }

func (b *backoff) next() time.Duration {
	if b.d == 0 {
		b.d = backoffBase
	} else if b.d = 2 * b.d; b.d > backoffCap {
		b.d = backoffCap
	}
	return b.d/2 + rand.N(b.d/2+1)
}

func (b *backoff) reset() { b.d = 0 }

// sleep waits for d on clk, or reports false when ctx ends first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
