package gcpmeta

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/url"
	"testing"
	"time"
)

func start(t *testing.T) (*Server, string) {
	t.Helper()
	s := New()
	base, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, base
}

type answer struct {
	status int
	body   string
	etag   string
	flavor string
	err    error
}

func get(ctx context.Context, base, path string, q url.Values, flavor bool) answer {
	return getWith(ctx, http.DefaultClient, base, path, q, flavor)
}

func getWith(ctx context.Context, c *http.Client, base, path string, q url.Values, flavor bool) answer {
	u := base + Prefix + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return answer{err: err}
	}
	if flavor {
		req.Header.Set("Metadata-Flavor", "Google")
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), etag: resp.Header.Get("ETag"), flavor: resp.Header.Get("Metadata-Flavor"), err: err}
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestValuesAndFlavor(t *testing.T) {
	s, base := start(t)
	ctx := context.Background()
	tests := []struct {
		name, path string
		flavor     bool
		status     int
		body       string
	}{
		{"preempted", PathPreempted, true, 200, "FALSE"},
		{"maintenance event", PathMaintenanceEvent, true, 200, "NONE"},
		{"zone", PathZone, true, 200, "projects/123456789012/zones/europe-west1-b"},
		{"project", PathProjectID, true, 200, "reprieve-test"},
		{"scheduling absent by default", PathPreemptible, true, 404, ""},
		{"provisioning model absent by default", PathProvisioningModel, true, 404, ""},
		{"no Metadata-Flavor", PathPreempted, false, 403, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := get(ctx, base, tc.path, nil, tc.flavor)
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.status != tc.status || (tc.status == 200 && a.body != tc.body) {
				t.Errorf("got %d %q, want %d %q", a.status, a.body, tc.status, tc.body)
			}
			if a.flavor != "Google" {
				t.Errorf("response Metadata-Flavor %q, want Google", a.flavor)
			}
			if (a.status == 200) != (a.etag != "") {
				t.Errorf("status %d with ETag %q", a.status, a.etag)
			}
		})
	}
	s.Set(PathProvisioningModel, "SPOT")
	if a := get(ctx, base, PathProvisioningModel, nil, true); a.status != 200 || a.body != "SPOT" {
		t.Errorf("after Set: got %d %q", a.status, a.body)
	}
	if got := s.Count(PathPreempted); got != 2 {
		t.Errorf("Count(preempted) = %d, want 2", got)
	}
	var refused int
	for _, r := range s.Requests() {
		if r.Status == http.StatusForbidden && r.Flavor == "" {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("request log has %d refused requests without flavor, want 1", refused)
	}
}

func TestHangingGet(t *testing.T) {
	s, base := start(t)
	ctx := context.Background()
	first := get(ctx, base, PathPreempted, nil, true)

	t.Run("other etag answers at once", func(t *testing.T) {
		a := get(ctx, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {"0000000000000000"}}, true)
		if a.status != 200 || a.body != "FALSE" || a.etag != first.etag {
			t.Errorf("got %+v", a)
		}
	})
	t.Run("same etag waits for the change", func(t *testing.T) {
		done := make(chan answer, 1)
		go func() {
			done <- get(ctx, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {first.etag}, "timeout_sec": {"60"}}, true)
		}()
		waitUntil(t, 5*time.Second, "the hanging GET to be held", func() bool { return s.Waiting(PathPreempted) == 1 })
		s.Set(PathMaintenanceEvent, "NONE") // another path: must not answer this one
		s.Set(PathPreempted, "TRUE")
		select {
		case a := <-done:
			if a.status != 200 || a.body != "TRUE" || a.etag == first.etag {
				t.Errorf("got %+v", a)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("hanging GET not answered after Set")
		}
	})
	t.Run("timeout returns the unchanged value", func(t *testing.T) {
		cur := get(ctx, base, PathMaintenanceEvent, nil, true)
		start := time.Now()
		a := get(ctx, base, PathMaintenanceEvent, url.Values{"wait_for_change": {"true"}, "last_etag": {cur.etag}, "timeout_sec": {"1"}}, true)
		if a.status != 200 || a.body != "NONE" || a.etag != cur.etag {
			t.Errorf("got %+v", a)
		}
		if el := time.Since(start); el < 900*time.Millisecond || el > 5*time.Second {
			t.Errorf("answered after %v, want about 1s", el)
		}
	})
	t.Run("same value set again bumps the etag", func(t *testing.T) {
		before := get(ctx, base, PathPreempted, nil, true)
		s.Set(PathPreempted, before.body)
		if after := get(ctx, base, PathPreempted, nil, true); after.etag == before.etag {
			t.Errorf("etag %q unchanged", after.etag)
		}
	})
	t.Run("ignoring wait_for_change answers at once", func(t *testing.T) {
		s.SetIgnoreWaitForChange(true)
		defer s.SetIgnoreWaitForChange(false)
		cur := get(ctx, base, PathPreempted, nil, true)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if a := get(cctx, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {cur.etag}}, true); a.status != 200 {
			t.Errorf("got %+v", a)
		}
	})
	t.Run("bad parameters", func(t *testing.T) {
		if a := get(ctx, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "timeout_sec": {"0"}}, true); a.status != 400 {
			t.Errorf("timeout_sec=0: got %d", a.status)
		}
	})
}

func TestFaults(t *testing.T) {
	s, base := start(t)
	ctx := context.Background()

	s.SetError(PathPreempted, http.StatusServiceUnavailable, 2)
	for i, want := range []int{503, 503, 200} {
		if a := get(ctx, base, PathPreempted, nil, true); a.status != want {
			t.Errorf("request %d: got %d, want %d", i, a.status, want)
		}
	}

	cur := get(ctx, base, PathPreempted, nil, true)
	done := make(chan answer, 1)
	// A fresh connection: net/http silently replays a GET whose reused connection fails.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		done <- getWith(ctx, fresh, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {cur.etag}}, true)
	}()
	waitUntil(t, 5*time.Second, "the hanging GET to be held", func() bool { return s.Waiting(PathPreempted) == 1 })
	s.DropConnections()
	select {
	case a := <-done:
		if a.err == nil {
			t.Errorf("dropped hanging GET got an answer: %+v", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hanging GET not cut")
	}
	waitUntil(t, 5*time.Second, "the dropped GET to be released", func() bool { return s.Waiting(PathPreempted) == 0 })

	s.SetOffline(true)
	if a := get(ctx, base, PathPreempted, nil, true); a.err == nil {
		t.Errorf("offline server answered: %+v", a)
	}
	s.Set(PathPreempted, "TRUE")
	s.SetOffline(false)
	if a := get(ctx, base, PathPreempted, nil, true); a.status != 200 || a.body != "TRUE" {
		t.Errorf("back online: got %+v", a)
	}
}

func TestStartLoopbackOnly(t *testing.T) {
	s := New()
	defer s.Close()
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0"} {
		if _, err := s.Start(addr); err == nil {
			t.Errorf("Start(%q) accepted a non-loopback address", addr)
		}
	}
	if _, err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start accepted")
	}
}

func TestCloseEndsHangingGets(t *testing.T) {
	s, base := start(t)
	cur := get(context.Background(), base, PathPreempted, nil, true)
	done := make(chan answer, 1)
	go func() {
		done <- get(context.Background(), base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {cur.etag}}, true)
	}()
	waitUntil(t, 5*time.Second, "the hanging GET to be held", func() bool { return s.Waiting(PathPreempted) == 1 })
	s.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close left a hanging GET open")
	}
}

func TestProvisioningModelKeyIsHyphenated(t *testing.T) {
	if PathProvisioningModel != "instance/scheduling/provisioning-model" {
		t.Errorf("PathProvisioningModel = %q: GCE spells every key with hyphens", PathProvisioningModel)
	}
	s, base := start(t)
	s.Set(PathProvisioningModel, "SPOT")
	if a := get(context.Background(), base, "instance/scheduling/provisioning_model", nil, true); a.status != http.StatusNotFound {
		t.Errorf("the underscore spelling answered %d %q, want 404 as GCE", a.status, a.body)
	}
}

func TestUpcomingMaintenanceDirectory(t *testing.T) {
	s, base := start(t)
	ctx := context.Background()
	rec := url.Values{"recursive": {"true"}}
	if a := get(ctx, base, PathUpcomingMaintenance, rec, true); a.status != http.StatusNotFound {
		t.Fatalf("no maintenance: got %d %q, want 404", a.status, a.body)
	}
	start := time.Date(2026, 12, 24, 9, 0, 0, 0, time.UTC)
	s.SetUpcomingMaintenance(UpcomingMaintenance{Status: "PENDING", Type: "SCHEDULED", WindowStart: start, WindowEnd: start.Add(4 * time.Hour), CanReschedule: true})
	a := get(ctx, base, PathUpcomingMaintenance, rec, true)
	if a.status != http.StatusOK || a.etag == "" {
		t.Fatalf("got %d %q (ETag %q), want 200 with an ETag", a.status, a.body, a.etag)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(a.body), &got); err != nil {
		t.Fatalf("answer %q is not a JSON object: %v", a.body, err)
	}
	want := map[string]string{"maintenanceStatus": "PENDING", "type": "SCHEDULED", "windowStartTime": "2026-12-24T09:00:00Z",
		"windowEndTime": "2026-12-24T13:00:00Z", "canReschedule": "true"}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if v := get(ctx, base, PathUpcomingMaintenance+"window-start-time", nil, true); v.body != "2026-12-24T09:00:00Z" {
		t.Errorf("single key: got %d %q", v.status, v.body)
	}
	s.ClearUpcomingMaintenance()
	if a := get(ctx, base, PathUpcomingMaintenance, rec, true); a.status != http.StatusNotFound {
		t.Errorf("after Clear: got %d %q, want 404", a.status, a.body)
	}
}

func TestScheduleGPUMaintenance(t *testing.T) {
	s, _ := start(t)
	// An hour and a bit ahead: only the window is published.
	s.ScheduleGPUMaintenance(time.Now().Add(GPUMaintenanceNotice + time.Hour))
	if v, _ := s.Get(PathMaintenanceEvent); v != "NONE" {
		t.Errorf("maintenance-event %q more than an hour ahead, want NONE", v)
	}
	if v, _ := s.Get(PathOnHostMaintenance); v != "TERMINATE" {
		t.Errorf("on-host-maintenance %q, want TERMINATE for a GPU VM", v)
	}
	// Within the hour: the value is there at once.
	s2, _ := start(t)
	s2.ScheduleGPUMaintenance(time.Now().Add(GPUMaintenanceNotice - time.Minute))
	if v, _ := s2.Get(PathMaintenanceEvent); v != "TERMINATE_ON_HOST_MAINTENANCE" {
		t.Errorf("maintenance-event %q within the hour, want TERMINATE_ON_HOST_MAINTENANCE", v)
	}
	if v, _ := s2.Get(PathUpcomingMaintenance + "maintenance-status"); v != "PENDING" {
		t.Errorf("maintenance-status %q before the window, want PENDING", v)
	}
}

func TestStall(t *testing.T) {
	s, base := start(t)
	first := get(context.Background(), base, PathPreempted, nil, true)
	held := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		held <- get(ctx, base, PathPreempted, url.Values{"wait_for_change": {"true"}, "last_etag": {first.etag}, "timeout_sec": {"1"}}, true)
	}()
	waitUntil(t, 2*time.Second, "the hanging GET", func() bool { return s.Waiting(PathPreempted) == 1 })
	s.StallHeld()
	s.Set(PathPreempted, "TRUE")
	a := <-held
	// Neither the change nor timeout_sec=1 answered it: the client's own 2 s deadline ended it,
	// and the connection was not reset (a reset gives another error).
	if a.err == nil || !errors.Is(a.err, context.DeadlineExceeded) {
		t.Errorf("stalled hanging GET: got %+v, want the client's deadline", a)
	}
	// New requests are served.
	if a := get(context.Background(), base, PathPreempted, nil, true); a.body != "TRUE" {
		t.Errorf("after the stall: got %d %q", a.status, a.body)
	}

	s.SetStall(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if a := get(ctx, base, PathPreempted, nil, true); !errors.Is(a.err, context.DeadlineExceeded) {
		t.Errorf("while stalled: got %+v, want no answer", a)
	}
	s.SetStall(false)
	if a := get(context.Background(), base, PathPreempted, nil, true); a.status != http.StatusOK {
		t.Errorf("after SetStall(false): got %d", a.status)
	}
}

// TestStopForMaintenance: an ordinary VM stops its notice after maintenance-event flips, a
// GPU VM its (scaled) hour ("Handling GPU host maintenance events").
func TestStopForMaintenance(t *testing.T) {
	for _, tc := range []struct {
		machine string
		want    time.Duration
	}{{OrdinaryMachineType, 100 * time.Millisecond}, {GPUMachineType, 300 * time.Millisecond}} {
		s := New()
		s.SetMachineType(tc.machine)
		stopped := make(chan time.Time, 1)
		start := time.Now()
		stop := s.StopForMaintenance(300*time.Millisecond, 100*time.Millisecond, func() { stopped <- time.Now() })
		if v, _ := s.Get(PathMaintenanceEvent); v != "TERMINATE_ON_HOST_MAINTENANCE" {
			t.Errorf("%s: maintenance-event %q, want TERMINATE_ON_HOST_MAINTENANCE at once", tc.machine, v)
		}
		if d := stop.Sub(start); d < tc.want || d > tc.want+50*time.Millisecond {
			t.Errorf("%s: stop %v after the value flipped, want %v", tc.machine, d, tc.want)
		}
		if at := <-stopped; at.Before(stop) {
			t.Errorf("%s: stopped at %v, before its stop %v", tc.machine, at, stop)
		}
		s.Close()
	}
	// Unscaled, GCE's figures.
	s := New()
	defer s.Close()
	if d := time.Until(s.StopForMaintenance(0, 0, nil)); d < 59*time.Second || d > VMMaintenanceNotice {
		t.Errorf("ordinary VM: stop in %v, want 60 s", d)
	}
}

// TestPreempt: preempted turns TRUE at once, the soft-off comes the notice later, the power-off
// 30 s after the soft-off.
func TestPreempt(t *testing.T) {
	s := New()
	defer s.Close()
	softCh := make(chan time.Time, 1)
	start := time.Now()
	soft, power := s.Preempt(100*time.Millisecond, func() { softCh <- time.Now() }, nil)
	if v, _ := s.Get(PathPreempted); v != "TRUE" {
		t.Errorf("preempted %q, want TRUE at once", v)
	}
	if d := soft.Sub(start); d < 100*time.Millisecond || d > 150*time.Millisecond {
		t.Errorf("soft-off %v after preempted=TRUE, want the notice", d)
	}
	if d := power.Sub(soft); d != PreemptionGrace {
		t.Errorf("power-off %v after the soft-off, want %v", d, PreemptionGrace)
	}
	if at := <-softCh; at.Before(soft) {
		t.Errorf("soft-off ran at %v, before %v", at, soft)
	}
}
