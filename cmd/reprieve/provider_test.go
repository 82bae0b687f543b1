package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/serve"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
)

// hostRoot is a fixture host root of providers/detect.
func hostRoot(name string) string {
	return filepath.Join("..", "..", "providers", "detect", "testdata", name)
}

// waitTimer waits until something waits on clk (a backoff timer), without sleeping.
func waitTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return clk.HasWaiters(), nil
	}); err != nil {
		t.Fatal("nothing waits on the clock")
	}
}

// unreachable makes the first n node GETs fail as a down API server does; it returns the count
// of GETs.
func unreachable(client *fake.Clientset, n int) *atomic.Int32 {
	var gets atomic.Int32
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if int(gets.Add(1)) <= n {
			return true, nil, errors.New(`Get "https://127.0.0.1:6443/api/v1/nodes/n1": dial tcp 127.0.0.1:6443: connect: connection refused`)
		}
		return false, nil, nil
	})
	return &gets
}

func noWait(string) (func(), error) { return nil, errors.New("serveWait called") }

// TestChooseProviderNeedsNoAPIServer is issue 20's case 5: a named provider, and auto on a host
// whose DMI names the cloud, are chosen without reading the node, so that an API server that is
// down at start cannot stop the agent.
func TestChooseProviderNeedsNoAPIServer(t *testing.T) {
	tests := []struct {
		provider, root, want string
	}{
		{"azure", hostRoot("no-dmi"), "azure"}, // no --azure-resource-name: IMDS compute.name
		{"aws", hostRoot("no-dmi"), "aws"},
		{"none", hostRoot("no-dmi"), "none"},
		{"auto", hostRoot("azure"), "azure"},
		{"auto", hostRoot("aws-nitro"), "aws"},
		{"auto", hostRoot("aws-xen"), "aws"},
		{"auto", hostRoot("gce"), "gcp"},
	}
	for _, tc := range tests {
		t.Run(tc.provider+" on "+filepath.Base(tc.root), func(t *testing.T) {
			client := fake.NewClientset()
			gets := unreachable(client, 1<<30)
			cfg := config.DefaultConfig()
			cfg.NodeName, cfg.Provider, cfg.HostRoot = "n1", tc.provider, tc.root
			got, err := chooseProvider(context.Background(), cfg, kubetest.Wrap(client), clocktesting.NewFakeClock(time.Now()), noWait)
			if err != nil {
				t.Fatal(err)
			}
			if got.name != tc.want || got.providerID != "" {
				t.Errorf("chose %+v, want %s without a providerID", got, tc.want)
			}
			if n := gets.Load(); n != 0 {
				t.Errorf("%d node GETs, want none", n)
			}
		})
	}
}

// TestChooseProviderWaitsForTheNode: when DMI names no cloud, auto reads the node's providerID,
// and while the API server is down it keeps trying with backoff, never giving up, serving its
// health checks meanwhile; the providerID then decides.
func TestChooseProviderWaitsForTheNode(t *testing.T) {
	for _, tc := range []struct {
		root, providerID, want string
	}{
		{"no-dmi", "aws:///us-east-1a/i-0123456789abcdef0", "aws"},
		{"kvm", "gce://p/us-central1-a/n1", "gcp"},
		{"hyperv-onprem", "", "none"},
		{"baremetal", "kind://docker/kind/n1", "none"},
	} {
		t.Run(tc.root, func(t *testing.T) {
			client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{ProviderID: tc.providerID}})
			const failures = 6 // backoff 0.5, 1, 2, 4, 8, 16 s: past any liveness probe's patience
			gets := unreachable(client, failures)
			clk := clocktesting.NewFakeClock(time.Now())
			cfg := config.DefaultConfig()
			cfg.NodeName, cfg.Provider, cfg.HostRoot = "n1", "auto", hostRoot(tc.root)
			var served, stopped atomic.Int32
			type result struct {
				c   providerChoice
				err error
			}
			done := make(chan result, 1)
			go func() {
				c, err := chooseProvider(context.Background(), cfg, kubetest.Wrap(client), clk, func(why string) (func(), error) {
					served.Add(1)
					if !strings.Contains(why, "spec.providerID") {
						t.Errorf("readiness reason %q does not say what it waits for", why)
					}
					return func() { stopped.Add(1) }, nil
				})
				done <- result{c, err}
			}()
			for range failures {
				waitTimer(t, clk)
				clk.Step(nodeRetryCap)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.c.name != tc.want || r.c.providerID != tc.providerID {
				t.Errorf("chose %+v, want %s from providerID %q", r.c, tc.want, tc.providerID)
			}
			if n := gets.Load(); n != failures+1 {
				t.Errorf("%d node GETs, want %d", n, failures+1)
			}
			if served.Load() != 1 || stopped.Load() != 1 {
				t.Errorf("health server started %d and stopped %d times, want once each", served.Load(), stopped.Load())
			}
		})
	}
}

// TestChooseProviderStops: a wait that the agent's stop ends returns the error, and the health
// server it started is stopped.
func TestChooseProviderStops(t *testing.T) {
	client := fake.NewClientset()
	unreachable(client, 1<<30)
	clk := clocktesting.NewFakeClock(time.Now())
	cfg := config.DefaultConfig()
	cfg.NodeName, cfg.Provider, cfg.HostRoot = "n1", "auto", hostRoot("no-dmi")
	ctx, cancel := context.WithCancel(context.Background())
	var stopped atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := chooseProvider(ctx, cfg, kubetest.Wrap(client), clk, func(string) (func(), error) { return func() { stopped.Add(1) }, nil })
		done <- err
	}()
	waitTimer(t, clk)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("err = %v, want the cancellation with the last error", err)
	}
	if stopped.Load() != 1 {
		t.Errorf("health server stopped %d times, want once", stopped.Load())
	}
}

// TestServeWhileWaiting: the liveness probe passes, readiness says why not, and once stopped the
// address is free for the agent's own server.
func TestServeWhileWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	stop, err := serveWhileWaiting(context.Background(), addr, prometheus.NewRegistry(), "waiting for the API server")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for the API server") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := get("/metrics"); code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
	stop()
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address is not free after stop: %v", err)
	}
	again.Close()
	if _, err := serveWhileWaiting(context.Background(), "", nil, ""); err != nil {
		t.Errorf("no address: %v", err)
	}
}

// TestNewProviderAzureResourceName: without --azure-resource-name and without the node, the
// Azure provider takes compute.name from IMDS; with a providerID read for auto, its name.
func TestNewProviderAzureResourceName(t *testing.T) {
	const self = "aks-spotpool-38290525-vmss_3"
	for _, tc := range []struct {
		name        string
		providerID  string
		computeGets int
	}{
		{"no node", "", 1},
		{"providerID", "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spotpool-38290525-vmss/virtualMachines/3", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := azureevents.New(self)
			url, err := fake.Start("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fake.Close)
			id := fake.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{self},
				NotBefore: time.Now().Add(30 * time.Second), DurationInSeconds: -1})
			cfg := config.DefaultConfig()
			cfg.AzureIMDSEndpoint = url
			p, err := newProvider(context.Background(), cfg, providerChoice{name: "azure", providerID: tc.providerID}, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ns, err := p.Poll(ctx)
			if err != nil || len(ns) != 1 || ns[0].ID != id {
				t.Fatalf("Poll = %v, %v; want the preemption of %s", ns, err, self)
			}
			if c := fake.Counts(); c.ComputeGets != tc.computeGets {
				t.Errorf("compute.name asked %d times, want %d", c.ComputeGets, tc.computeGets)
			}
			if _, ok := p.(providers.SourceReporter); !ok {
				t.Error("the Azure provider reports no sources")
			}
		})
	}
}

// TestStartStoppedWhileWaiting: a stop (SIGTERM) while the agent waits for the API server is a
// clean stop, not a failure.
func TestStartStoppedWhileWaiting(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["down"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["down"] = &clientcmdapi.Context{Cluster: "down", AuthInfo: "agent"}
	cfg.CurrentContext = "down"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	ac := config.DefaultConfig()
	ac.NodeName, ac.Kubeconfig, ac.Provider, ac.HostRoot, ac.MetricsBindAddress = "n1", kubeconfig, "auto", hostRoot("no-dmi"), ""
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := start(ctx, ac); err != nil {
		t.Errorf("start stopped while waiting for the node = %v, want a clean stop", err)
	}
}

// dialFrom opens a TCP connection to addr from src, a loopback address of its own (Linux routes
// all of 127.0.0.0/8 over lo), as a node's neighbours would; nil when the server reset it at
// once.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requestOn sends one kept-alive GET of path with extra header bytes on c and returns the
// status, or 0 when the server closed the connection instead of answering.
func requestOn(t *testing.T, c net.Conn, path string, headerBytes int) int {
	t.Helper()
	if c == nil {
		return 0
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: agent\r\nX-Pad: %s\r\n\r\n", path, strings.Repeat("a", headerBytes)); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// flood opens n connections from src to addr, each keeping one answered request open, and
// returns how many were answered.
func flood(t *testing.T, src, addr string, n int) int {
	t.Helper()
	kept := 0
	for range n {
		if requestOn(t, dialFrom(t, src, addr), "/healthz", 0) == http.StatusOK {
			kept++
		}
	}
	return kept
}

// TestServeWhileWaitingIsBounded (issue 39 item 7): the health server of --provider auto's wait
// had no connection cap, net/http's 1 MiB header limit and no read, write or idle timeout: the
// metrics-port flood fixed in issue 22, reopened on the same address. It has the agent's
// metrics server's limits: the same timeouts and header limit, and the same pools, so that one
// address keeps no more connections open than it could on the agent's.
func TestServeWhileWaitingIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, stop := serveWaitingOn(context.Background(), ln, prometheus.NewRegistry(), "waiting for the API server")
	t.Cleanup(stop)
	want := serve.NewMetricsServer("", nil)
	if srv.ReadHeaderTimeout != want.ReadHeaderTimeout || srv.ReadTimeout != want.ReadTimeout || srv.WriteTimeout != want.WriteTimeout ||
		srv.IdleTimeout != want.IdleTimeout || srv.MaxHeaderBytes != want.MaxHeaderBytes {
		t.Errorf("header %v, read %v, write %v, idle %v, MaxHeaderBytes %d; want the agent's metrics server's: %v, %v, %v, %v, %d",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes,
			want.ReadHeaderTimeout, want.ReadTimeout, want.WriteTimeout, want.IdleTimeout, want.MaxHeaderBytes)
	}
	addr := ln.Addr().String()

	// A header past the agent's limit is refused (431), not read to 1 MiB.
	if code := requestOn(t, dialFrom(t, "127.0.0.1", addr), "/healthz", 2*want.MaxHeaderBytes); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a %d-byte header: %d, want %d", 2*want.MaxHeaderBytes, code, http.StatusRequestHeaderFieldsTooLarge)
	}

	// The agent's listener, on a server of its own, under the same flood from one address.
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ref := serve.NewMetricsServer("", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	go func() { _ = ref.Serve(serve.MetricsListener(inner)) }()
	t.Cleanup(func() { _ = ref.Close() })
	const n = 48
	agentKept := flood(t, "127.0.0.2", inner.Addr().String(), n)
	waitKept := flood(t, "127.0.0.2", addr, n)
	if agentKept >= n || waitKept != agentKept {
		t.Errorf("one address kept %d connections open on the waiting server and %d on the agent's (of %d); want the agent's cap on both", waitKept, agentKept, n)
	}
	// Another address is still answered during that flood.
	if code := requestOn(t, dialFrom(t, "127.0.0.3", addr), "/healthz", 0); code != http.StatusOK {
		t.Errorf("/healthz from another address during one address's flood: %d, want 200", code)
	}
}
