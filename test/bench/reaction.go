package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
)

// reactionRun is the reaction time of one cloud: notice visible at the metadata endpoint to the
// taint on the node, as a watch on the node delivered it.
type reactionRun struct {
	Cloud, How string
	Poll       time.Duration
	Samples    []time.Duration
}

func (b *bench) reaction(ctx context.Context, rep *report) error {
	aws, err := b.reactionAWS(ctx)
	if err != nil {
		return err
	}
	gcp, err := b.reactionGCP(ctx)
	if err != nil {
		return err
	}
	rep.Reaction = []*reactionRun{aws, gcp}
	return nil
}

// notices posts Notices notices one after the other: post makes one visible and returns when,
// withdraw takes it back. Between notices it waits a random part of a second, so that the
// notices fall at every phase of a polling agent's interval.
func (b *bench) notices(ctx context.Context, node string, post func() time.Time, withdraw func()) ([]time.Duration, error) {
	tw, err := watchTaint(ctx, b.env.Client, node)
	if err != nil {
		return nil, err
	}
	defer tw.Stop()
	rng := rand.New(rand.NewPCG(7, 11))
	var out []time.Duration
	for i := 0; i < b.o.Notices; i++ {
		if err := sleepUntil(ctx, time.Now().Add(time.Duration(rng.Int64N(int64(time.Second))))); err != nil {
			return nil, err
		}
		tw.Drain()
		at := post()
		ch, err := tw.Next(ctx, true, 10*time.Second)
		if err != nil {
			return nil, fmt.Errorf("notice %d: %w", i+1, err)
		}
		out = append(out, ch.At.Sub(at))
		withdraw()
		if _, err := tw.Next(ctx, false, 10*time.Second); err != nil {
			return nil, fmt.Errorf("withdrawing notice %d: %w", i+1, err)
		}
	}
	return out, nil
}

func (b *bench) reactionAWS(ctx context.Context) (*reactionRun, error) {
	node := b.name("react-aws")
	if _, err := b.nodeWithPods(ctx, node, node, nil); err != nil {
		return nil, err
	}
	fake, err := startIMDSFake()
	if err != nil {
		return nil, err
	}
	defer fake.Close()
	p, _, err := b.startAgent(ctx, node, "--provider=aws", "--aws-imds-endpoint="+fake.URL, "--poll-interval=1s")
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Stop() }()
	samples, err := b.notices(ctx, node, func() time.Time {
		return fake.Post(time.Now().Add(2 * time.Minute))
	}, fake.Withdraw)
	if err != nil {
		return nil, fmt.Errorf("AWS: %w\n%s", err, p.LogTail(20))
	}
	return &reactionRun{Cloud: "AWS", How: "IMDSv2 polled every 1 s (the benchmark's IMDS fake)", Poll: time.Second, Samples: samples}, nil
}

func (b *bench) reactionGCP(ctx context.Context) (*reactionRun, error) {
	node := b.name("react-gcp")
	if _, err := b.nodeWithPods(ctx, node, node, nil); err != nil {
		return nil, err
	}
	srv := gcpmeta.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the GCP metadata server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	p, _, err := b.startAgent(ctx, node, "--provider=gcp", "--gcp-metadata-endpoint="+strings.TrimPrefix(url, "http://"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Stop() }()
	// Let the agent's first hanging GETs arrive before the first notice.
	if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
		return nil, err
	}
	samples, err := b.notices(ctx, node, func() time.Time {
		at := time.Now()
		srv.Set(gcpmeta.PathPreempted, "TRUE")
		return at
	}, func() { srv.Set(gcpmeta.PathPreempted, "FALSE") })
	if err != nil {
		return nil, fmt.Errorf("GCP: %w\n%s", err, p.LogTail(20))
	}
	return &reactionRun{Cloud: "GCP", How: "hanging GET on instance/preempted (test/fakes/gcpmeta)", Samples: samples}, nil
}
