package providertest

import (
	"maps"
	"sync"

	"github.com/reprieve-dev/reprieve/providers"
)

// SourcesFake is a Fake that also says which of its sources have answered
// (providers.SourceReporter), for tests of a partial answer: one source answering while another
// fails or has not answered yet. A plain Fake does not implement SourceReporter, so code under
// test treats it as one source.
type SourcesFake struct {
	*Fake

	mu       sync.Mutex
	answered map[string]bool
}

var _ providers.SourceReporter = (*SourcesFake)(nil)

// NewWithSources returns a fake named name with the given sources, none of them answered yet.
func NewWithSources(name string, sources ...string) *SourcesFake {
	f := &SourcesFake{Fake: New(name), answered: map[string]bool{}}
	for _, s := range sources {
		f.answered[s] = false
	}
	return f
}

// SetAnswered says whether source has answered; a source not given to NewWithSources is added.
func (f *SourcesFake) SetAnswered(source string, answered bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answered[source] = answered
}

// Answered implements providers.SourceReporter. It returns a copy.
func (f *SourcesFake) Answered() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.answered)
}
