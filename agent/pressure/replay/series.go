// Package replay runs recorded and synthetic node series through reprieve's real pressure loop
// (pressure.Loop: its observation, its decision and the evict.Executor, on a fake clock) and
// scores what it did against what the kubelet did on the same series without reprieve (issue
// 47): the evictions the kubelet would not make, the kubelet's evictions reprieve made first
// with the pod's whole grace, the grace it cut, and how long it tainted a node the kubelet left
// alone.
//
// A series is what the pressure source read every interval (the node's signals and each pod's
// usage), the node's pods, the kubelet's configuration and reprieve's thresholds, and its label:
// whom the kubelet evicted and when, or nobody. The real series in testdata were recorded on
// the real node of test/realnode (TestRecordPressureSeries), each run once without reprieve so
// that the label is what the kubelet itself did; the synthetic ones (Synthetic) are what that
// node cannot make cheaply (a 64 GiB node, hours of noise), labelled by KubeletEvictions.
package replay

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Series is one run of a node.
type Series struct {
	// Name names it (the file's name without .json.gz); Origin says where it comes from (the
	// real node, with the kubelet's version and the date, or "synthetic"); Description what
	// the node does.
	Name        string `json:"name"`
	Origin      string `json:"origin"`
	Description string `json:"description"`
	// Kubelet is the eviction part of the kubelet's KubeletConfiguration (YAML, without
	// apiVersion and kind) that ran it; Thresholds and MinimumReclaim reprieve's
	// --pressure-thresholds and --pressure-minimum-reclaim (empty: derived, as the chart runs
	// it).
	Kubelet        string `json:"kubelet"`
	Thresholds     string `json:"thresholds,omitempty"`
	MinimumReclaim string `json:"minimumReclaim,omitempty"`
	// Source is the pressure source whose readings these are: "host" (memory and processes per
	// pod, none for disk) or "summary".
	Source string `json:"source"`
	// Interval is the time between readings, in milliseconds.
	IntervalMs int64 `json:"intervalMs"`
	// DedicatedImageFs says the images are on a filesystem of their own.
	DedicatedImageFs bool  `json:"dedicatedImageFs,omitempty"`
	Pods             []Pod `json:"pods"`
	// Readings are in time order, the first at 0.
	Readings []Reading `json:"readings"`
	// Kubelet's evictions: the label, what the kubelet did without reprieve. None on a healthy
	// series.
	KubeletEvictions []KubeletEviction `json:"kubeletEvictions"`
}

// Pod is one of the node's pods.
type Pod struct {
	Name string `json:"name"`
	// Grace is its terminationGracePeriodSeconds; Priority its priority; MemoryRequest its
	// memory request ("" for none).
	Grace         int64  `json:"grace"`
	Priority      int32  `json:"priority,omitempty"`
	MemoryRequest string `json:"memoryRequest,omitempty"`
	// DaemonSet says a DaemonSet controls it.
	DaemonSet bool `json:"daemonSet,omitempty"`
	// DeletedAtMs, when set, is when a DELETE with DeletionGrace seconds made it terminating (a
	// rollout), in milliseconds from the start.
	DeletedAtMs   *int64 `json:"deletedAtMs,omitempty"`
	DeletionGrace int64  `json:"deletionGrace,omitempty"`
	// EmptyDir says it has an emptyDir on disk named "scratch" (its usage counts as nodefs).
	EmptyDir bool `json:"emptyDir,omitempty"`
}

// Reading is what the source read at one moment.
type Reading struct {
	// AtMs is the time from the start, in milliseconds.
	AtMs int64 `json:"t"`
	// Node holds each signal read: available and capacity.
	Node map[kubelet.Signal][2]int64 `json:"n"`
	// Pods is each pod's usage, by name; a pod not listed had no figures (or was gone).
	Pods map[string]Usage `json:"p,omitempty"`
	// ImageFsUsed is the Summary API's node.runtime.imageFs.usedBytes, 0 when not read.
	ImageFsUsed int64 `json:"images,omitempty"`
	// MeasuredMs is when the source measured the node's signals, from the start, when that is
	// not the reading's time: the Summary API serves the stats the kubelet refreshes about every
	// 10 s, read by the loop every second.
	MeasuredMs *int64 `json:"m,omitempty"`
}

// Usage is one pod's usage at a reading.
type Usage struct {
	// Memory is its working set and Processes its process count.
	Memory    int64 `json:"m,omitempty"`
	Processes int64 `json:"n,omitempty"`
	// Rootfs is its containers' writable layers, Local its logs and local volumes, in bytes.
	Rootfs int64 `json:"r,omitempty"`
	Local  int64 `json:"l,omitempty"`
}

// KubeletEviction is one eviction the kubelet made: the pod, when (its SIGTERM, in
// milliseconds from the start), the signal and the grace it gave (1 s at a hard threshold;
// min(evictionMaxPodGracePeriod, the pod's) at a soft one).
type KubeletEviction struct {
	Pod    string         `json:"pod"`
	AtMs   int64          `json:"t"`
	Signal kubelet.Signal `json:"signal"`
	Grace  int64          `json:"grace"`
	Soft   bool           `json:"soft,omitempty"`
}

// Healthy reports whether the kubelet evicted nobody: every eviction of reprieve's on it is one
// the kubelet would not make.
func (s *Series) Healthy() bool { return len(s.KubeletEvictions) == 0 }

// Interval is the time between readings.
func (s *Series) Interval() time.Duration { return time.Duration(s.IntervalMs) * time.Millisecond }

// Duration is the time from the first reading to the last.
func (s *Series) Duration() time.Duration {
	if len(s.Readings) == 0 {
		return 0
	}
	return time.Duration(s.Readings[len(s.Readings)-1].AtMs) * time.Millisecond
}

// Validate checks what Run relies on: readings in time order from 0, a known source, pods with
// distinct names, labels naming pods of the series.
func (s *Series) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("no name"))
	}
	if s.Source != "host" && s.Source != "summary" {
		errs = append(errs, fmt.Errorf("source %q: want host or summary", s.Source))
	}
	if s.IntervalMs <= 0 {
		errs = append(errs, fmt.Errorf("interval %d ms: want a positive one", s.IntervalMs))
	}
	if len(s.Readings) < 2 {
		errs = append(errs, fmt.Errorf("%d readings: want at least two", len(s.Readings)))
	}
	for i, r := range s.Readings {
		if i == 0 && r.AtMs != 0 {
			errs = append(errs, fmt.Errorf("the first reading at %d ms: want 0", r.AtMs))
		}
		if i > 0 && r.AtMs <= s.Readings[i-1].AtMs {
			errs = append(errs, fmt.Errorf("reading %d at %d ms is not after the one before (%d ms)", i, r.AtMs, s.Readings[i-1].AtMs))
			break
		}
		for sig := range r.Node {
			if !sig.Valid() {
				errs = append(errs, fmt.Errorf("reading %d: unknown signal %q", i, sig))
			}
		}
	}
	names := map[string]bool{}
	for _, p := range s.Pods {
		if names[p.Name] || p.Name == "" {
			errs = append(errs, fmt.Errorf("pod %q: empty or twice", p.Name))
		}
		names[p.Name] = true
	}
	for _, e := range s.KubeletEvictions {
		if !names[e.Pod] {
			errs = append(errs, fmt.Errorf("the kubelet evicted %q, not a pod of the series", e.Pod))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("series %s: %w", s.Name, err)
	}
	return nil
}

// Save writes s as gzipped JSON to path.
func (s *Series) Save(path string) error {
	if err := s.Validate(); err != nil {
		return err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(zw)
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("encoding series %s: %w", s.Name, err)
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing series %s: %w", s.Name, err)
	}
	return nil
}

// Load reads a series written by Save.
func Load(path string) (*Series, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading series: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("reading series %s: %w", path, err)
	}
	var s Series
	dec := json.NewDecoder(io.LimitReader(zr, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("decoding series %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// LoadDir reads every *.json.gz series in dir, in name order.
func LoadDir(dir string) ([]*Series, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json.gz"))
	if err != nil {
		return nil, err
	}
	slices.Sort(paths)
	var out []*Series
	for _, p := range paths {
		s, err := Load(p)
		if err != nil {
			return nil, err
		}
		if want := strings.TrimSuffix(filepath.Base(p), ".json.gz"); s.Name != want {
			return nil, fmt.Errorf("%s holds series %q: want the file named after it", p, s.Name)
		}
		out = append(out, s)
	}
	return out, nil
}

// TestdataDir is where the recorded series are, from the repository's root.
const TestdataDir = "agent/pressure/replay/testdata"

// Corpus is every series: the recorded ones in dir, then Synthetic.
func Corpus(dir string) ([]*Series, error) {
	recorded, err := LoadDir(dir)
	if err != nil {
		return nil, err
	}
	synthetic, err := Synthetic()
	if err != nil {
		return nil, err
	}
	return append(recorded, synthetic...), nil
}
