package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/podnotice"
	"github.com/reprieve-dev/reprieve/agent/serve"
)

// The tests below open real loopback connections from distinct 127.0.0.x source addresses
// (Linux routes all of 127.0.0.0/8 over lo), so that the listener sees what it would see on a
// node. Their real-time deadlines only bound a failure; nothing waits on them when the code is
// right.

// dialFrom opens a TCP connection from src to addr; nil when the server reset it before the
// dial returned (a refusal right after the accept).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatalf("dialing %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refused reports whether the server closed c without a word.
func refused(t *testing.T, c net.Conn) bool {
	t.Helper()
	if c == nil {
		return true
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

// request sends one kept-alive GET of path on c and returns the status, or 0 when the server
// closed the connection instead of answering.
func request(t *testing.T, c net.Conn, path string) int {
	t.Helper()
	if c == nil {
		return 0
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: agent\r\n\r\n", path); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestMetricsServerBoundsEveryConnection holds what issue 22 item 1 found missing: the
// metrics server had only ReadHeaderTimeout, so an idle kept-alive connection stayed open for
// ever, and a header could grow to 1 MiB.
func TestMetricsServerBoundsEveryConnection(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.MetricsBindAddress = "127.0.0.1:0" }, testNode())
	srv := h.a.metricsServer()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("timeouts: header %v, read %v, write %v, idle %v; want each set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	// The PodMonitor scrapes every 5 s with a 4 s timeout: the connection stays between
	// scrapes, and a scrape has the whole timeout to finish.
	if srv.IdleTimeout <= 5*time.Second || srv.WriteTimeout < 4*time.Second {
		t.Errorf("idle %v, write %v; want more than the PodMonitor's interval (5 s) and at least its scrape timeout (4 s)", srv.IdleTimeout, srv.WriteTimeout)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("MaxHeaderBytes %d; want a few KiB, not net/http's 1 MiB default", srv.MaxHeaderBytes)
	}
}

// serveMetrics serves the agent's metrics server on a loopback port with its listener, as Run
// does.
func serveMetrics(t *testing.T, h *harness) string {
	t.Helper()
	srv := h.a.metricsServer()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(serve.MetricsListener(inner)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return inner.Addr().String()
}

// One flooding address keeps at most its share of the metrics port open: a probe from any other
// address is answered. Strangers from many addresses fill only their pool: the kubelet's probe
// of a host-network agent, which comes from the agent's own address, is still answered.
func TestMetricsListenerKeepsProbesAnswered(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.MetricsBindAddress = "127.0.0.1:0" }, testNode())
	h.a.ready.Store(true)
	h.a.intr.PollOnce(context.Background()) // every source has answered
	addr := serveMetrics(t, h)

	kept := 0
	for range serve.MetricsOthersPool.PerSource + 4 {
		if request(t, dialFrom(t, "127.0.0.2", addr), "/healthz") == http.StatusOK {
			kept++
		}
	}
	if kept != serve.MetricsOthersPool.PerSource {
		t.Errorf("one address kept %d idle connections, want %d", kept, serve.MetricsOthersPool.PerSource)
	}
	if code := request(t, dialFrom(t, "127.0.0.3", addr), "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz from another address during one address's flood: %d, want 200", code)
	}

	// Fill the others' pool from many addresses.
	for i := 0; kept < serve.MetricsOthersPool.Total; i++ {
		src := fmt.Sprintf("127.0.1.%d", i/serve.MetricsOthersPool.PerSource+1)
		if request(t, dialFrom(t, src, addr), "/healthz") == http.StatusOK {
			kept++
		}
	}
	if code := request(t, dialFrom(t, "127.0.2.1", addr), "/healthz"); code != 0 {
		t.Errorf("a stranger past the pool's %d: %d, want the connection closed", serve.MetricsOthersPool.Total, code)
	}
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		if code := request(t, dialFrom(t, "127.0.0.1", addr), path); code != http.StatusOK {
			t.Errorf("%s from the host itself with the others' pool full: %d, want 200", path, code)
		}
	}
}

// Strangers to the notice endpoint, from as many addresses as they like, cannot take the
// connections of the node's pods (issue 22, item 4): a pod is answered while they hold theirs.
func TestNoticeListenerStrangersCannotLockOutPods(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "127.0.0.5", 30))
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, clocktesting.NewFakeClock(t0), podnotice.WaitersMax)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: serve.ReadHeaderTimeout}
	ln := serve.NewListener(inner, s.Pool)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := inner.Addr().String()

	// Strangers that open connections and send nothing, two from each address and then some.
	for i := range podnotice.StrangerPool.Total + 8 {
		dialFrom(t, fmt.Sprintf("127.0.3.%d", i/2+1), addr)
	}
	dialFrom(t, "127.0.3.1", addr)
	c := dialFrom(t, "127.0.0.5", addr)
	if code := request(t, c, "/v1/pods/ns/job/notice"); code != http.StatusOK {
		t.Errorf("the job while strangers hold their pool: %d, want 200", code)
	}
	if code := request(t, c, "/v1/pods/ns/job/notice"); code != http.StatusOK {
		t.Errorf("the job's second request on its kept-alive connection: %d, want 200", code)
	}
	// The listener accepts in order: once the job's connection is in, every stranger's before
	// it has been kept or closed.
	strangers, pods := ln.Open(podnotice.StrangerPool), ln.Open(podnotice.PodPool)
	if strangers != podnotice.StrangerPool.Total || pods != 1 {
		t.Errorf("open: %d strangers' and %d pods' connections; want %d and 1", strangers, pods, podnotice.StrangerPool.Total)
	}
	// Past the full pool, a stranger's connection is closed at once.
	s2 := dialFrom(t, "127.0.4.1", addr)
	if !refused(t, s2) {
		t.Error("a stranger past the full pool was kept")
	}
}

// deadlineListener records the last write deadline set on each connection it accepted.
type deadlineListener struct {
	net.Listener
	mu   sync.Mutex
	last map[string]time.Time // by the client's address
}

type deadlineConn struct {
	net.Conn
	l *deadlineListener
}

func (l *deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &deadlineConn{Conn: c, l: l}, nil
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.l.mu.Lock()
	c.l.last[c.RemoteAddr().String()] = t
	c.l.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

// The notice server's write timeout bounds quick answers; a hanging GET moves its own
// connection's deadline past its wait, or the server would cut it off at the write timeout.
func TestNoticeServerHangingGETOutlivesTheWriteTimeout(t *testing.T) {
	h := newHarness(t, nil, testNode(), podWithIP("job", "127.0.0.5", 30))
	clk := clocktesting.NewFakeClock(t0)
	s := podnotice.NewEndpoint(h.a.podNotice, h.a.podLister, clk, 0)
	srv := podnotice.NewServer(s.Handler())
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 ||
		srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("timeouts: header %v, read %v, write %v, idle %v, MaxHeaderBytes %d; want each set, a few KiB of header",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &deadlineListener{Listener: inner, last: map[string]time.Time{}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := dialFrom(t, "127.0.0.5", inner.Addr().String())
	done := make(chan int, 1)
	go func() { done <- request(t, c, "/v1/pods/ns/job/notice?wait=true&timeout_sec=300") }()
	for clk.Waiters() == 0 {
		runtime.Gosched()
	}
	ln.mu.Lock()
	deadline := ln.last[c.LocalAddr().String()]
	ln.mu.Unlock()
	if left := time.Until(deadline); left < 300*time.Second {
		t.Errorf("a 300 s hanging GET's connection has %v left to write; want more than its wait", left.Round(time.Second))
	}
	clk.Step(300 * time.Second)
	if code := <-done; code != http.StatusOK {
		t.Errorf("the hanging GET at its timeout: %d, want 200", code)
	}
}

// TestReadyzSaysTheEvictionMode: a ready agent's /readyz body names who deletes the pods at an
// interruption (--interruption-eviction), so that a probe's output or a curl shows the mode.
func TestReadyzSaysTheEvictionMode(t *testing.T) {
	for mode, want := range map[string]string{
		"kube-controller-manager": "interruption eviction: kube-controller-manager: under the interruption taint cloud=spot:NoExecute",
		"reprieve":                "interruption eviction: reprieve: the interruption taint cloud=spot:NoSchedule",
	} {
		h := newHarness(t, func(c *config.Config) { c.MetricsBindAddress = "127.0.0.1:0"; c.InterruptionEviction = mode }, testNode())
		h.a.ready.Store(true)
		h.a.intr.PollOnce(context.Background())
		addr := serveMetrics(t, h)
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "ok\n") || !strings.Contains(string(body), want) {
			t.Errorf("%s: /readyz %d %q; want 200, ok and %q", mode, resp.StatusCode, body, want)
		}
	}
}
