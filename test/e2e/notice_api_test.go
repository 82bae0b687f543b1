package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/podnotice"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestNoticeEndpointAnswersPodsAboutThemselves runs the agent with --notice-bind-address and
// asks it as its pods would: kwok's pods get loopback addresses as their pod IPs (patched as
// admin; kwok sets a pod's IP once), and each request leaves from its pod's address, which
// Linux routes over loopback. A pod gets its notice, a hanging GET returns when the notice comes
// and when it goes, and a neighbour, an address of no pod and a pod of another node get 404.
func TestNoticeEndpointAnswersPodsAboutThemselves(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node, other = "notice-api", "notice-api-a", "notice-api-b"
	setupNode(ctx, t, ns, node, nil)
	if _, err := env.CreateNode(ctx, other, nil); err != nil {
		t.Fatal(err)
	}
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{
		{Name: "job", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)},
		{Name: "neighbour", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)},
	}); err != nil {
		t.Fatal(err)
	}
	if err := scenario.Create(ctx, env.Client, ns, other, taint, []scenario.Pod{{Name: "far", Kind: scenario.Plain}}); err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{"job": "127.0.0.41", "neighbour": "127.0.0.42", "far": "127.0.0.44"}
	for name, ip := range ips {
		// kwok gives a pod its IP once (pod-create); set ours after that. A merge patch: podIPs
		// replaced, not merged by IP.
		waitFor(ctx, t, name+" running with kwok's IP", func() bool {
			p, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.PodIP != "" && p.Status.Phase == v1.PodRunning
		})
		b, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": ip, "podIPs": []map[string]string{{"ip": ip}}}})
		if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}

	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "127.0.0.1:" + strconv.Itoa(port)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "--notice-bind-address="+endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	type answer struct {
		code int
		etag string
		a    podnotice.NoticeAnswer
	}
	// get asks from src as its pod would.
	get := func(src, pod string, q url.Values) answer {
		t.Helper()
		client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext}}
		u := fmt.Sprintf("http://%s/v1/pods/%s/%s/notice?%s", endpoint, ns, pod, q.Encode())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s from %s: %v", u, src, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		r := answer{code: resp.StatusCode, etag: resp.Header.Get("ETag")}
		if r.code == http.StatusOK {
			if err := json.Unmarshal(body, &r.a); err != nil {
				t.Fatalf("answer %q: %v", body, err)
			}
		}
		return r
	}
	// The informer shows the new IPs shortly after the agent starts.
	var before answer
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		before = get(ips["job"], "job", nil)
		return before.code == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("the job's first question: %d; want 200", before.code)
	}
	if before.a.Notice || before.etag == "" {
		t.Fatalf("before a notice: %+v; want notice false and an ETag", before)
	}

	// The shell client of docs/workloads.md, asking from the job's address, with a stand-in
	// for the trainer it signals.
	script := docScript(t, strings.ReplaceAll(endpoint, "127.0.0.1:", ""))
	trainer := exec.CommandContext(ctx, "sleep", "300")
	if err := trainer.Start(); err != nil {
		t.Fatal(err)
	}
	client := exec.CommandContext(ctx, "sh", "-c", script)
	client.Env = append(os.Environ(), "HOST_IP=127.0.0.1", "POD_NAMESPACE="+ns, "POD_NAME=job",
		"TRAINER_PID="+strconv.Itoa(trainer.Process.Pid))
	var clientOut strings.Builder
	client.Stdout, client.Stderr = &clientOut, &clientOut
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}

	// A hanging GET, then the notice.
	waiting := make(chan answer, 1)
	go func() {
		waiting <- get(ips["job"], "job", url.Values{"wait": {"true"}, "last_etag": {before.etag}, "timeout_sec": {"90"}})
	}()
	deadline := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.UTC().Format(time.RFC3339))
	var got answer
	select {
	case got = <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging GET did not return within 30 s of the notice")
	}
	if got.code != http.StatusOK || !got.a.Notice || got.etag == before.etag || got.a.Reason != events.ReasonSpotInterruption {
		t.Fatalf("the hanging GET at the notice: %+v; want the notice with a new ETag", got)
	}
	// The job's 30 s grace ends 5 s before the deadline, after the kubelet's reaction.
	evictAt := lastStart(deadline.Add(-5*time.Second), 30*time.Second)
	if got.a.EvictAt == nil || !got.a.EvictAt.Equal(evictAt) || got.a.ReclaimDeadline == nil || !got.a.ReclaimDeadline.Equal(deadline) {
		t.Errorf("times %v, %v; want evict at %v, deadline %v", got.a.EvictAt, got.a.ReclaimDeadline, evictAt, deadline)
	}

	clientDone := make(chan error, 1)
	go func() { clientDone <- client.Wait() }()
	select {
	case err := <-clientDone:
		if err != nil || !strings.Contains(clientOut.String(), `reprieve: {"notice":true`) {
			t.Errorf("the documented client: %v\n%s", err, clientOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the documented client did not return within 30 s of the notice:\n%s", clientOut.String())
	}
	if err := trainer.Wait(); err == nil || !strings.Contains(err.Error(), "user defined signal 1") {
		t.Errorf("the trainer: %v; want it signalled with SIGUSR1 by the client", err)
	}

	for _, tc := range []struct{ what, src, pod string }{
		{"the neighbour asking about the job", ips["neighbour"], "job"},
		{"an address of no pod", "127.0.0.43", "job"},
		{"a pod of another node asking about itself", ips["far"], "far"},
	} {
		if r := get(tc.src, tc.pod, nil); r.code != http.StatusNotFound {
			t.Errorf("%s: %d %+v; want 404", tc.what, r.code, r.a)
		}
	}
	if r := get(ips["neighbour"], "neighbour", nil); r.code != http.StatusOK || !r.a.Notice {
		t.Errorf("the neighbour about itself: %+v; want its notice", r)
	}

	// Withdrawn: a hanging GET from the notice's ETag returns notice false.
	go func() {
		waiting <- get(ips["job"], "job", url.Values{"wait": {"true"}, "last_etag": {got.etag}, "timeout_sec": {"90"}})
	}()
	setDeadline(ctx, t, node, "")
	select {
	case got = <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging GET did not return within 30 s of the withdrawal")
	}
	if got.code != http.StatusOK || got.a.Notice || got.etag != before.etag {
		t.Errorf("the hanging GET at the withdrawal: %+v; want notice false with the first answer's ETag %s", got, before.etag)
	}
}

// testChartNoticeEndpoint renders the chart's noticeEndpoint values: off by default; on, the
// agent gets --notice-bind-address by its variable and a port named notice, a hostPort of the
// same number when it is on the pod network (pods ask at status.hostIP), none on the host
// network, where the port is the node's already.
func testChartNoticeEndpoint(t *testing.T) {
	find := func(ds *appsv1.DaemonSet) (string, *v1.ContainerPort) {
		c := ds.Spec.Template.Spec.Containers[0]
		var addr string
		for _, e := range c.Env {
			if e.Name == "REPRIEVE_NOTICE_BIND_ADDRESS" {
				addr = e.Value
			}
		}
		for i := range c.Ports {
			if c.Ports[i].Name == "notice" {
				return addr, &c.Ports[i]
			}
		}
		return addr, nil
	}
	ds, _ := renderDaemonSet(t, "defaults")
	if addr, port := find(ds); addr != "" || port != nil {
		t.Errorf("defaults: %q, %+v; want the endpoint off", addr, port)
	}
	for _, c := range []struct {
		set      string
		hostPort int32
	}{
		{"cloud=gcp,noticeEndpoint.enabled=true", 10272},
		{"cloud=aws,noticeEndpoint.enabled=true,noticeEndpoint.port=9999", 0},
		{"cloud=aws,hostNetwork=false,noticeEndpoint.enabled=true", 10272},
	} {
		ds, _ := renderDaemonSet(t, c.set, "--set", c.set)
		addr, port := find(ds)
		want := int32(10272)
		if strings.Contains(c.set, "port=9999") {
			want = 9999
		}
		if addr != fmt.Sprintf(":%d", want) || port == nil || port.ContainerPort != want || port.HostPort != c.hostPort {
			t.Errorf("--set %s: REPRIEVE_NOTICE_BIND_ADDRESS %q, port %+v; want :%d, containerPort %d, hostPort %d", c.set, addr, port, want, want, c.hostPort)
		}
	}
}

// docScript returns the shell client of docs/workloads.md, sending from the job's loopback
// address (curl --interface) to the agent's test port.
func docScript(t *testing.T, port string) string {
	t.Helper()
	doc := string(readRepoFile(t, "docs", "workloads.md"))
	_, rest, ok := strings.Cut(doc, "```sh\n#!/bin/sh\n# Waits for reprieve's notice")
	if !ok {
		t.Fatal("docs/workloads.md has no shell client")
	}
	script, _, _ := strings.Cut(rest, "```")
	if n := strings.Count(script, "\n") + 1; n > 10 { // and the #!/bin/sh line
		t.Errorf("the documented client has %d lines; the issue asks for ten", n)
	}
	script = strings.Replace(script, "curl -sf", "curl -sf --interface 127.0.0.41", 1)
	return strings.Replace(script, ":10272/", ":"+port+"/", 1)
}
