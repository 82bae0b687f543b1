package none

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// annotation stands in for the node's reprieve.io/reclaim-deadline annotation.
type annotation struct {
	value string
	set   bool
}

func (a *annotation) lookup() (string, bool) { return a.value, a.set }

func TestPoll(t *testing.T) {
	type step struct {
		set     bool // annotation present
		value   string
		want    string // deadline in RFC 3339, "" for no notice
		wantErr string // substring; "" for no error
	}
	const (
		good    = "2026-11-29T10:02:00Z"
		goodTZ  = "2026-11-29T11:02:00+01:00" // the same instant written another way
		later   = "2026-11-29T10:30:00Z"
		badDate = "tomorrow"
	)
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "annotation absent", steps: []step{{}}},
		{name: "valid deadline", steps: []step{{set: true, value: good, want: good}}},
		{name: "offset kept as the same instant", steps: []step{{set: true, value: goodTZ, want: good}}},
		{
			name: "malformed with nothing known before",
			steps: []step{
				{set: true, value: badDate, wantErr: `"tomorrow"`},
			},
		},
		{
			name: "malformed keeps the last good notice, fixing it resumes",
			steps: []step{
				{set: true, value: good, want: good},
				{set: true, value: badDate, want: good, wantErr: `"tomorrow"`},
				{set: true, value: "2026-11-29 10:30:00", want: good, wantErr: `"2026-11-29 10:30:00"`},
				{set: true, value: later, want: later},
			},
		},
		{
			name: "empty value is malformed, not absent",
			steps: []step{
				{set: true, value: good, want: good},
				{set: true, value: "", want: good, wantErr: `""`},
			},
		},
		{
			name: "removing the annotation withdraws the notice",
			steps: []step{
				{set: true, value: good, want: good},
				{},
			},
		},
		{
			name: "removing it after a malformed value withdraws too",
			steps: []step{
				{set: true, value: good, want: good},
				{set: true, value: badDate, want: good, wantErr: "tomorrow"},
				{},
				{set: true, value: badDate, wantErr: "tomorrow"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &annotation{}
			p := New(a.lookup)
			for i, s := range tc.steps {
				a.value, a.set = s.value, s.set
				ns, err := p.Poll(context.Background())
				switch {
				case s.wantErr == "" && err != nil:
					t.Fatalf("step %d: unexpected error: %v", i, err)
				case s.wantErr != "" && err == nil:
					t.Fatalf("step %d: got no error, want one quoting %s", i, s.wantErr)
				case err != nil:
					for _, want := range []string{s.wantErr, "reprieve.io/reclaim-deadline", "RFC 3339"} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("step %d: error %q does not contain %q", i, err, want)
						}
					}
				}
				if s.want == "" {
					if len(ns) != 0 {
						t.Errorf("step %d: got %+v, want no notice", i, ns)
					}
					continue
				}
				if len(ns) != 1 {
					t.Fatalf("step %d: got %d notices, want 1: %+v", i, len(ns), ns)
				}
				n := ns[0]
				want, _ := time.Parse(time.RFC3339, s.want)
				if !n.Deadline.Equal(want) {
					t.Errorf("step %d: deadline %v, want %v", i, n.Deadline, want)
				}
				if n.Provider != Name || n.Kind != providers.KindSpotInterruption || n.ID == "" || !n.Interrupts() {
					t.Errorf("step %d: notice %+v: want an interrupting %s notice from %q with an ID", i, n, providers.KindSpotInterruption, Name)
				}
			}
		})
	}
}

func TestNoticeID(t *testing.T) {
	a := &annotation{value: "2026-11-29T10:02:00Z", set: true}
	p := New(a.lookup)
	id := func() string {
		t.Helper()
		ns, err := p.Poll(context.Background())
		if err != nil || len(ns) != 1 {
			t.Fatalf("Poll: %v, %v", ns, err)
		}
		return ns[0].ID
	}
	first := id()
	if again := id(); again != first {
		t.Errorf("same annotation gave IDs %q then %q", first, again)
	}
	restarted, err := New(a.lookup).Poll(context.Background())
	if err != nil || len(restarted) != 1 || restarted[0].ID != first {
		t.Errorf("a new provider (an agent restart) gave %+v, %v; want ID %q", restarted, err, first)
	}
	a.value = "2026-11-29T10:30:00Z"
	if moved := id(); moved == first {
		t.Errorf("a new deadline kept ID %q: the agent would not see a new notice", moved)
	}
}

// TestPollReturnsACopy: what a caller does with the notices it got must not change what a
// later failed poll reports.
func TestPollReturnsACopy(t *testing.T) {
	a := &annotation{value: "2026-11-29T10:02:00Z", set: true}
	p := New(a.lookup)
	ns, err := p.Poll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ns[0].Deadline = time.Time{}
	a.value = "garbage"
	kept, err := p.Poll(context.Background())
	if err == nil || len(kept) != 1 || kept[0].Deadline.IsZero() {
		t.Errorf("after editing the first result, a failed poll returned %+v, %v", kept, err)
	}
}

func TestName(t *testing.T) {
	var p providers.Provider = New(func() (string, bool) { return "", false })
	if p.Name() != "none" {
		t.Errorf("Name() = %q", p.Name())
	}
}

var _ providers.SourceReporter = (*Provider)(nil)

// TestSource: the annotation is the one source, always answered: the node object says whether
// it is there, so its absence is a positive "none".
func TestSource(t *testing.T) {
	a := &annotation{}
	p := New(a.lookup)
	if got := p.Answered(); len(got) != 1 || !got[SourceAnnotation] {
		t.Errorf("Answered() = %v, want {%s: true}", got, SourceAnnotation)
	}
	a.value, a.set = "2026-11-29T10:02:00Z", true
	ns, err := p.Poll(context.Background())
	if err != nil || len(ns) != 1 {
		t.Fatalf("Poll = %v, %v", ns, err)
	}
	if ns[0].Source != SourceAnnotation || ns[0].FromFirstSeen {
		t.Errorf("notice Source %q, FromFirstSeen %v; want %q, false", ns[0].Source, ns[0].FromFirstSeen, SourceAnnotation)
	}
}
