package gcp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// smallSocketBuffer is the socket buffer the endless-body test asks for at both ends, so that
// the bytes the kernel holds between them stay small beside the limit.
const smallSocketBuffer = 64 << 10

// endlessCap is how much endlessServer sends before it stalls: many times the limit, small
// enough for the test machine.
const endlessCap = 64 << 20

// endlessServer answers one metadata path with 200 and a body that never ends, sent as fast as
// the client reads it, without a Content-Length: a spoofed endpoint or a node-local metadata
// proxy that streams for the poll's whole timeout (issue 39 item 4). Past endlessCap bytes it
// stops sending and holds the connection until the client goes away, so that a client that
// does not bound what it reads fills the test's memory no further. Every other path is
// answered by the gcpmeta fake behind it.
type endlessServer struct {
	srv      *httptest.Server
	streamed atomic.Int64 // body bytes handed to the kernel
}

func newEndlessServer(t *testing.T, path string) *endlessServer {
	t.Helper()
	back := startFake(t, nil)
	u, err := url.Parse("http://" + back.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite adds no X-Forwarded-For, which the metadata server (and gcpmeta) refuses.
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) }}
	e := &endlessServer{}
	done := make(chan struct{})
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/computeMetadata/v1/"+path {
			proxy.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		w.Header().Set("ETag", "endless")
		w.WriteHeader(http.StatusOK)
		chunk := []byte(strings.Repeat("TRUE", 16<<10))
		for e.streamed.Load() < endlessCap {
			n, err := w.Write(chunk)
			e.streamed.Add(int64(n))
			if err != nil {
				return // the client went away
			}
		}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	e.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(smallSocketBuffer)
		}
		return ctx
	}
	e.srv.Start()
	t.Cleanup(func() {
		close(done)
		e.srv.Close()
	})
	return e
}

// countingTransportFor returns a transport like DefaultTransport whose connections count every
// byte they read off the socket into read, with a small receive buffer.
func countingTransportFor(read *atomic.Int64) *http.Transport {
	tr := DefaultTransport()
	d := &net.Dialer{Timeout: 2 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(smallSocketBuffer)
		}
		return &countingConn{Conn: c, read: read}, nil
	}
	return tr
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestPollBoundsAnEndlessAnswer (issue 39 item 4): cloud.google.com/go/compute/metadata reads
// every answer with a bare io.ReadAll, so an endpoint that streams without end filled memory
// until the read's timeout. The transport the provider gives the library bounds each body:
// the poll fails on the limit, having read little more than it, and names it.
func TestPollBoundsAnEndlessAnswer(t *testing.T) {
	for _, path := range []string{PathPreempted, PathUpcomingMaintenance, PathMachineType} {
		t.Run(path, func(t *testing.T) {
			e := newEndlessServer(t, path)
			var read atomic.Int64
			p, err := New(Options{Endpoint: e.srv.Listener.Addr().String(), HTTPClient: &http.Client{Transport: countingTransportFor(&read)}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = p.Poll(ctx)
			if err == nil {
				t.Fatalf("Poll: no error; want %v", ErrTooLarge)
			}
			var se *SourceError
			if !errors.Is(err, ErrTooLarge) || !errors.As(err, &se) || se.Path != path {
				t.Errorf("Poll: %v; want %v from %s", err, ErrTooLarge, path)
			}
			if errors.Is(err, ErrNoAnswer) || ctx.Err() != nil {
				t.Errorf("Poll: %v; the limit, not a timeout, must end the read", err)
			}
			if want := strconv.Itoa(MaxBody); !strings.Contains(err.Error(), want) {
				t.Errorf("Poll: %q does not name the limit (%s bytes)", err, want)
			}
			// The client's side: what it took off the socket. The fake's side: what it could
			// hand to the kernel before the client stopped reading.
			const slack = 1 << 20
			if got := read.Load(); got > MaxBody+slack {
				t.Errorf("the client read %d bytes; want at most the limit %d and %d of slack", got, MaxBody, slack)
			}
			if got := e.streamed.Load(); got > MaxBody+2*slack {
				t.Errorf("the fake streamed %d bytes before the client stopped; want at most %d (cap %d)", got, MaxBody+2*slack, endlessCap)
			}
			t.Logf("the fake streamed %d bytes, the client read %d (limit %d)", e.streamed.Load(), read.Load(), MaxBody)
		})
	}
}
