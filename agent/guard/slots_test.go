package guard

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
)

// TestHandlerSlotAfterBody sends, from one source allowed one review in flight, a review whose
// body does not come (issue 39 item 1: headers, then nothing): it must hold no review slot, so
// that the same source's complete review is still answered while it waits.
func TestHandlerSlotAfterBody(t *testing.T) {
	p := &pods{byName: map[string]*v1.Pod{"ns/on-a": pod("on-a", "node-a", "uid-a")}}
	lim, _ := newTestLimiter(t, Limits{InFlightPerSource: 1, InFlight: 1, PodReadsPerSecond: 100, PodReadBurst: 100, ConnsPerSource: 1, Conns: 1, Sources: 10})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{Username: agentUser, GetPod: p.get, Limits: lim, Metrics: m}
	pr, pw := io.Pipe()
	slow := httptest.NewRequest(http.MethodPost, PathValidate, pr)
	slow.RemoteAddr = "127.0.0.2:1000"
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, slow)
		done <- w
	}()
	// The slow request is in its body read (it has written nothing yet); the complete one:
	if _, err := pw.Write([]byte("{")); err != nil {
		t.Fatal(err)
	}
	if w := postFrom(h, "127.0.0.2:1001", reviewBody(t, "on-a")); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"allowed":true`) {
		t.Errorf("a complete review while the same source's body is awaited: %d %s; want it allowed (the slot is taken after the body)", w.Code, w.Body)
	}
	_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	if w := <-done; w.Code != http.StatusBadRequest {
		t.Errorf("the review whose body broke off: %d; want 400", w.Code)
	}
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultRejected)); got != 1 {
		t.Errorf("rejected = %v; want 1 (the broken body)", got)
	}
	if got := testutil.ToFloat64(m.ReviewsTotal.WithLabelValues(ResultError)); got != 0 {
		t.Errorf("error = %v; want 0", got)
	}
}

// TestServeBodyDeadline sends headers announcing a 4 KiB body and no body to a served guard: it
// answers 400 and closes the connection within bodyReadTimeout (and well before the server's
// 10 s ReadTimeout), instead of waiting for the body as long as the caller likes.
func TestServeBodyDeadline(t *testing.T) {
	certFile, keyFile, _ := writePair(t, t.TempDir(), "guard", time.Now())
	certs, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServerOptions{BindAddress: "127.0.0.1:0", Certs: certs, Handler: &Handler{Username: agentUser},
			Gatherer: prometheus.NewRegistry(), Listening: func(a net.Addr) { addrc <- a }})
	}()
	addr := (<-addrc).String()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("POST " + PathValidate + " HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// The test's own bound on the wait, past which the guard held the connection too long.
	_ = c.SetReadDeadline(time.Now().Add(bodyReadTimeout + 3*time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("no answer to a review without its body after %v: %v; want a 400 within %v", took, err, bodyReadTimeout)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || took > bodyReadTimeout+2*time.Second {
		t.Errorf("a review without its body: %d after %v; want 400 within about %v", resp.StatusCode, took, bodyReadTimeout)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
}

// TestLimiterKeepsTheReserveForLightSources runs three sources that read all their own budget
// allows (issue 39 item 1's second route: together past the shared budget) and one that reads
// five times a second, as the API server's reviews of a drain might, for a minute of the fake
// clock: the light source is never refused, and all sources together never read more than the
// shared budget (the guard's client's own limit, so that no read waits in its queue).
func TestLimiterKeepsTheReserveForLightSources(t *testing.T) {
	l := DefaultLimits()
	lim, clk := newTestLimiter(t, l)
	heavy := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	const step = 5 * time.Millisecond
	reads, refusedLight, lightReads := 0, 0, 0
	start := clk.Now()
	for i := 0; clk.Now().Sub(start) < time.Minute; i++ {
		for _, h := range heavy {
			if lim.AllowRead(h) {
				reads++
			}
		}
		if i%40 == 0 { // every 200 ms
			if lim.AllowRead("192.0.2.1") {
				reads++
				lightReads++
			} else {
				refusedLight++
			}
		}
		clk.SetTime(clk.Now().Add(step))
	}
	if refusedLight > 0 {
		t.Errorf("the light source was refused %d of %d reads; want none while the heavy ones flood", refusedLight, refusedLight+lightReads)
	}
	shared := 2*float64(l.PodReadBurst) + 2*float64(l.PodReadsPerSecond)*time.Minute.Seconds()
	if float64(reads) > shared {
		t.Errorf("%d reads in a minute; want at most the shared budget, %.0f", reads, shared)
	}
	// The heavy ones got the rest: the budget is not left idle.
	if float64(reads) < 0.9*2*float64(l.PodReadsPerSecond)*time.Minute.Seconds() {
		t.Errorf("only %d reads in a minute; want about the shared budget used", reads)
	}
}

// TestConnLimitListenerKeepsAReserve fills the connections that sources holding all they may
// can take (issue 39 item 1: slow bodies from many addresses): the last quarter stays for
// sources that hold few, one each here, so that a newcomer such as the API server still gets in;
// a source past the reserve's share, or one that holds many, does not.
func TestConnLimitListenerKeepsAReserve(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// 8 in all, 4 per source: 6 for anyone, the last 2 for sources holding fewer than 1.
	ln := connLimitListener(inner, 8, 4, nil)
	defer ln.Close()
	accepted := make(chan net.Conn, 20)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	// kept dials from src and says whether the guard kept the connection: a kept one comes out
	// of Accept, a refused one is reset at once.
	kept := func(src string) bool {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", inner.Addr().String())
		if errors.Is(err, syscall.ECONNRESET) {
			return false // reset before the dial returned
		}
		if err != nil {
			t.Skipf("dialing from %s: %v (a loopback address other than 127.0.0.1 is needed)", src, err)
		}
		open = append(open, c)
		reset := make(chan struct{})
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					close(reset)
				}
			}
		}()
		select {
		case s := <-accepted:
			open = append(open, s)
			return true
		case <-reset:
			return false
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection from %s neither accepted nor reset", src)
			return false
		}
	}
	for i := range 4 {
		if !kept("127.0.0.2") {
			t.Fatalf("connection %d of 127.0.0.2 refused; want four", i+1)
		}
	}
	for i := range 2 {
		if !kept("127.0.0.3") {
			t.Fatalf("connection %d of 127.0.0.3 refused; want two (six in all)", i+1)
		}
	}
	if kept("127.0.0.3") {
		t.Error("127.0.0.3's third connection kept with six open: it holds two, more than the reserve's one a source")
	}
	if !kept("127.0.0.4") {
		t.Error("a newcomer refused with six of eight open; want the reserve for it")
	}
	if kept("127.0.0.4") {
		t.Error("the newcomer's second connection kept: the reserve gives one a source")
	}
	if !kept("127.0.0.5") {
		t.Error("a second newcomer refused with seven of eight open")
	}
	if kept("127.0.0.6") {
		t.Error("a ninth connection kept; want the cap in all")
	}
}
