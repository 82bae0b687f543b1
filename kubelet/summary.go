package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/transport"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// maxSummaryBytes bounds the Summary API response read. A node at the default 110 pods answers
// with well under 2 MiB.
const maxSummaryBytes = 32 << 20

// summaryTimeout is the client's backstop when the caller's context has no deadline.
const summaryTimeout = 30 * time.Second

// SummarySource reads the kubelet's Summary API (/stats/summary, RBAC nodes/stats).
type SummarySource struct {
	URL    string // e.g. https://10.0.0.12:10250/stats/summary
	Client *http.Client
}

var _ Source = (*SummarySource)(nil)

// NewSummarySource builds one with a TLS config (caFile, or insecure) and a bearer token file
// (re-read as it rotates: client-go's cached file token source re-reads it every minute). An
// empty caFile with insecure false uses the system roots; an empty tokenFile sends no token.
func NewSummarySource(url, caFile, tokenFile string, insecure bool) (*SummarySource, error) {
	if caFile != "" && insecure {
		return nil, errors.New("summary API: a CA file and insecure are exclusive")
	}
	rt, err := transport.New(&transport.Config{
		TLS:             transport.TLSConfig{CAFile: caFile, Insecure: insecure},
		BearerTokenFile: tokenFile,
	})
	if err != nil {
		return nil, fmt.Errorf("summary API transport: %w", err)
	}
	return &SummarySource{URL: url, Client: &http.Client{Transport: rt, Timeout: summaryTimeout}}, nil
}

// Read fetches the Summary API and parses it with ParseSummary.
func (s *SummarySource) Read(ctx context.Context) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Sample{}, fmt.Errorf("summary API %s: %w", s.URL, err)
	}
	req.Header.Set("Accept", "application/json")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("summary API: %w", err) // *url.Error names the URL
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSummaryBytes+1))
	if err != nil {
		return Sample{}, fmt.Errorf("summary API GET %s: reading body: %w", s.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("summary API GET %s: %s: %s", s.URL, resp.Status, snippet(body))
	}
	if len(body) > maxSummaryBytes {
		return Sample{}, fmt.Errorf("summary API GET %s: response larger than %d bytes", s.URL, maxSummaryBytes)
	}
	sample, err := ParseSummary(body)
	if err != nil {
		return sample, fmt.Errorf("summary API GET %s: %w", s.URL, err)
	}
	return sample, nil
}

// snippet is the start of an error body, e.g. the kubelet's "Forbidden (user=..., verb=get,
// resource=nodes, subresource=stats)".
func snippet(b []byte) string {
	const n = 256
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// ParseSummary is the pure part of SummarySource: the Summary JSON to a Sample, as the kubelet's
// makeSignalObservations maps it:
//
//   - memory.available: node.memory.availableBytes, with capacity availableBytes + workingSetBytes;
//   - allocatableMemory.available: the same of node.systemContainers["pods"].memory;
//   - nodefs.*: node.fs availableBytes/capacityBytes and inodesFree/inodes;
//   - imagefs.*: node.runtime.imageFs, likewise;
//   - pid.available: node.rlimit maxpid - curproc, with capacity maxpid.
//
// Per-pod usage comes from pods[].memory.workingSetBytes, pods[]."ephemeral-storage".usedBytes and
// pods[].process_stats.process_count (0 when absent), with the parts the kubelet ranks disk
// signals by: the containers' rootfs and logs and each volume's usage. A missing field leaves
// its signal out, as in the kubelet; a value beyond int64 also leaves it out and is named in the
// error returned with the rest of the sample.
func ParseSummary(body []byte) (Sample, error) {
	var sum statsapi.Summary
	if err := json.Unmarshal(body, &sum); err != nil {
		return Sample{}, fmt.Errorf("parsing summary: %w", err)
	}
	obs := Observations{}
	var errs []error
	add := func(s Signal, avail, capacity *uint64, at metav1.Time) {
		if avail == nil || capacity == nil {
			return
		}
		a, okA := toInt64(*avail)
		c, okC := toInt64(*capacity)
		if !okA || !okC || a > c {
			errs = append(errs, fmt.Errorf("%s: implausible available %d of capacity %d", s, *avail, *capacity))
			return
		}
		obs[s] = Observation{Available: a, Capacity: c, Time: at.Time}
	}

	n := sum.Node
	if m := n.Memory; m != nil && m.AvailableBytes != nil && m.WorkingSetBytes != nil {
		capacity := *m.AvailableBytes + *m.WorkingSetBytes
		if capacity < *m.AvailableBytes { // wrapped
			errs = append(errs, fmt.Errorf("%s: available %d + working set %d overflows", MemoryAvailable, *m.AvailableBytes, *m.WorkingSetBytes))
		} else {
			add(MemoryAvailable, m.AvailableBytes, &capacity, m.Time)
		}
	}
	// allocatableMemory.available: the "pods" system container (the pods cgroup), as
	// makeSignalObservations reads it; the kubelet reports availableBytes there only when the
	// cgroup has a limit (node allocatable enforced).
	for _, sc := range n.SystemContainers {
		if sc.Name != statsapi.SystemContainerPods {
			continue
		}
		if m := sc.Memory; m != nil && m.AvailableBytes != nil && m.WorkingSetBytes != nil {
			capacity := *m.AvailableBytes + *m.WorkingSetBytes
			if capacity < *m.AvailableBytes {
				errs = append(errs, fmt.Errorf("%s: available %d + working set %d overflows", AllocatableMemoryAvailable, *m.AvailableBytes, *m.WorkingSetBytes))
			} else {
				add(AllocatableMemoryAvailable, m.AvailableBytes, &capacity, m.Time)
			}
		}
		break
	}
	if f := n.Fs; f != nil {
		add(NodeFsAvailable, f.AvailableBytes, f.CapacityBytes, f.Time)
		add(NodeFsInodesFree, f.InodesFree, f.Inodes, f.Time)
	}
	if n.Runtime != nil && n.Runtime.ImageFs != nil {
		f := n.Runtime.ImageFs
		add(ImageFsAvailable, f.AvailableBytes, f.CapacityBytes, f.Time)
		add(ImageFsInodesFree, f.InodesFree, f.Inodes, f.Time)
	}
	if r := n.Rlimit; r != nil && r.MaxPID != nil && r.NumOfRunningProcesses != nil {
		maxPID, cur := *r.MaxPID, *r.NumOfRunningProcesses
		if maxPID < 0 || cur < 0 {
			errs = append(errs, fmt.Errorf("%s: negative maxpid %d or curproc %d", PIDAvailable, maxPID, cur))
		} else {
			obs[PIDAvailable] = Observation{Available: maxPID - cur, Capacity: maxPID, Time: r.Time.Time}
		}
	}

	dedicated := dedicatedImageFs(obs)
	// KEP-4191's split: the runtime reports a container filesystem apart from the image
	// filesystem (the kubelet's HasDedicatedContainerFs compares their devices; the Summary API
	// gives their sizes). Then the writable layers are on nodefs, and the kubelet ranks nodefs by
	// them too (buildSignalToRankFunc, withImageFs && imageContainerSplitFs).
	split := false
	if rt := n.Runtime; dedicated && rt != nil && rt.ContainerFs != nil && rt.ImageFs != nil &&
		rt.ContainerFs.CapacityBytes != nil && rt.ImageFs.CapacityBytes != nil {
		split = *rt.ContainerFs.CapacityBytes != *rt.ImageFs.CapacityBytes
	}
	pods := make(map[types.UID]PodUsage, len(sum.Pods))
	for _, p := range sum.Pods {
		u := PodUsage{Namespace: p.PodRef.Namespace, Name: p.PodRef.Name, UID: types.UID(p.PodRef.UID)}
		if p.Memory != nil && p.Memory.WorkingSetBytes != nil {
			u.MemoryWorkingSet = clampInt64(*p.Memory.WorkingSetBytes)
		}
		if p.EphemeralStorage != nil && p.EphemeralStorage.UsedBytes != nil {
			u.EphemeralStorage = clampInt64(*p.EphemeralStorage.UsedBytes)
		}
		if p.ProcessStats != nil && p.ProcessStats.ProcessCount != nil {
			u.Processes = clampInt64(*p.ProcessStats.ProcessCount)
		}
		if p.EphemeralStorage != nil && p.EphemeralStorage.InodesUsed != nil {
			u.Inodes = clampInt64(*p.EphemeralStorage.InodesUsed)
		}
		for _, c := range p.Containers {
			u.Rootfs = u.Rootfs.add(c.Rootfs)
			u.Logs = u.Logs.add(c.Logs)
		}
		for _, v := range p.VolumeStats {
			if u.Volumes == nil {
				u.Volumes = make(map[string]FsUsage, len(p.VolumeStats))
			}
			u.Volumes[v.Name] = u.Volumes[v.Name].add(&v.FsStats)
		}
		u.RootfsOnImageFs = dedicated && !split
		pods[u.UID] = u
	}
	sample := Sample{Node: obs, Pods: pods, DedicatedImageFs: dedicated, SplitContainerFs: split}
	if rt := n.Runtime; rt != nil && rt.ImageFs != nil && rt.ImageFs.UsedBytes != nil {
		sample.ImageFsUsed = clampInt64(*rt.ImageFs.UsedBytes)
	}
	sample.SetReclaimable()
	return sample, errors.Join(errs...)
}

// add adds what fs uses; a missing figure counts 0, as in the kubelet's diskUsage and
// inodeUsage. The sums saturate at MaxInt64, as clampInt64 does.
func (u FsUsage) add(fs *statsapi.FsStats) FsUsage {
	if fs == nil {
		return u
	}
	if fs.UsedBytes != nil {
		u.Bytes = addClamped(u.Bytes, clampInt64(*fs.UsedBytes))
	}
	if fs.InodesUsed != nil {
		u.Inodes = addClamped(u.Inodes, clampInt64(*fs.InodesUsed))
	}
	return u
}

// addClamped adds two non-negative values, saturating at MaxInt64.
func addClamped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func toInt64(v uint64) (int64, bool) {
	if v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}

// clampInt64 caps a pod's usage at MaxInt64: a pod's usage only ranks pods, so a saturated value
// still ranks it first.
func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// DedicatedImageFs is dedicatedImageFs, for a caller that has the observations alone.
func DedicatedImageFs(obs Observations) bool { return dedicatedImageFs(obs) }

// dedicatedImageFs judges whether imagefs is a filesystem of its own: its capacity (bytes or
// inodes) differs from nodefs's. Two distinct filesystems of exactly the same size read as one,
// which only makes reprieve more careful (it then leaves nodefs to the kubelet's image garbage
// collection, as for a shared filesystem).
func dedicatedImageFs(obs Observations) bool {
	nb, ok1 := obs[NodeFsAvailable]
	ib, ok2 := obs[ImageFsAvailable]
	ni, ok3 := obs[NodeFsInodesFree]
	ii, ok4 := obs[ImageFsInodesFree]
	if !ok1 || !ok2 {
		return false
	}
	return nb.Capacity != ib.Capacity || (ok3 && ok4 && ni.Capacity != ii.Capacity)
}
