package aws

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// smallSocketBuffer is the socket buffer the endless-body tests ask for at both ends, so that
// the bytes the kernel holds between them stay small beside the limit: what the fake streamed
// is then close to what the client took.
const smallSocketBuffer = 64 << 10

// countingClient returns an HTTP client whose connections count every byte they read off the
// socket into read, with a small receive buffer.
func countingClient(read *atomic.Int64) *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(smallSocketBuffer)
			}
			return &countingConn{Conn: c, read: read}, nil
		},
	}}
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

// TestPollBoundsAnEndlessAnswer (issue 39 item 4): the 1 MiB limit the provider had was applied
// to a body the SDK had already read whole (feature/ec2/imds's deserializer reads every answer
// with io.ReadAll before GetMetadata returns), so an endpoint that streams without end filled
// memory for the poll's whole timeout. The poll must fail on the limit, having read little
// more than it, well before its context ends; the token's answer is bounded the same way.
func TestPollBoundsAnEndlessAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		status     int
		sdkClient  bool
	}{
		{name: "a notice path", path: PathSpotInstanceAction, status: http.StatusOK},
		{name: "an error answer", path: PathRebalance, status: http.StatusInternalServerError},
		{name: "the token", path: imdsTokenPath, status: http.StatusOK},
		{name: "the SDK's own HTTP client", path: PathScheduledEvents, status: http.StatusOK, sdkClient: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeIMDS(t, nil)
			f.fail(tc.path, faultEndless, tc.status, "")
			var read atomic.Int64
			opts := Options{Endpoint: f.URL(), HTTPClient: countingClient(&read)}
			if tc.sdkClient {
				opts.HTTPClient = nil
			}
			p, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			// A deadline of the caller's own keeps the SDK's 5 s per-call timeout off: only the
			// limit may end the read.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = p.Poll(ctx)
			if err == nil {
				t.Fatalf("Poll: no error; want %v", ErrTooLarge)
			}
			if !errors.Is(err, ErrTooLarge) {
				t.Errorf("Poll: %v; want %v", err, ErrTooLarge)
			}
			if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
				t.Errorf("Poll: %v; the limit, not the deadline, must end the read", err)
			}
			if want := strconv.Itoa(MaxBody); !strings.Contains(err.Error(), want) {
				t.Errorf("Poll: %q does not name the limit (%s bytes)", err, want)
			}
			if tc.path != imdsTokenPath {
				if paths := errPaths(err); len(paths) != 1 || paths[0] != tc.path {
					t.Errorf("failed sources %q, want only %s", paths, tc.path)
				}
			}
			// The client's side: what it took off the socket. The fake's side: what it could
			// hand to the kernel before the client stopped reading (both ends' small buffers
			// between them). A client that reads the whole answer takes endlessCap. The SDK's
			// own client has the kernel's receive buffer, which grows to 32 MiB: there only
			// the fake's side is bounded, and loosely.
			const slack = 1 << 20
			bound := int64(MaxBody + 2*slack)
			if tc.sdkClient {
				bound = endlessCap / 2
			} else if got := read.Load(); got > MaxBody+slack {
				t.Errorf("the client read %d bytes; want at most the limit %d and %d of slack", got, MaxBody, slack)
			}
			if got := f.streamed.Load(); got > bound {
				t.Errorf("the fake streamed %d bytes before the client stopped; want at most %d (cap %d)", got, bound, endlessCap)
			}
			t.Logf("the fake streamed %d bytes, the client read %d (limit %d)", f.streamed.Load(), read.Load(), MaxBody)
		})
	}
}
