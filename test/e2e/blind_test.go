package e2e

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestAgentBlindIsNotReady (issue 35 item 4): an agent whose metadata service never answers (a
// listener that accepts and says nothing, as IMDS behind a hop limit of 1 or a NetworkPolicy's
// dropped packets look) is never Ready: /readyz names the silent sources from the start, and
// once --metadata-stale-after has passed the node carries a MetadataUnanswered Warning event
// and the metrics say it. The real agent binary against the real API server.
func TestAgentBlindIsNotReady(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "blind", "blind-node"
	setupNode(ctx, t, ns, node, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 64)
	go func() { // accept and never answer; the connections close with the test
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case held <- c:
			default:
				_ = c.Close()
			}
		}
	}()
	defer func() {
		for len(held) > 0 {
			_ = (<-held).Close()
		}
	}()
	const bound = 30 * time.Second
	start := time.Now()
	p, addr, err := scenario.StartReprieveBlind(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=aws",
		"--aws-imds-endpoint=http://"+ln.Addr().String(), "--metadata-stale-after="+bound.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	var evs []string
	// Up to the bound and one sight check (10 s) past it, with room for a loaded machine.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, bound+40*time.Second, true, func(context.Context) (bool, error) {
		evs = nodeEvents(ctx, t, node, events.ReasonMetadataUnanswered)
		return len(evs) > 0, nil
	}); err != nil {
		t.Fatalf("no MetadataUnanswered event %s after the start: %v", time.Since(start).Round(time.Second), err)
	}
	took := time.Since(start)
	if took < bound {
		t.Errorf("MetadataUnanswered %s after the start, before --metadata-stale-after (%s)", took.Round(time.Second), bound)
	}
	// The sight check looks every 10 s; on a loaded machine the event's write may trail it.
	if took > bound+30*time.Second {
		t.Errorf("MetadataUnanswered %s after the start; want it within the bound (%s), the check's interval (10 s) and 20 s of slack", took.Round(time.Second), bound)
	}
	if !strings.Contains(evs[0], "spot/instance-action (no answer since start)") {
		t.Errorf("MetadataUnanswered %q: want the silent sources named", evs[0])
	}
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if v := sumMetric(text, "reprieve_ready"); v != 0 {
		t.Errorf("reprieve_ready %v, want 0", v)
	}
	if v := sumMetric(text, `reprieve_metadata_sources_stale{provider="aws"}`); v != 3 {
		t.Errorf("reprieve_metadata_sources_stale %v, want 3 (the three IMDS paths)", v)
	}
	t.Logf("blind agent: not Ready from its start, MetadataUnanswered %s after it (bound %s)", took.Round(100*time.Millisecond), bound)
}
