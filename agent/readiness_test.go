package agent

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers/providertest"
)

// slowProvider is a provider whose first call to the metadata service is still outstanding, as
// Azure's may be for two minutes while the platform enables Scheduled Events.
type slowProvider struct {
	*providertest.Fake
	err error
}

func (p *slowProvider) Ready() error { return p.err }

// TestProviderReadiness: the agent is not Ready while its provider says it is not
// (providers.Readiness), whatever its own state, and the reason is the provider's.
func TestProviderReadiness(t *testing.T) {
	h := newHarness(t, nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	slow := &slowProvider{Fake: h.prov, err: errors.New("azure: the first Scheduled Events call is still outstanding")}
	h.build(slow)
	h.a.ready.Store(true)
	if h.a.Ready() {
		t.Error("Ready while the provider's first call is outstanding")
	}
	if why := h.a.notReady(); why != slow.err.Error() {
		t.Errorf("notReady() = %q, want the provider's reason", why)
	}
	slow.err = nil
	if !h.a.Ready() {
		t.Errorf("not Ready once the provider is: %q", h.a.notReady())
	}
	h.a.ready.Store(false)
	if h.a.Ready() {
		t.Error("Ready before the agent's own caches and first poll")
	}
}
