// Package none is the provider for machines without a cloud to watch: the reclaim deadline is
// whatever an operator (or another tool) writes into the node annotation
// reprieve.io/reclaim-deadline, and removing the annotation withdraws it.
package none

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// Name is the provider's flag value.
const Name = "none"

// SourceAnnotation is the provider's one source, as Notice.Source and in Answered: the node
// annotation, which the informer always has an answer for.
const SourceAnnotation = "annotation"

// Provider reads the deadline from a node annotation through lookup. It is used by one poller
// at a time.
type Provider struct {
	lookup func() (value string, ok bool)
	last   []providers.Notice
}

// New returns a provider that calls lookup for the annotation's current value.
func New(lookup func() (string, bool)) *Provider { return &Provider{lookup: lookup} }

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Answered implements providers.SourceReporter: the annotation is always answered, its absence
// is a positive "none" (the node object says so), and a value that does not parse is an error
// that keeps the last notice.
func (p *Provider) Answered() map[string]bool { return map[string]bool{SourceAnnotation: true} }

// Poll returns one interruption notice while the annotation holds an RFC 3339 time. A value
// that does not parse is an error (the caller keeps its previous state), not a withdrawal.
func (p *Provider) Poll(context.Context) ([]providers.Notice, error) {
	v, ok := p.lookup()
	if !ok {
		p.last = nil
		return nil, nil
	}
	d, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return slices.Clone(p.last), fmt.Errorf("parsing node annotation reprieve.io/reclaim-deadline %q: want RFC 3339 (2006-01-02T15:04:05Z): %w", v, err)
	}
	p.last = []providers.Notice{{
		Provider:    Name,
		Kind:        providers.KindSpotInterruption,
		ID:          providers.HashID(Name, v),
		Deadline:    d,
		Action:      "terminate",
		Description: "reclaim deadline set on the node annotation",
		Source:      SourceAnnotation,
	}}
	// A copy, so that a caller that sorts or edits what it got cannot change what the next
	// failed poll reports.
	return slices.Clone(p.last), nil
}
