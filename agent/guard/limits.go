package guard

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Limits bound what one source address can take of the guard. Without a client certificate
// (ClientAuth) the guard cannot tell the API server's reviews from forged ones, so it keeps them
// apart by where they come from: each source has its own reviews in flight and its own budget of
// pod reads, and a source past either is refused at once (HTTP 429, which the API server turns into
// a failed call) instead of waiting in a queue that other sources' reviews wait in too. A flood
// from one address then delays only that address. The API server's calls come from its own
// addresses (its node, or the konnectivity agent's pod where the control plane is remote).
//
// All sources together read at most twice one source's budget, the guard's client's own limit
// (cmd/reprieve/guard.go), so that a read never waits in the client's queue behind another
// source's: a source past the shared budget is refused at once instead. The last half of the
// shared budget is kept for the sources that read less than their fair share (the shared rate
// over the sources reading lately), so that several sources each reading all they may cannot
// spend it on the API server's reviews: a source that floods is refused first.
type Limits struct {
	// InFlightPerSource is how many reviews one source may have in flight at once.
	InFlightPerSource int
	// InFlight is how many reviews all sources together may have in flight: the bound on
	// memory when many addresses flood at once.
	InFlight int
	// PodReadsPerSecond and PodReadBurst are each source's budget of pod GETs (a token bucket).
	// The API server is one source: its budget is the guard's whole former client budget.
	PodReadsPerSecond float32
	PodReadBurst      int
	// ConnsPerSource and Conns cap the open connections, per source and in all; a connection past
	// either is closed before its TLS handshake.
	ConnsPerSource, Conns int
	// Sources is how many source addresses the guard keeps state for; past it, new addresses
	// share one state, and so one budget.
	Sources int
}

// DefaultLimits are the chart's. A node's drain sends a few dozen reviews at once and a fleet's
// reclaim more: the API server's own budget stays the 50 pod reads a second (burst 100) that the
// guard's client had for everyone before, and the client's is twice that, so that one source
// flooding leaves half of it to the others.
func DefaultLimits() Limits {
	return Limits{InFlightPerSource: 64, InFlight: 256, PodReadsPerSecond: 50, PodReadBurst: 100,
		ConnsPerSource: 64, Conns: 512, Sources: 4096}
}

// Validate says which limit is unusable.
func (l Limits) Validate() error {
	for _, c := range []struct {
		name string
		v    float64
	}{{"reviews in flight per source", float64(l.InFlightPerSource)}, {"reviews in flight", float64(l.InFlight)},
		{"pod reads per second per source", float64(l.PodReadsPerSecond)}, {"pod read burst", float64(l.PodReadBurst)},
		{"connections per source", float64(l.ConnsPerSource)}, {"connections", float64(l.Conns)}, {"sources", float64(l.Sources)}} {
		if c.v < 1 {
			return fmt.Errorf("%s: %v; want at least 1", c.name, c.v)
		}
	}
	switch {
	case l.InFlight < l.InFlightPerSource:
		return fmt.Errorf("reviews in flight: %d; want at least the %d of one source", l.InFlight, l.InFlightPerSource)
	case l.Conns < l.ConnsPerSource:
		return fmt.Errorf("connections: %d; want at least the %d of one source", l.Conns, l.ConnsPerSource)
	}
	return nil
}

// overflowSource is the key that sources past Limits.Sources share.
const overflowSource = "overflow"

// rejectLogEvery spaces the log lines about one source's refused reviews.
const rejectLogEvery = time.Minute

// Limiter keeps Limits. Its state per source lives while the source has reviews in flight or
// its bucket is not yet full again; a source that has been quiet that long is forgotten, as a
// fresh one would start with a full bucket anyway.
type Limiter struct {
	limits Limits
	clock  clock.PassiveClock
	// refill is how long an empty bucket takes to fill.
	refill time.Duration

	mu        sync.Mutex
	inFlight  int
	sources   map[string]*source
	lastSweep time.Time
	// shared is every source's reads together; reserve its tokens kept for light sources.
	shared  *rate.Limiter
	reserve float64
	// active is how many sources read within the last two windows, counted at activeAt.
	active   int
	activeAt time.Time
	// peak is the most reviews one source has had in flight at once.
	peak int
}

// rateWindow is the window over which a source's rate of reads is measured.
const rateWindow = time.Second

type source struct {
	inFlight int
	reads    *rate.Limiter
	// lastRead is when the bucket last gave a token (or was made).
	lastRead time.Time
	lastLog  time.Time
	// The reads of the current window, which began at winStart, and of the one before.
	winStart  time.Time
	cur, prev int
}

// roll moves s's windows up to now.
func (s *source) roll(now time.Time) {
	switch n := now.Sub(s.winStart); {
	case n < rateWindow:
	case n < 2*rateWindow:
		s.prev, s.cur = s.cur, 0
		s.winStart = s.winStart.Add(rateWindow)
	default:
		s.prev, s.cur = 0, 0
		s.winStart = now
	}
}

// rate is s's reads a second lately: the current window's and the part of the previous one that
// the sliding window still covers (the estimate of a sliding-window rate limiter).
func (s *source) rate(now time.Time) float64 {
	s.roll(now)
	left := 1 - float64(now.Sub(s.winStart))/float64(rateWindow)
	return (float64(s.prev)*left + float64(s.cur)) / rateWindow.Seconds()
}

// NewLimiter keeps limits on the clock c.
func NewLimiter(limits Limits, c clock.PassiveClock) (*Limiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, fmt.Errorf("the eviction guard's limits: %w", err)
	}
	refill := time.Duration(float64(limits.PodReadBurst) / float64(limits.PodReadsPerSecond) * float64(time.Second))
	return &Limiter{limits: limits, clock: c, refill: refill, sources: map[string]*source{}, lastSweep: c.Now(),
		shared:  rate.NewLimiter(rate.Limit(2*limits.PodReadsPerSecond), 2*limits.PodReadBurst),
		reserve: float64(limits.PodReadBurst)}, nil
}

// SourceKey names the source of a connection from its remote address: the IPv4 address, or the
// /64 of an IPv6 one (a host is usually given a whole /64, so that one address each would be no
// limit at all). An address that does not parse is a source of its own, by its text.
func SourceKey(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		host, _, splitErr := net.SplitHostPort(remote)
		if splitErr != nil {
			return remote
		}
		a, parseErr := netip.ParseAddr(host)
		if parseErr != nil {
			return host
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Acquire takes one of key's review slots; ok false means key (or all sources together) has as
// many reviews in flight as it may. release gives the slot back.
func (l *Limiter) Acquire(key string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight >= l.limits.InFlight {
		return nil, false
	}
	_, s := l.source(key)
	if s.inFlight >= l.limits.InFlightPerSource {
		return nil, false
	}
	s.inFlight++
	l.inFlight++
	l.peak = max(l.peak, s.inFlight)
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			s.inFlight--
			l.inFlight--
		})
	}, true
}

// Peak is the most reviews one source has had in flight at once, since the limiter was made.
func (l *Limiter) Peak() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peak
}

// AllowRead takes one pod read from key's budget and from the shared one, or says that either
// is spent. The shared budget's reserve (its last PodReadBurst tokens) goes only to a source
// whose rate of reads is below its fair share.
func (l *Limiter) AllowRead(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, s := l.source(key)
	now := l.clock.Now()
	if s.reads.TokensAt(now) < 1 {
		return false
	}
	shared := l.shared.TokensAt(now)
	if shared < 1 {
		return false
	}
	if shared-1 < l.reserve && s.rate(now) >= l.fairShare(now) {
		return false
	}
	s.reads.AllowN(now, 1)
	l.shared.AllowN(now, 1)
	s.roll(now)
	s.cur++
	s.lastRead = now
	return true
}

// fairShare is the shared rate over the sources that read within the last two windows (at
// least one). Called with mu held; the count is refreshed at most once per tenth of a window.
func (l *Limiter) fairShare(now time.Time) float64 {
	if l.activeAt.IsZero() || now.Sub(l.activeAt) >= rateWindow/10 || now.Before(l.activeAt) {
		l.active, l.activeAt = 0, now
		for _, s := range l.sources {
			if now.Sub(s.lastRead) < 2*rateWindow && (s.cur > 0 || s.prev > 0) {
				l.active++
			}
		}
	}
	return float64(l.shared.Limit()) / float64(max(1, l.active))
}

// ShouldLog says whether a refusal of key's review is worth a log line: one a minute per source,
// so that a flood does not become a flood of the log as well.
func (l *Limiter) ShouldLog(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, s := l.source(key)
	now := l.clock.Now()
	if !s.lastLog.IsZero() && now.Sub(s.lastLog) < rejectLogEvery {
		return false
	}
	s.lastLog = now
	return true
}

// source returns key's state, made if need be, and the key it is kept under. Called with mu held.
func (l *Limiter) source(key string) (string, *source) {
	if s, ok := l.sources[key]; ok {
		return key, s
	}
	now := l.clock.Now()
	if len(l.sources) >= l.limits.Sources || now.Sub(l.lastSweep) >= l.refill {
		l.sweep(now)
	}
	if len(l.sources) >= l.limits.Sources {
		key = overflowSource
		if s, ok := l.sources[key]; ok {
			return key, s
		}
	}
	s := &source{reads: rate.NewLimiter(rate.Limit(l.limits.PodReadsPerSecond), l.limits.PodReadBurst), lastRead: now, winStart: now}
	l.sources[key] = s
	return key, s
}

// sweep forgets the sources with nothing in flight whose bucket is full again. Called with mu
// held. The overflow source may outgrow Sources by one.
func (l *Limiter) sweep(now time.Time) {
	l.lastSweep = now
	for k, s := range l.sources {
		if s.inFlight == 0 && now.Sub(s.lastRead) >= l.refill && now.Sub(s.lastLog) >= rejectLogEvery {
			delete(l.sources, k)
		}
	}
}

// tracked is how many sources have state (for tests).
func (l *Limiter) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sources)
}
