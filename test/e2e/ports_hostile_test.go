package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestPortsHoldUnderFlood floods the agent's two open ports from the test, as anyone who
// reaches a node could (issue 22, items 1, 4, 5 and 6), and checks that the agent keeps its
// memory, its readiness and its pods' answers. Every source is a distinct loopback address:
// 127.0.0.1 is the host itself (the kubelet's probe of a host-network agent comes from the
// agent's own address), 127.0.0.2 another address the probes may come from, 127.0.1.x-127.0.4.x
// the attackers, 127.0.0.6x the node's pods (kwok pods given loopback IPs, as in
// TestNoticeEndpointAnswersPodsAboutThemselves). It prints the agent's RSS for
// docs/benchmarks.md.
func TestPortsHoldUnderFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "ports-hostile", "ports-hostile-a"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	ips := map[string]string{"job": "127.0.0.61", "hog": "127.0.0.62", "twin-a": "127.0.0.63", "twin-b": "127.0.0.63"}
	var pods []scenario.Pod
	for name := range ips {
		pods = append(pods, scenario.Pod{Name: name, Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)})
	}
	if err := scenario.Create(ctx, env.Client, ns, node, taint, scenario.InstantAll(pods)); err != nil {
		t.Fatal(err)
	}
	for name, ip := range ips {
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
	notice := "127.0.0.1:" + strconv.Itoa(port)
	rp, metrics, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "--notice-bind-address="+notice)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	// A notice ten minutes out: every pod has one to answer, and none is evicted during the test.
	setDeadline(ctx, t, node, time.Now().Add(10*time.Minute).UTC().Format(time.RFC3339))
	jobPath := "/v1/pods/" + ns + "/job/notice"
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, body := floodGet(ips["job"], notice, jobPath, 2*time.Second)
		return code == http.StatusOK && strings.Contains(body, `"notice":true`), nil
	}); err != nil {
		t.Fatal("the job never got its notice before the flood")
	}
	base := agentMemory(t, rp.Pid())
	start := time.Now()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	probes := func(phase string, srcs ...string) {
		t.Helper()
		for _, src := range srcs {
			for _, path := range []string{"/readyz", "/healthz"} {
				if code, body := floodGet(src, metrics, path, 2*time.Second); code != http.StatusOK {
					t.Errorf("%s: %s from %s: %d %q; want 200 within 2 s", phase, path, src, code, body)
				}
			}
		}
	}

	// Item 1, one address: 2,000 idle kept-alive connections to the metrics port.
	kept := floodKeepAlive(metrics, []string{"127.0.1.1"}, 2000, "/healthz")
	held = append(held, kept...)
	t.Logf("metrics port, one address: %d of 2000 kept-alive connections kept", len(kept))
	if len(kept) > 16 {
		t.Errorf("one address keeps %d idle connections to the metrics port open; want a few", len(kept))
	}
	probes("one address's flood", "127.0.0.1", "127.0.0.2")

	// Item 1, many addresses: 2,000 connections from 40 addresses, each sending 12 KiB of a
	// header that never ends.
	var srcs []string
	for i := range 40 {
		srcs = append(srcs, fmt.Sprintf("127.0.2.%d", i+1))
	}
	stuffed := floodHeaders(metrics, srcs, 50, 12<<10)
	held = append(held, stuffed...)
	t.Logf("metrics port, 40 addresses: %d of 2000 connections with an unfinished 12 KiB header accepted", len(stuffed))
	probes("40 addresses' flood", "127.0.0.1")
	if m := agentMemory(t, rp.Pid()); m.hwm-base.hwm > 32<<20 {
		t.Errorf("the metrics flood took the agent from %d MiB to a peak of %d MiB", base.hwm>>20, m.hwm>>20)
	}

	// Item 4: strangers open 1,100 connections to the notice port, ask, and try to keep them
	// alive; the job is still answered.
	srcs = srcs[:0]
	for i := range 55 {
		srcs = append(srcs, fmt.Sprintf("127.0.3.%d", i+1))
	}
	strangers := floodKeepAlive(notice, srcs, 20, jobPath)
	held = append(held, strangers...)
	t.Logf("notice port, strangers: %d of 1100 kept-alive connections kept", len(strangers))
	if len(strangers) > 0 {
		t.Errorf("strangers keep %d connections to the notice endpoint alive after its 404; want none", len(strangers))
	}
	silent := floodHeaders(notice, srcs, 20, 0)
	held = append(held, silent...)
	t.Logf("notice port, strangers: %d of 1100 silent connections accepted", len(silent))
	if code, body := floodGet(ips["job"], notice, jobPath, 2*time.Second); code != http.StatusOK || !strings.Contains(body, `"notice":true`) {
		t.Errorf("the job during the strangers' flood: %d %q; want its notice within 2 s", code, body)
	}

	// Item 5: the hog asks to wait 1,030 times; the job's wait=true still hangs.
	hogPath := "/v1/pods/" + ns + "/hog/notice?wait=true&timeout_sec=60"
	hogWaits := make(chan int, 1030)
	var hogConns []net.Conn
	for range 1030 {
		c, err := dialFrom(ips["hog"], notice)
		if err != nil {
			hogWaits <- 0
			continue
		}
		hogConns = append(hogConns, c)
		go func() {
			code, _ := rawGet(c, hogPath, 90*time.Second)
			hogWaits <- code
		}()
	}
	held = append(held, hogConns...)
	began := time.Now()
	code, _ := floodGet(ips["job"], notice, "/v1/pods/"+ns+"/job/notice?wait=true&timeout_sec=2", 10*time.Second)
	waited := time.Since(began)
	if code != http.StatusOK || waited < 1500*time.Millisecond {
		t.Errorf("the job's wait=true while the hog asked 1030 times: %d after %v; want 200 after its 2 s", code, waited.Round(time.Millisecond))
	}
	hanging := 1030 - len(hogWaits)
	t.Logf("notice port, hog: %d of 1030 hanging GETs held", hanging)
	if hanging > 8 {
		t.Errorf("the hog holds %d hanging GETs; want a few of its own", hanging)
	}

	// Item 6: two running pods that claim one IP get 404, never the other's notice.
	for _, name := range []string{"twin-a", "twin-b"} {
		if code, body := floodGet(ips[name], notice, "/v1/pods/"+ns+"/"+name+"/notice", 2*time.Second); code != http.StatusNotFound {
			t.Errorf("%s from the IP it shares: %d %q; want 404", name, code, body)
		}
	}

	probes("after the floods", "127.0.0.1")
	if code, body := floodGet(ips["job"], notice, jobPath, 2*time.Second); code != http.StatusOK || !strings.Contains(body, `"notice":true`) {
		t.Errorf("the job after the floods: %d %q; want its notice", code, body)
	}
	if rp.Exited() {
		t.Fatalf("the agent exited: %s", rp.ExitDescription())
	}
	end := agentMemory(t, rp.Pid())
	t.Logf("agent RSS: %.1f MiB before the floods (peak %.1f MiB), %.1f MiB after, peak (VmHWM) %.1f MiB; floods took %v",
		float64(base.rss)/(1<<20), float64(base.hwm)/(1<<20), float64(end.rss)/(1<<20), float64(end.hwm)/(1<<20), time.Since(start).Round(time.Millisecond))
	if end.hwm-base.hwm > 32<<20 {
		t.Errorf("the floods took the agent from %d MiB to a peak of %d MiB; want at most 32 MiB more", base.hwm>>20, end.hwm>>20)
	}
}

type agentMem struct{ rss, hwm uint64 }

// agentMemory reads VmRSS and VmHWM (the kernel's peak) of process pid.
func agentMemory(t *testing.T, pid int) agentMem {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the agent's memory: %v", err)
	}
	var m agentMem
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseUint(f[0], 10, 64)
		switch k {
		case "VmRSS":
			m.rss = n << 10
		case "VmHWM":
			m.hwm = n << 10
		}
	}
	return m
}

func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// rawGet sends one kept-alive GET of path on c and returns the status (0 when the connection
// was closed or timed out instead) and the body.
func rawGet(c net.Conn, path string, timeout time.Duration) (int, string) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: agent\r\n\r\n", path); err != nil {
		return 0, ""
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.StatusCode, b.String()
}

// floodGet asks path on a fresh connection from src.
func floodGet(src, addr, path string, timeout time.Duration) (int, string) {
	c, err := dialFrom(src, addr)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	return rawGet(c, path, timeout)
}

// floodKeepAlive opens n connections to addr from each of srcs, sends each one GET of path,
// and returns those still open after their answer: the ones the server keeps alive.
func floodKeepAlive(addr string, srcs []string, n int, path string) []net.Conn {
	var mu sync.Mutex
	var answered []net.Conn
	var wg sync.WaitGroup
	for _, src := range srcs {
		wg.Go(func() {
			for range n {
				c, err := dialFrom(src, addr)
				if err != nil {
					continue
				}
				if code, _ := rawGet(c, path, 5*time.Second); code == 0 {
					_ = c.Close()
					continue
				}
				mu.Lock()
				answered = append(answered, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return stillOpen(answered)
}

// floodHeaders opens n connections to addr from each of srcs and writes size bytes of a
// header that never ends on each; it returns those the server has not closed.
func floodHeaders(addr string, srcs []string, n, size int) []net.Conn {
	line := "X-Flood: " + strings.Repeat("a", 1000) + "\r\n"
	var header strings.Builder
	header.WriteString("GET /metrics HTTP/1.1\r\nHost: agent\r\n")
	for header.Len() < size {
		header.WriteString(line)
	}
	var mu sync.Mutex
	var sent []net.Conn
	var wg sync.WaitGroup
	for _, src := range srcs {
		wg.Go(func() {
			for range n {
				c, err := dialFrom(src, addr)
				if err != nil {
					continue
				}
				if size > 0 {
					_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
					if _, err := c.Write([]byte(header.String())); err != nil {
						_ = c.Close()
						continue
					}
				}
				mu.Lock()
				sent = append(sent, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return stillOpen(sent)
}

// stillOpen closes and drops the connections that the server has closed (a refusal is a reset
// right after the accept, a 404 a close right after the answer): those whose read ends rather
// than waits for 300 ms, all read at once.
func stillOpen(conns []net.Conn) []net.Conn {
	open := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			ne, ok := err.(net.Error)
			open[i] = ok && ne.Timeout()
		})
	}
	wg.Wait()
	var out []net.Conn
	for i, c := range conns {
		if open[i] {
			out = append(out, c)
		} else {
			_ = c.Close()
		}
	}
	return out
}
