package kubelet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of KubeletMaxPID: pid_max and threads-max are set at boot or by an operator's
// sysctl, so a few minutes' staleness costs nothing, while the Summary API is the kubelet's most
// expensive endpoint (every pod's stats).
const (
	DefaultMaxPIDRefresh = 5 * time.Minute
	DefaultMaxPIDRetry   = time.Minute
	DefaultMaxPIDTimeout = 2 * time.Second
)

// KubeletMaxPID is the kubelet's own PID limit: node.rlimit.maxpid of its Summary API, which the
// kubelet computes as min(pid_max, threads-max) read in the host's PID namespace
// (pkg/kubelet/stats/pidlimit, Stats) and which its eviction manager takes as pid.available's
// capacity (pkg/kubelet/eviction/helpers.go, makeSignalObservations). It is read at most every
// Refresh, and Retry after a failure; between reads, and after a failure, the last value read
// stands. Its MaxPID method is HostSource.MaxPID.
type KubeletMaxPID struct {
	// Source is the kubelet's Summary API.
	Source Source
	// Clock is the clock (nil: the real one).
	Clock clock.PassiveClock
	// Refresh, Retry and Timeout default to DefaultMaxPIDRefresh, DefaultMaxPIDRetry and
	// DefaultMaxPIDTimeout.
	Refresh, Retry, Timeout time.Duration
	// OnError is told of each failure whose message differs from the last one's.
	OnError func(error)

	mu      sync.Mutex
	limit   int64
	known   bool
	next    time.Time
	lastErr string
}

// MaxPID returns the kubelet's PID limit, reading the Summary API when the last read is older
// than Refresh (or than Retry, after a failure); ok is false until one read has succeeded.
func (k *KubeletMaxPID) MaxPID(ctx context.Context) (limit int64, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	now := c.Now()
	if !k.next.IsZero() && now.Before(k.next) {
		return k.limit, k.known
	}
	ctx, cancel := context.WithTimeout(ctx, orDuration(k.Timeout, DefaultMaxPIDTimeout))
	defer cancel()
	s, err := k.Source.Read(ctx)
	// A Summary that failed to parse in part may still carry the limit.
	if o, found := s.Node[PIDAvailable]; found && o.Capacity > 0 {
		k.limit, k.known, k.lastErr = o.Capacity, true, ""
		k.next = now.Add(orDuration(k.Refresh, DefaultMaxPIDRefresh))
		return k.limit, true
	}
	if err == nil {
		err = errors.New("no node.rlimit.maxpid in the Summary API")
	}
	err = fmt.Errorf("reading the kubelet's PID limit: %w", err)
	k.next = now.Add(orDuration(k.Retry, DefaultMaxPIDRetry))
	if msg := err.Error(); msg != k.lastErr {
		k.lastErr = msg
		if k.OnError != nil {
			k.OnError(err)
		}
	}
	return k.limit, k.known
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
