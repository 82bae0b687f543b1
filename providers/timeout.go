package providers

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// WithTimeout is context.WithTimeout on timers, so that a provider's tests can step a request's
// bound on a fake clock. On the real clock it is context.WithTimeout itself.
func WithTimeout(ctx context.Context, timers clock.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := timers.(clock.RealClock); ok {
		return context.WithTimeout(ctx, d)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	t := timers.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			cancel(context.DeadlineExceeded)
		case <-ctx.Done():
			t.Stop()
		}
	}()
	// Stopped here, not only in the goroutine, so that a test counting the fake clock's
	// waiters never sees the timer of a finished request.
	return ctx, func() { t.Stop(); cancel(context.Canceled) }
}
