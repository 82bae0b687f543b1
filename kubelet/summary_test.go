package kubelet

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestParseSummary(t *testing.T) {
	body, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSummary(body)
	if err != nil {
		t.Fatalf("ParseSummary: %v", err)
	}
	// Each with the time the kubelet measured it, not the time it was read.
	at := time.Date(2026, 3, 4, 10, 21, 31, 0, time.UTC)
	wantNode := Observations{
		// availableBytes, with capacity availableBytes + workingSetBytes (not the "pods" container's,
		// which is allocatableMemory.available's).
		MemoryAvailable: {Available: 5368709120, Capacity: 5368709120 + 2684354560, Time: at},
		// The "pods" system container's (the pods cgroup), as makeSignalObservations reads it.
		AllocatableMemoryAvailable: {Available: 4798832640, Capacity: 4798832640 + 2470526976, Time: at},
		NodeFsAvailable:            {Available: 42949672960, Capacity: 107374182400, Time: at},
		NodeFsInodesFree:           {Available: 6000000, Capacity: 6553600, Time: at},
		ImageFsAvailable:           {Available: 21474836480, Capacity: 53687091200, Time: at},
		ImageFsInodesFree:          {Available: 3000000, Capacity: 3276800, Time: at},
		PIDAvailable:               {Available: 4194304 - 1234, Capacity: 4194304, Time: at.Add(2 * time.Second)},
	}
	if !s.DedicatedImageFs {
		t.Error("a 50 GiB imagefs beside a 100 GiB nodefs is not judged dedicated")
	}
	same := len(s.Node) == len(wantNode)
	for k, w := range wantNode {
		g, ok := s.Node[k]
		same = same && ok && g.Available == w.Available && g.Capacity == w.Capacity && g.Time.Equal(w.Time)
	}
	if !same {
		t.Errorf("Node =\n%v\nwant\n%v", s.Node, wantNode)
	}
	wantPods := map[types.UID]PodUsage{
		"3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77": {Namespace: "shop", Name: "web-7c9d8f6b5-x2kqp", UID: "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77",
			MemoryWorkingSet: 537919488, EphemeralStorage: 1084268544, Processes: 12, Inodes: 55,
			// The parts the kubelet ranks disk signals by; the writable layer is on the dedicated imagefs.
			Rootfs: FsUsage{Bytes: 40960, Inodes: 10}, Logs: FsUsage{Bytes: 10485760, Inodes: 3},
			Volumes: map[string]FsUsage{"cache": {Bytes: 1073741824, Inodes: 42}}, RootfsOnImageFs: true},
		// No ephemeral-storage or process_stats: zero.
		"a0d9e1c2-7f44-4b8e-b2a1-5c3d9e7f1b20": {Namespace: "jobs", Name: "batch-28951380-9zq4m", UID: "a0d9e1c2-7f44-4b8e-b2a1-5c3d9e7f1b20",
			MemoryWorkingSet: 3000000000, RootfsOnImageFs: true},
		// No memory: zero.
		"c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10": {Namespace: "default", Name: "fresh-5d8f7c6b4-abcde", UID: "c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10",
			EphemeralStorage: 4096, Processes: 1, RootfsOnImageFs: true},
	}
	if !reflect.DeepEqual(s.Pods, wantPods) {
		t.Errorf("Pods =\n%v\nwant\n%v", s.Pods, wantPods)
	}
}

func TestParseSummaryMissingAndBad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Observations
		errHas  string
		wantErr bool
	}{
		{name: "empty object", body: `{}`, want: Observations{}},
		{
			name: "memory without working set, fs without inodes, no runtime",
			body: `{"node":{"memory":{"availableBytes":100},"fs":{"availableBytes":1,"capacityBytes":2}}}`,
			want: Observations{NodeFsAvailable: {Available: 1, Capacity: 2}},
		},
		{
			name: "rlimit without curproc",
			body: `{"node":{"rlimit":{"maxpid":100}}}`,
			want: Observations{},
		},
		{
			name:   "available above capacity",
			body:   `{"node":{"fs":{"availableBytes":3,"capacityBytes":2,"inodesFree":1,"inodes":5}}}`,
			want:   Observations{NodeFsInodesFree: {Available: 1, Capacity: 5}},
			errHas: "nodefs.available",
		},
		{
			name:   "beyond int64",
			body:   `{"node":{"runtime":{"imageFs":{"availableBytes":1,"capacityBytes":18446744073709551615}}}}`,
			want:   Observations{},
			errHas: "imagefs.available",
		},
		{
			name:   "memory sum overflows",
			body:   `{"node":{"memory":{"availableBytes":18446744073709551615,"workingSetBytes":2}}}`,
			want:   Observations{},
			errHas: "memory.available",
		},
		{name: "not JSON", body: `<html>`, wantErr: true},
		{name: "wrong type", body: `{"node":{"fs":{"availableBytes":"lots"}}}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseSummary([]byte(tt.body))
			switch {
			case tt.wantErr:
				if err == nil {
					t.Fatalf("no error, want one")
				}
				return
			case tt.errHas != "":
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %v, want one naming %s", err, tt.errHas)
				}
			case err != nil:
				t.Fatalf("error %v", err)
			}
			if !reflect.DeepEqual(s.Node, tt.want) {
				t.Errorf("Node = %v, want %v", s.Node, tt.want)
			}
			if s.Pods == nil {
				t.Errorf("Pods nil, want an empty map from the Summary API")
			}
		})
	}
}

// tlsServer serves body at /stats/summary to requests bearing token, and writes the server's CA
// to a file.
func tlsServer(t *testing.T, token string, body []byte) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/stats/summary" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, caFile
}

func TestSummarySource(t *testing.T) {
	body, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		t.Fatal(err)
	}
	srv, caFile := tlsServer(t, "tok-1", body)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, "tok-1\n")

	src, err := NewSummarySource(srv.URL+"/stats/summary", caFile, tokenFile, false)
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(s.Node) != len(Signals) || len(s.Pods) != 3 {
		t.Errorf("got %d signals and %d pods, want %d and 3", len(s.Node), len(s.Pods), len(Signals))
	}

	t.Run("non-200 names status and URL", func(t *testing.T) {
		bad, err := NewSummarySource(srv.URL+"/stats/nope", caFile, tokenFile, false)
		if err != nil {
			t.Fatal(err)
		}
		_, err = bad.Read(context.Background())
		if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), srv.URL+"/stats/nope") {
			t.Errorf("error %v, want one naming 404 and the URL", err)
		}
	})
	t.Run("wrong token is refused", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "token")
		writeFile(t, other, "tok-2")
		bad, err := NewSummarySource(srv.URL+"/stats/summary", caFile, other, false)
		if err != nil {
			t.Fatal(err)
		}
		_, err = bad.Read(context.Background())
		if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("error %v, want a 401 with the body", err)
		}
	})
	t.Run("untrusted server without the CA", func(t *testing.T) {
		bad, err := NewSummarySource(srv.URL+"/stats/summary", "", tokenFile, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.Read(context.Background()); err == nil {
			t.Error("no error from a server signed by an unknown CA")
		}
	})
	t.Run("insecure skips verification", func(t *testing.T) {
		ins, err := NewSummarySource(srv.URL+"/stats/summary", "", tokenFile, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ins.Read(context.Background()); err != nil {
			t.Errorf("Read: %v", err)
		}
	})
	t.Run("CA and insecure together", func(t *testing.T) {
		if _, err := NewSummarySource(srv.URL, caFile, tokenFile, true); err == nil {
			t.Error("no error")
		}
	})
}

func TestSummarySourceTooLarge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"pods":[`))
		chunk := []byte(strings.Repeat(" ", 1<<20))
		for range maxSummaryBytes>>20 + 1 {
			w.Write(chunk)
		}
		w.Write([]byte(`]}`))
	}))
	defer srv.Close()
	_, err := (&SummarySource{URL: srv.URL, Client: srv.Client()}).Read(context.Background())
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("error %v, want one about the size", err)
	}
}

// KEP-4191's split (CRI-O's imagestore): the runtime reports a container filesystem apart from
// the image filesystem. The writable layers are then on nodefs, not on imagefs, and count for the
// nodefs signals (buildSignalToRankFunc, withImageFs && imageContainerSplitFs).
func TestParseSummarySplitContainerFs(t *testing.T) {
	body, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's containerFs is the imagefs (50 GiB); make it the 100 GiB nodefs.
	split := strings.Replace(string(body), `"containerFs": {
    "time": "2026-03-04T10:21:31Z",
    "availableBytes": 21474836480,
    "capacityBytes": 53687091200`, `"containerFs": {
    "time": "2026-03-04T10:21:31Z",
    "availableBytes": 42949672960,
    "capacityBytes": 107374182400`, 1)
	if split == string(body) {
		t.Fatal("the fixture's containerFs was not found")
	}
	for _, c := range []struct {
		body  string
		split bool
	}{{string(body), false}, {split, true}} {
		s, err := ParseSummary([]byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if s.SplitContainerFs != c.split || !s.DedicatedImageFs {
			t.Errorf("split %v dedicated %v, want split %v on a dedicated imagefs", s.SplitContainerFs, s.DedicatedImageFs, c.split)
		}
		for uid, u := range s.Pods {
			if u.RootfsOnImageFs == c.split {
				t.Errorf("split %v: pod %s RootfsOnImageFs %v", c.split, uid, u.RootfsOnImageFs)
			}
		}
	}
}

// Issue 47: the Summary API's imageFs.usedBytes is read, and the image filesystem's signals count
// what the kubelet's image and container garbage collection can delete (SetReclaimable): the
// images' bytes less the writable layers the runtime counts with them; nodefs.available only when
// the images share nodefs.
func TestParseSummaryReclaimable(t *testing.T) {
	body, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSummary(body)
	if err != nil {
		t.Fatal(err)
	}
	if s.ImageFsUsed != 9663676416 {
		t.Fatalf("ImageFsUsed %d, want imageFs.usedBytes 9663676416", s.ImageFsUsed)
	}
	var layers int64
	for _, u := range s.Pods {
		layers += u.Rootfs.Bytes
	}
	if got, want := s.Node[ImageFsAvailable].Reclaimable, 9663676416-layers; got != want || layers == 0 {
		t.Errorf("imagefs.available reclaimable %d, want usedBytes less the writable layers (%d): %d", got, layers, want)
	}
	if got := s.Node[NodeFsAvailable].Reclaimable; got != 0 {
		t.Errorf("nodefs.available reclaimable %d with a dedicated imagefs, want 0", got)
	}
	if got := s.Node[MemoryAvailable].Reclaimable; got != 0 {
		t.Errorf("memory.available reclaimable %d, want 0", got)
	}

	// One filesystem: nodefs counts it too. A split container filesystem keeps the writable
	// layers out of imagefs's usage: nothing is subtracted.
	shared := Sample{Node: Observations{NodeFsAvailable: {Available: 10, Capacity: 100}, ImageFsAvailable: {Available: 10, Capacity: 100}},
		Pods: map[types.UID]PodUsage{"a": {Rootfs: FsUsage{Bytes: 5}}}, ImageFsUsed: 30}
	shared.SetReclaimable()
	if shared.Node[NodeFsAvailable].Reclaimable != 25 || shared.Node[ImageFsAvailable].Reclaimable != 25 {
		t.Errorf("shared filesystem: reclaimable %+v, want 25 on both", shared.Node)
	}
	split := Sample{Node: Observations{NodeFsAvailable: {Available: 10, Capacity: 100}, ImageFsAvailable: {Available: 10, Capacity: 50}},
		Pods: map[types.UID]PodUsage{"a": {Rootfs: FsUsage{Bytes: 5}}}, ImageFsUsed: 30, DedicatedImageFs: true, SplitContainerFs: true}
	split.SetReclaimable()
	if split.Node[ImageFsAvailable].Reclaimable != 30 || split.Node[NodeFsAvailable].Reclaimable != 0 {
		t.Errorf("split container filesystem: reclaimable %+v, want 30 on imagefs alone", split.Node)
	}
	// The host source reads no image figures: nothing is counted.
	host := Sample{Node: Observations{ImageFsAvailable: {Available: 10, Capacity: 100}}}
	host.SetReclaimable()
	if host.Node[ImageFsAvailable].Reclaimable != 0 {
		t.Errorf("without ImageFsUsed: reclaimable %d, want 0", host.Node[ImageFsAvailable].Reclaimable)
	}
}
