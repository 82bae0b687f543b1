package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestNoteKarpenter: a node with Karpenter's nodepool label gets one Event naming the label; a
// node labelled only with the capacity type (a managed node group sharing selectors) gets none.
func TestNoteKarpenter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name   string
		labels map[string]string
		events int
	}{
		{"nodepool", map[string]string{"karpenter.sh/nodepool": "spot", "karpenter.sh/capacity-type": "spot"}, 1},
		{"provisioner", map[string]string{"karpenter.sh/provisioner-name": "default"}, 1},
		{"capacity-type-only", map[string]string{"karpenter.sh/capacity-type": "spot"}, 0},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: tc.labels}})
			node, err := getNode(context.Background(), kubetest.Wrap(client), "n1", clk, "check for Karpenter", nil)
			if err != nil {
				t.Fatal(err)
			}
			noteOverlaps(context.Background(), kubetest.Wrap(client), node, nil, clk)
			evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != tc.events {
				t.Fatalf("%d events, want %d", len(evs.Items), tc.events)
			}
			if tc.events == 1 {
				e := evs.Items[0]
				// The one value that leaves Karpenter's nodes to it (issue 48, item 2).
				if !strings.Contains(e.Message, "excludeNodes: [karpenter.sh/nodepool]") {
					t.Errorf("event %q does not name the chart value excludeNodes", e.Message)
				}
				if e.Reason != ReasonKarpenterManaged || e.Type != v1.EventTypeWarning || e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "n1" ||
					!strings.Contains(e.Message, "karpenter.sh/") || !e.FirstTimestamp.Time.Equal(clk.Now()) {
					t.Errorf("event %+v: want a Warning KarpenterManaged on node n1 naming the label, at the clock's time", e)
				}
			}
		})
	}
	// A node that cannot be read: getNode keeps trying until the agent stops, nothing is
	// recorded, no panic.
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := getNode(ctx, kubetest.Wrap(client), "missing", clk, "check for Karpenter", nil)
		done <- err
	}()
	waitTimer(t, clk)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("getNode after the agent stopped: %v, want the last error", err)
	}
	if evs, _ := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{}); len(evs.Items) != 0 {
		t.Errorf("%d events for a node that does not exist", len(evs.Items))
	}
}
