package scenario

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// PressureTimelines are the measured timelines of the real node's pressure test
// (test/realnode), one per signal, as test/bench draws them (-realnode-chart). They are written
// as JSON when REPRIEVE_REALNODE_FIGURES names a folder.
type PressureTimelines struct {
	// Measured is when the test ran (RFC 3339), Machine what it ran on.
	Measured string `json:"measured"`
	Machine  string `json:"machine"`
	// Signals are in the order the test ran them.
	Signals []PressureSignal `json:"signals"`
}

// PressureSignal is one signal's pair of runs.
type PressureSignal struct {
	// Signal is the kubelet's name, e.g. memory.available; Unit what Available counts (MiB).
	Signal string `json:"signal"`
	// Case names the scenario when several share a signal ("a DaemonSet's leaking pod"), ""
	// for the plain one; Threshold is the kind of the kubelet's threshold the runs measure
	// against: "soft" (evictionSoft), or "" for hard (evictionHard).
	Case      string `json:"case,omitempty"`
	Threshold string `json:"threshold,omitempty"`
	// OwnAboveMiB is how far above the kubelet's threshold reprieve's threshold was set.
	OwnAboveMiB float64 `json:"ownAboveMiB"`
	// Runs: with reprieve first, then without.
	Runs []PressureRun `json:"runs"`
}

// PressureRun is one run: the host's reading of the signal over time and the moments seen.
type PressureRun struct {
	// Name is "with reprieve" or "without reprieve"; EvictedBy says who evicted the hog.
	Name      string `json:"name"`
	EvictedBy string `json:"evictedBy"`
	// HardMiB is the kubelet's threshold of the run (hard, or soft per the signal's Threshold),
	// in MiB.
	HardMiB float64 `json:"hardMiB"`
	// Samples are the host's readings, in seconds from the hog's start.
	Samples []PressureSample `json:"samples"`
	// Moments are what happened, in seconds from the hog's start.
	Moments []PressureMoment `json:"moments"`
}

// PressureSample is the signal's available amount, in MiB, at a moment.
type PressureSample struct {
	At           float64 `json:"at"`
	AvailableMiB float64 `json:"availableMiB"`
}

// PressureMoment is one named moment of a run.
type PressureMoment struct {
	What string  `json:"what"`
	At   float64 `json:"at"`
}

// ReadPressureTimelines reads and checks a file written by WritePressureTimelines.
func ReadPressureTimelines(path string) (*PressureTimelines, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the pressure timelines: %w", err)
	}
	var tl PressureTimelines
	if err := json.Unmarshal(b, &tl); err != nil {
		return nil, fmt.Errorf("reading the pressure timelines %s: %w", path, err)
	}
	if len(tl.Signals) == 0 {
		return nil, fmt.Errorf("reading the pressure timelines %s: no signals", path)
	}
	var errs []error
	for _, s := range tl.Signals {
		if s.Signal == "" || len(s.Runs) == 0 {
			errs = append(errs, fmt.Errorf("a signal %q with %d runs", s.Signal, len(s.Runs)))
		}
		for _, r := range s.Runs {
			if len(r.Samples) == 0 {
				errs = append(errs, fmt.Errorf("%s, %s: no samples", s.Signal, r.Name))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("reading the pressure timelines %s: %w", path, err)
	}
	return &tl, nil
}

// WritePressureTimelines writes tl as indented JSON.
func WritePressureTimelines(path string, tl *PressureTimelines) error {
	b, err := json.MarshalIndent(tl, "", " ")
	if err != nil {
		return fmt.Errorf("writing the pressure timelines: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the pressure timelines: %w", err)
	}
	return nil
}
