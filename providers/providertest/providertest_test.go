package providertest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

func TestFake(t *testing.T) {
	ctx := context.Background()
	spot := providers.Notice{Provider: "fake", Kind: providers.KindSpotInterruption, ID: "a",
		Deadline: time.Date(2026, 11, 29, 10, 2, 0, 0, time.UTC)}
	rebalance := providers.Notice{Provider: "fake", Kind: providers.KindRebalanceRecommendation, ID: "b"}
	boom := errors.New("metadata service down")

	f := New("fake")
	if f.Name() != "fake" {
		t.Errorf("Name() = %q", f.Name())
	}
	steps := []struct {
		name    string
		do      func()
		wantIDs []string
		wantErr error
	}{
		{name: "nothing set", do: func() {}},
		{name: "set", do: func() { f.Set(spot, rebalance) }, wantIDs: []string{"a", "b"}},
		{name: "error keeps the last notices", do: func() { f.SetError(boom) }, wantIDs: []string{"a", "b"}, wantErr: boom},
		{name: "set clears the error", do: func() { f.Set(spot) }, wantIDs: []string{"a"}},
		{name: "error with nothing set", do: func() { f.Set(); f.SetError(boom) }, wantErr: boom},
		{name: "SetError(nil) clears it", do: func() { f.SetError(nil) }},
	}
	for i, s := range steps {
		s.do()
		ns, err := f.Poll(ctx)
		if !errors.Is(err, s.wantErr) || (s.wantErr == nil) != (err == nil) {
			t.Errorf("%s: error %v, want %v", s.name, err, s.wantErr)
		}
		var ids []string
		for _, n := range ns {
			ids = append(ids, n.ID)
		}
		if !slices.Equal(ids, s.wantIDs) {
			t.Errorf("%s: got IDs %v, want %v", s.name, ids, s.wantIDs)
		}
		if got := f.Polls(); got != i+1 {
			t.Errorf("%s: Polls() = %d, want %d", s.name, got, i+1)
		}
	}

	// What the caller gets is its own copy.
	f.Set(spot)
	ns, _ := f.Poll(ctx)
	ns[0].ID = "edited"
	if again, _ := f.Poll(ctx); again[0].ID != "a" {
		t.Errorf("editing a result changed the fake: got ID %q", again[0].ID)
	}
}

func TestFakeConcurrentUse(t *testing.T) {
	f := New("fake")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	const pollers, each = 4, 50
	var wg sync.WaitGroup
	for range pollers {
		wg.Go(func() {
			for range each {
				if _, err := f.Poll(ctx); err != nil && err.Error() != "flaky" {
					t.Errorf("unexpected error %v", err)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range each {
			f.Set(providers.Notice{ID: "n"})
			if i%2 == 0 {
				f.SetError(errors.New("flaky"))
			}
		}
	})
	if err := f.WaitForPolls(ctx, pollers*each); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := f.Polls(); got != pollers*each {
		t.Errorf("Polls() = %d, want %d", got, pollers*each)
	}
}

func TestWaitForPollsHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := New("fake").WaitForPolls(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForPolls on a cancelled context: %v", err)
	}
}

func TestSourcesFake(t *testing.T) {
	f := NewWithSources("aws", "spot/instance-action", "events/recommendations/rebalance")
	want := map[string]bool{"spot/instance-action": false, "events/recommendations/rebalance": false}
	if got := f.Answered(); !maps.Equal(got, want) {
		t.Errorf("Answered() = %v, want %v", got, want)
	}
	f.SetAnswered("events/recommendations/rebalance", true)
	got := f.Answered()
	want["events/recommendations/rebalance"] = true
	if !maps.Equal(got, want) {
		t.Errorf("after SetAnswered: %v, want %v", got, want)
	}
	got["spot/instance-action"] = true
	if f.Answered()["spot/instance-action"] {
		t.Error("Answered returned the fake's own map")
	}
	var p providers.Provider = f
	if _, ok := p.(providers.SourceReporter); !ok {
		t.Error("SourcesFake is no SourceReporter")
	}
	if _, ok := any(New("x")).(providers.SourceReporter); ok {
		t.Error("a plain Fake is a SourceReporter: code under test would see sources it was not given")
	}
}
