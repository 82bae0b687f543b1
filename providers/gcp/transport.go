package gcp

import (
	"net/http"
	"sync"

	"github.com/reprieve-dev/reprieve/providers"
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
		resp.Body = providers.NewLimitedBody(resp.Body, resp.ContentLength, MaxBody)
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
const MaxBody = providers.MaxAnswer

// ErrTooLarge marks an answer longer than MaxBody (providers.ErrTooLarge).
var ErrTooLarge = providers.ErrTooLarge
