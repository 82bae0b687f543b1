package kubelet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// kubeletSummary serves a Summary whose node.rlimit is maxpid (absent when 0) and answers 503
// while down is set, counting the requests.
func kubeletSummary(t *testing.T, maxpid *atomic.Int64, down *atomic.Bool, hits *atomic.Int32) *SummarySource {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if down.Load() {
			http.Error(w, "kubelet restarting", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		rlimit := ""
		if m := maxpid.Load(); m > 0 {
			rlimit = `,"rlimit":{"time":"2026-12-01T23:00:00Z","maxpid":` + strconv.FormatInt(m, 10) + `,"curproc":300}`
		}
		w.Write([]byte(`{"node":{"nodeName":"n1"` + rlimit + `},"pods":[]}`))
	}))
	t.Cleanup(srv.Close)
	return &SummarySource{URL: srv.URL + "/stats/summary", Client: srv.Client()}
}

// TestKubeletMaxPID: the limit is read once and kept for Refresh; a failure keeps the last value
// and is retried after Retry, reported once per distinct message; a Summary without rlimit is a
// failure, never a limit of 0.
func TestKubeletMaxPID(t *testing.T) {
	var maxpid atomic.Int64
	var down atomic.Bool
	var hits atomic.Int32
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC))
	var reported []string
	k := &KubeletMaxPID{Source: kubeletSummary(t, &maxpid, &down, &hits), Clock: clk,
		Refresh: 5 * time.Minute, Retry: time.Minute, OnError: func(err error) { reported = append(reported, err.Error()) }}
	ctx := context.Background()
	check := func(step string, wantLimit int64, wantOK bool, wantHits int32) {
		t.Helper()
		limit, ok := k.MaxPID(ctx)
		if limit != wantLimit || ok != wantOK || hits.Load() != wantHits {
			t.Errorf("%s: MaxPID = %d, %v after %d requests; want %d, %v after %d", step, limit, ok, hits.Load(), wantLimit, wantOK, wantHits)
		}
	}
	check("no rlimit in the Summary", 0, false, 1)
	maxpid.Store(32768)
	check("within Retry of the failure", 0, false, 1)
	clk.SetTime(clk.Now().Add(time.Minute))
	check("Retry later", 32768, true, 2)
	maxpid.Store(65536)
	clk.SetTime(clk.Now().Add(4 * time.Minute))
	check("within Refresh", 32768, true, 2)
	clk.SetTime(clk.Now().Add(time.Minute))
	check("Refresh later", 65536, true, 3)
	down.Store(true)
	clk.SetTime(clk.Now().Add(5 * time.Minute))
	check("the kubelet down: the last value stands", 65536, true, 4)
	clk.SetTime(clk.Now().Add(time.Minute))
	check("still down, retried", 65536, true, 5)
	if len(reported) != 2 || !strings.Contains(reported[0], "no node.rlimit.maxpid") || !strings.Contains(reported[1], "503") {
		t.Errorf("reported %q, want the missing rlimit and the 503, once each", reported)
	}
}

// TestHostSourceMaxPID: with MaxPID's value the limit is the kubelet's, not the files'; without
// one the files decide, as before.
func TestHostSourceMaxPID(t *testing.T) {
	root := fixtureRoot(t, "cgroupv2") // pid_max 4194304, threads-max 63452, 1234 tasks
	for _, tt := range []struct {
		name   string
		maxPID func(context.Context) (int64, bool)
		want   Observation
	}{
		{"the kubelet's limit", func(context.Context) (int64, bool) { return 32768, true }, Observation{Available: 32768 - 1234, Capacity: 32768}},
		{"no limit known", func(context.Context) (int64, bool) { return 0, false }, Observation{Available: 63452 - 1234, Capacity: 63452}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := (&HostSource{Root: root, MaxPID: tt.maxPID}).Read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Node[PIDAvailable]; got != tt.want {
				t.Errorf("pid.available = %+v, want %+v", got, tt.want)
			}
		})
	}
}
