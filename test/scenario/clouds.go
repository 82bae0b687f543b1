package scenario

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
)

// GCP is the test tree's GCP metadata server preempting the VM: preempted=TRUE, which gives the
// machine 30 s from the moment the value changes.
type GCP struct{}

// Start implements Cloud.
func (GCP) Start(_ context.Context, _, _ string, delay, _ time.Duration) (*Posted, error) {
	srv := gcpmeta.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the GCP metadata server: %w", err)
	}
	var mu sync.Mutex
	var at time.Time
	timer := time.AfterFunc(delay, func() {
		mu.Lock()
		at = time.Now()
		mu.Unlock()
		srv.Set(gcpmeta.PathPreempted, "TRUE")
	})
	return &Posted{
		Args: []string{"--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://")},
		At:   func() time.Time { mu.Lock(); defer mu.Unlock(); return at },
		Stop: func() { timer.Stop(); _ = srv.Close() },
	}, nil
}

// Azure is the test tree's Scheduled Events server posting a Preempt for the node, with
// NotBefore window after the notice.
type Azure struct {
	// Server, when set, is used instead of a new one (tests that cancel or inspect approvals).
	Server *azureevents.Server
}

// Start implements Cloud. The node's name is its resource name in the document.
func (a Azure) Start(_ context.Context, node, _ string, delay, window time.Duration) (*Posted, error) {
	srv := a.Server
	if srv == nil {
		srv = azureevents.New(node)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the Scheduled Events server: %w", err)
	}
	var mu sync.Mutex
	var at time.Time
	timer := time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		at = time.Now()
		srv.AddEvent(azureevents.Event{
			EventType: azureevents.EventTypePreempt, Resources: []string{node, "other-vm"},
			NotBefore: at.Add(window).Truncate(time.Second), DurationInSeconds: -1,
			Description: "Virtual machine is being preempted.",
		})
	})
	return &Posted{
		Args: []string{"--provider=azure", "--azure-imds-endpoint=" + url, "--azure-resource-name=" + node},
		At:   func() time.Time { mu.Lock(); defer mu.Unlock(); return at },
		Stop: func() { timer.Stop(); srv.Close() },
	}, nil
}

// GCPMaintenance is the test tree's GCP metadata server announcing host maintenance for a VM
// with a GPU attached: upcoming-maintenance with its window starting window after the notice,
// and maintenance-event TERMINATE_ON_HOST_MAINTENANCE from an hour before that window (at once
// for a window within the hour), as GCE does for GPU VMs.
type GCPMaintenance struct {
	// Server, when set, is used instead of a new one.
	Server *gcpmeta.Server
}

// Start implements Cloud.
func (g GCPMaintenance) Start(_ context.Context, _, _ string, delay, window time.Duration) (*Posted, error) {
	srv := g.Server
	if srv == nil {
		srv = gcpmeta.New()
	}
	srv.Set(gcpmeta.PathOnHostMaintenance, "TERMINATE")
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the GCP metadata server: %w", err)
	}
	var mu sync.Mutex
	var at time.Time
	timer := time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		at = time.Now()
		// Whole seconds, as GCE writes window-start-time.
		srv.ScheduleGPUMaintenance(at.Add(window).Truncate(time.Second))
	})
	return &Posted{
		Args: []string{"--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://")},
		At:   func() time.Time { mu.Lock(); defer mu.Unlock(); return at },
		Stop: func() { timer.Stop(); _ = srv.Close() },
	}, nil
}
