package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// node is a node whose InternalIP and kubelet port are hostPort[0] and hostPort[1].
func node(hostPort []string) *v1.Node {
	port, _ := strconv.Atoi(hostPort[1])
	n := &v1.Node{}
	n.Name = "n1"
	n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: hostPort[0]}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	return n
}

// TestHostSourcePIDLimitFromKubelet: with pressure.source=host the PID limit is the kubelet's
// (node.rlimit.maxpid of its Summary API), not the pid_max this PID namespace reads (Linux 6.14
// and later give a pod's namespace its own, 4194304 unless set); with no Summary API to ask,
// the files decide as before.
func TestHostSourcePIDLimitFromKubelet(t *testing.T) {
	root := t.TempDir()
	for path, content := range map[string]string{
		"proc/loadavg":                "0.50 0.40 0.30 2/700 12345\n",
		"proc/sys/kernel/pid_max":     "4194304\n", // the pod's namespace's
		"proc/sys/kernel/threads-max": "192726\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet's Summary API, in its JSON (k8s.io/kubelet/pkg/apis/stats/v1alpha1): its
	// limit read in the host's namespace.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stats/summary" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"node":{"nodeName":"n1","rlimit":{"time":"2026-12-01T23:00:00Z","maxpid":32768,"curproc":690}},"pods":[]}`))
	}))
	defer srv.Close()
	for _, tt := range []struct {
		name   string
		url    string
		node   *v1.Node
		hostNS bool
		want   kubelet.Observation
		from   string
	}{
		{"in a pod: the kubelet's limit", srv.URL + "/stats/summary", nil, false, kubelet.Observation{Available: 32768 - 700, Capacity: 32768}, root + " (the PID limit from " + srv.URL + "/stats/summary)"},
		// The node's address gives https://, which this plain-HTTP kubelet does not answer: the
		// files, until it does.
		{"in a pod, the kubelet unreachable", "", node(strings.Split(strings.TrimPrefix(srv.URL, "http://"), ":")), false, kubelet.Observation{Available: 192726 - 700, Capacity: 192726}, root + " (the PID limit from https://"},
		{"in a pod, no kubelet address", "", nil, false, kubelet.Observation{Available: 192726 - 700, Capacity: 192726}, root},
		{"in the host's PID namespace: pid_max is the host's", srv.URL + "/stats/summary", nil, true, kubelet.Observation{Available: 192726 - 700, Capacity: 192726}, root},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer func(f func() bool) { inHostPIDNamespace = f }(inHostPIDNamespace)
			inHostPIDNamespace = func() bool { return tt.hostNS }
			cfg := config.DefaultConfig()
			cfg.PressureSource, cfg.HostRoot, cfg.KubeletSummaryURL = config.PressureSourceHost, root, tt.url
			src, from, err := NewPressureSource(cfg, tt.node)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(from, tt.from) || (tt.from == root && from != root) {
				t.Errorf("reads from %q, want %q", from, tt.from)
			}
			s, _ := src.Read(context.Background()) // no meminfo or cgroups here: only the PIDs matter
			if got := s.Node[kubelet.PIDAvailable]; got != tt.want {
				t.Errorf("pid.available = %+v, want %+v", got, tt.want)
			}
		})
	}
}
