// Package providertest provides a scripted providers.Provider for tests of the code that
// polls providers (the agent).
package providertest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/reprieve-dev/reprieve/providers"
)

// Fake is a providers.Provider whose answers the test sets. It is safe for concurrent use: a
// test may script it while the code under test polls it.
type Fake struct {
	name string

	mu      sync.Mutex
	notices []providers.Notice
	err     error
	polls   int
	// polled is closed and replaced at every poll, to wake WaitForPolls.
	polled chan struct{}
}

var _ providers.Provider = (*Fake)(nil)

// New returns a fake named name that has no notices.
func New(name string) *Fake {
	return &Fake{name: name, polled: make(chan struct{})}
}

// Name implements providers.Provider.
func (f *Fake) Name() string { return f.name }

// Set makes Poll return these notices, and no error: the cloud answers again.
func (f *Fake) Set(notices ...providers.Notice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notices = slices.Clone(notices)
	f.err = nil
}

// SetError makes Poll return err together with the notices last Set, as a real provider
// keeps its last good answer while a source fails. SetError(nil) clears the error.
func (f *Fake) SetError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Poll implements providers.Provider. It returns a copy of the scripted notices and error,
// whatever ctx says, and counts the call.
func (f *Fake) Poll(context.Context) ([]providers.Notice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	close(f.polled)
	f.polled = make(chan struct{})
	return slices.Clone(f.notices), f.err
}

// Polls returns how many times Poll was called.
func (f *Fake) Polls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polls
}

// WaitForPolls blocks until Poll has been called at least n times in all, so that a test can
// wait for the code under test to see a scripted answer without sleeping.
func (f *Fake) WaitForPolls(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		polls, polled := f.polls, f.polled
		f.mu.Unlock()
		if polls >= n {
			return nil
		}
		select {
		case <-polled:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d polls of provider %q, saw %d: %w", n, f.name, polls, ctx.Err())
		}
	}
}
