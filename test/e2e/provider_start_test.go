package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/fakes/faultproxy"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// apiOutage is how long the API server is unreachable when the agent starts.
const apiOutage = 5 * time.Second

// TestProviderStartWithoutAPIServer is issue 20's case 5 on the real binary: with the API server
// unreachable at start (the agent's kubeconfig names an address where nothing listens, so every
// request is refused, as from a node whose control plane is down), --provider auto and
// --provider azure without --azure-resource-name must not exit (which in a pod is CrashLoopBackOff,
// and protection resumes only up to five minutes after the API server is back). The process keeps
// answering /healthz, is not ready meanwhile, and becomes ready once the API server answers (a
// TCP forwarder to the real one starts listening on that address after apiOutage).
func TestProviderStartWithoutAPIServer(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	dmi := func(name string) string { return filepath.Join(root, "providers", "detect", "testdata", name) }
	tests := []struct {
		name       string
		node       string
		providerID string
		args       func(imds string) []string
		// computeGets says whether the resource name came from IMDS compute.name.
		computeGets bool
		// readyzWhileDown is what /readyz says while the API server is down.
		readyzWhileDown string
		log             string
	}{
		{
			name: "azure without a resource name", node: "start-azure",
			args:        func(imds string) []string { return []string{"--provider=azure", "--azure-imds-endpoint=" + imds} },
			computeGets: true, readyzWhileDown: "caches syncing",
		},
		{
			name: "auto, DMI says Azure", node: "start-auto-dmi",
			args: func(imds string) []string {
				return []string{"--provider=auto", "--host-root=" + dmi("azure"), "--azure-imds-endpoint=" + imds}
			},
			computeGets: true, readyzWhileDown: "caches syncing", log: "chassis_asset_tag",
		},
		{
			name: "auto, no DMI: the node's providerID", node: "start-auto-node",
			providerID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/start-auto-node-vm",
			args: func(imds string) []string {
				return []string{"--provider=auto", "--host-root=" + dmi("no-dmi"), "--azure-imds-endpoint=" + imds}
			},
			computeGets: false, readyzWhileDown: "spec.providerID", log: "node spec.providerID",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			n, err := env.CreateNode(ctx, tc.node, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.providerID != "" {
				n.Spec.ProviderID = tc.providerID
				if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			resource := tc.node + "-vm"
			imds := azureevents.New(resource)
			imdsURL, err := imds.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer imds.Close()

			apiAddr, kubeconfig := downKubeconfig(t)
			port, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			metrics := "127.0.0.1:" + strconv.Itoa(port)
			args := append([]string{"--node-name=" + tc.node, "--kubeconfig=" + kubeconfig, "--poll-interval=1s",
				"--metrics-bind-address=" + metrics, "-v=2", "--pressure-source=off"}, tc.args(imdsURL)...)
			p, err := testenv.StartProcess(ctx, "reprieve", filepath.Join(logDir, "reprieve-"+tc.node+".log"), reprieveBin, args, os.Environ())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Stop() }()

			// While the API server is down: alive, live, not ready.
			healthy := false
			for end := time.Now().Add(apiOutage); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if p.Exited() {
					t.Fatalf("reprieve exited with the API server down (%s):\n%s", p.ExitDescription(), p.LogTail(30))
				}
				if code, _ := probe(metrics, "/healthz"); code == http.StatusOK {
					healthy = true
				}
				if code, body := probe(metrics, "/readyz"); code == http.StatusOK {
					t.Fatalf("ready with the API server down: %q", body)
				} else if code != 0 && !strings.Contains(body, tc.readyzWhileDown) {
					t.Errorf("/readyz while the API server is down: %d %q, want it to say %q", code, body, tc.readyzWhileDown)
				}
			}
			if !healthy {
				t.Errorf("/healthz never answered in %s with the API server down: a liveness probe would restart the pod\n%s", apiOutage, p.LogTail(30))
			}

			// The API server answers again.
			stop := forward(t, apiAddr, strings.TrimPrefix(env.Host, "https://"))
			defer stop()
			back := time.Now()
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				if p.Exited() {
					return false, io.ErrUnexpectedEOF
				}
				code, _ := probe(metrics, "/readyz")
				return code == http.StatusOK, nil
			}); err != nil {
				t.Fatalf("not ready after the API server came back (%s): %v\n%s", p.ExitDescription(), err, p.LogTail(40))
			}
			t.Logf("ready %s after the API server came back", time.Since(back).Round(100*time.Millisecond))

			if got := imds.Counts().ComputeGets > 0; got != tc.computeGets {
				t.Errorf("IMDS compute.name asked: %v, want %v (%d GETs)", got, tc.computeGets, imds.Counts().ComputeGets)
			}
			if c := imds.Counts(); c.BadRequests > 0 {
				t.Errorf("the Azure fake refused a request: %s", c.LastRejected)
			}
			if tc.log != "" {
				b, err := os.ReadFile(p.LogPath())
				if err != nil || !strings.Contains(string(b), tc.log) {
					t.Errorf("the log does not say the provider was detected from %q (%v)", tc.log, err)
				}
			}
		})
	}
}

// downKubeconfig writes the agent's kubeconfig with the API server at an address where nothing
// listens yet; it returns that address (the serving certificate names 127.0.0.1).
func downKubeconfig(t *testing.T) (addr, path string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(agentKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if addr, err = faultproxy.ReserveAddr(); err != nil {
		t.Fatal(err)
	}
	cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].Server = "https://" + addr
	path = filepath.Join(t.TempDir(), "down.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return addr, path
}

// forward listens on addr and forwards every connection to target, byte for byte (TLS passes
// through), until the returned function is called.
func forward(t *testing.T, addr, target string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s, the address the agent's kubeconfig names: %v", addr, err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		}
	})
	return func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// probe GETs a path of the agent's metrics address; code is 0 when nothing answered.
func probe(addr, path string) (code int, body string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
