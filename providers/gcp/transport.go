package gcp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// transport sits between the metadata library and the caller's transport. It does the three
// things the library has no option for:
//   - sends to Options.Endpoint: the library only reads GCE_METADATA_HOST, and setting a
//     process-wide variable from a provider would leak into everything else in the process;
//   - hands the answer's ETag to the caller: GetWithContext returns only the value, and the
//     library's SubscribeWithContext, which keeps the ETag to itself, does not retry or report
//     failures the way reprieve needs (see watch.go);
//   - bounds each answer's body to MaxBody: the library reads it whole with io.ReadAll, and an
//     endpoint that streams without end would fill memory until the request's timeout.
type transport struct {
	next http.RoundTripper
	host string // "" keeps the library's host
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.host != "" && req.URL.Host != t.host {
		// A RoundTripper must not modify its request: the library retries with the same one.
		req = req.Clone(req.Context())
		req.URL.Host = t.host
		req.Host = t.host
	}
	resp, err := t.next.RoundTrip(req)
	if err == nil {
		// The library reads every answer with a bare io.ReadAll: the bound is here.
		resp.Body = newLimitedBody(resp.Body, resp.ContentLength, MaxBody)
		if sink, ok := req.Context().Value(etagKey{}).(*etagSink); ok {
			sink.set(resp.Header.Get("ETag"))
		}
	}
	return resp, err
}

// etagKey is the context key of the etagSink a request's caller wants the ETag in.
type etagKey struct{}

// etagSink receives the ETag of each answer to one GetWithContext call; after a successful
// call it holds the ETag of the answer whose value was returned, the last one.
type etagSink struct {
	mu   sync.Mutex
	etag string
}

func (s *etagSink) set(etag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.etag = etag
}

func (s *etagSink) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.etag
}

// MaxBody bounds what is read of one metadata answer; a real one is at most a few kilobytes
// (upcoming-maintenance's directory).
const MaxBody = 1 << 20

// ErrTooLarge marks an answer longer than MaxBody.
var ErrTooLarge = errors.New("answer exceeds the size limit")

// limitedBody reads at most limit bytes of a body; a byte more is ErrTooLarge, for this Read and
// every later one.
type limitedBody struct {
	rc    io.ReadCloser
	left  int64
	limit int64
	// declared is the answer's Content-Length, -1 when it has none.
	declared int64
	err      error
}

// newLimitedBody bounds rc to limit bytes; length is the declared Content-Length (-1: none).
func newLimitedBody(rc io.ReadCloser, length, limit int64) *limitedBody {
	return &limitedBody{rc: rc, left: limit, limit: limit, declared: length}
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.declared > b.limit {
		return 0, b.fail() // too long by its own account: not read at all
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.left == 0 {
		// At the limit: the answer is too long if anything follows.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, b.fail()
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) fail() error {
	b.err = fmt.Errorf("%w of %d bytes (%d MiB)", ErrTooLarge, b.limit, b.limit>>20)
	return b.err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
