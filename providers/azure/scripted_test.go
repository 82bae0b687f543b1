package azure

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// reply is one scripted answer.
type reply struct {
	status int    // 0 means 200
	body   string // a testdata file when it starts with "@"
	hang   bool   // never answer: block until the client gives up or the server closes
	// gate, when set, holds the answer until it is closed (a slow first call).
	gate chan struct{}
	// endless answers with status and a body that never ends, sent as fast as the client
	// reads it, without a Content-Length: a spoofed endpoint or a node-local metadata proxy
	// that streams for the poll's whole timeout (issue 39 item 4). Past endlessCap bytes it
	// stops sending and blocks like hang, so that a client that does not bound what it reads
	// fills the test's memory no further.
	endless bool
}

// endlessCap is how much an endless reply sends before it stalls: many times the limit, small
// enough for the test machine.
const endlessCap = 64 << 20

// request is what the scripted server received.
type request struct {
	method, path, query, metadata, contentType, body string
}

// scripted is an httptest IMDS whose answers a test scripts per path: queued replies are used
// once each, in order, and the last one sticks. It checks nothing, so that the tests of payloads
// and failures do not depend on the fake's reading of the protocol; azureevents covers that.
type scripted struct {
	t      testing.TB
	srv    *httptest.Server
	closed chan struct{}

	mu       sync.Mutex
	replies  map[string][]reply
	requests []request

	// streamed counts the body bytes endless replies handed to the kernel.
	streamed atomic.Int64
}

func newScripted(t testing.TB) *scripted {
	t.Helper()
	s := &scripted{t: t, closed: make(chan struct{}), replies: map[string][]reply{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		close(s.closed) // release hanging handlers: Close waits for them
		s.srv.Close()
	})
	return s
}

const (
	eventsPath  = "/metadata/scheduledevents"
	computePath = "/metadata/instance/compute"
)

// script replaces path's answers.
func (s *scripted) script(path string, rs ...reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies[path] = rs
}

// events makes the scheduled events path answer 200 with body from now on.
func (s *scripted) events(body string) { s.script(eventsPath, reply{body: body}) }

// count returns how many requests with method reached path.
func (s *scripted) count(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.method == method && r.path == path {
			n++
		}
	}
	return n
}

func (s *scripted) recorded() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.requests...)
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, request{
		method: r.Method, path: r.URL.Path, query: r.URL.RawQuery,
		metadata: r.Header.Get("Metadata"), contentType: r.Header.Get("Content-Type"), body: string(b),
	})
	var rep *reply
	if rs := s.replies[r.URL.Path]; len(rs) > 0 {
		rep = &rs[0]
		if len(rs) > 1 {
			s.replies[r.URL.Path] = rs[1:]
		}
	}
	s.mu.Unlock()
	if rep == nil {
		http.Error(w, "no script", http.StatusNotFound)
		return
	}
	if rep.hang {
		select {
		case <-r.Context().Done():
		case <-s.closed:
		}
		return
	}
	if rep.gate != nil {
		select {
		case <-rep.gate:
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		}
	}
	status := rep.status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if rep.endless {
		chunk := []byte(strings.Repeat(`{"DocumentIncarnation": 1, "Events": []} `, 1<<10))
		for s.streamed.Load() < endlessCap {
			n, err := w.Write(chunk)
			s.streamed.Add(int64(n))
			if err != nil {
				return // the client went away
			}
		}
		select {
		case <-r.Context().Done():
		case <-s.closed:
		}
		return
	}
	io.WriteString(w, body(s.t, rep.body))
}

// body returns a testdata file for "@name", else s itself.
func body(t testing.TB, s string) string {
	t.Helper()
	if len(s) > 0 && s[0] == '@' {
		b, err := os.ReadFile(filepath.Join("testdata", s[1:]))
		if err != nil {
			t.Errorf("reading testdata: %v", err) // not Fatalf: handlers call this too
		}
		return string(b)
	}
	return s
}
