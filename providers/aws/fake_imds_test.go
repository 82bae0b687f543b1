package aws

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// The IMDSv2 wire names, as AWS spells them. The SDK reads the TTL response header under
// the canonical form and rejects a token response without it.
const (
	imdsTokenPath          = "/latest/api/token"
	imdsMetaPrefix         = "/latest/meta-data/"
	imdsTokenHeader        = "X-aws-ec2-metadata-token"
	imdsTTLRequestHeader   = "X-aws-ec2-metadata-token-ttl-seconds"
	imdsTTLResponseHeader  = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
	imdsMaxTokenTTLSeconds = 21600
)

// fault is a way for a scripted response to misbehave.
type fault int

const (
	// faultNone answers with the scripted status and body.
	faultNone fault = iota
	// faultHang never answers: it blocks until the client gives up (its context ends and it
	// closes the connection) or the fake is closed.
	faultHang
	// faultHangBody sends the status line, headers and the first half of the body, then
	// blocks like faultHang: only the client's context bounds the body read.
	faultHangBody
	// faultTruncate declares a Content-Length longer than the body it sends, then closes
	// the connection: the client sees an unexpected EOF.
	faultTruncate
	// faultEndless answers with the scripted status and a body that never ends, sent as fast
	// as the client reads it, without a Content-Length: a spoofed endpoint or a node-local
	// metadata proxy that streams for the poll's whole timeout (issue 39 item 4). Past
	// endlessCap bytes it stops sending and blocks like faultHang, so that a client that does
	// not bound what it reads fills the test's memory no further; to that client the body
	// still never ends.
	faultEndless
)

// endlessCap is how much faultEndless sends before it stalls: many times any limit a
// client should have, small enough for the test machine.
const endlessCap = 64 << 20

// imdsResponse is one scripted answer.
type imdsResponse struct {
	status int
	body   string
	fault  fault
}

// fakeIMDS is an httptest IMDSv2 server. Tokens come from PUT /latest/api/token with a TTL of
// 1..21600 s and expire on the fake's clock (which may be a fake clock shared with the
// provider) or when revoked; every GET needs a live token (401 otherwise, as AWS answers).
// Each path answers from a script: queued responses are used once each, in order, and the
// last one sticks; a path without a script answers 404, IMDS's "nothing pending".
type fakeIMDS struct {
	t      testing.TB
	srv    *httptest.Server
	clock  clock.PassiveClock
	closed chan struct{}

	mu       sync.Mutex
	seq      int
	tokens   map[string]time.Time // token -> expiry on f.clock
	scripts  map[string][]imdsResponse
	requests map[string]int // "METHOD /path" -> count, every request received
	denied   int            // requests answered 401 for a missing or dead token

	// streamed counts the body bytes faultEndless handed to the kernel.
	streamed atomic.Int64
}

// newFakeIMDS starts a fake on loopback; it is closed when the test ends. clk decides when
// tokens expire; nil means the real clock.
func newFakeIMDS(t testing.TB, clk clock.PassiveClock) *fakeIMDS {
	t.Helper()
	if clk == nil {
		clk = clock.RealClock{}
	}
	f := &fakeIMDS{
		t:        t,
		clock:    clk,
		closed:   make(chan struct{}),
		tokens:   map[string]time.Time{},
		scripts:  map[string][]imdsResponse{},
		requests: map[string]int{},
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	// A small send buffer, so that what an endless body leaves in the kernel stays small and
	// streamed says what the client took.
	f.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(smallSocketBuffer)
		}
		return ctx
	}
	f.srv.Start()
	t.Cleanup(func() {
		// Release hanging handlers first: httptest.Server.Close waits for them.
		close(f.closed)
		f.srv.Close()
	})
	return f
}

// URL is the endpoint to give the provider.
func (f *fakeIMDS) URL() string { return f.srv.URL }

// script replaces path's answers. path is relative to /latest/meta-data/ ("spot/instance-action")
// or absolute ("/latest/api/token", to make the token endpoint misbehave).
func (f *fakeIMDS) script(path string, rs ...imdsResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[fullPath(path)] = rs
}

// set makes path answer status and body from now on.
func (f *fakeIMDS) set(path string, status int, body string) {
	f.script(path, imdsResponse{status: status, body: body})
}

// setFile makes path answer 200 with a file from testdata/.
func (f *fakeIMDS) setFile(path, name string) {
	f.set(path, http.StatusOK, readTestdata(f.t, name))
}

// notFound makes path answer 404 from now on.
func (f *fakeIMDS) notFound(path string) { f.script(path) }

// fail makes path misbehave from now on.
func (f *fakeIMDS) fail(path string, flt fault, status int, body string) {
	f.script(path, imdsResponse{status: status, body: body, fault: flt})
}

// revokeTokens kills every token issued so far, as if each had reached its TTL.
func (f *fakeIMDS) revokeTokens() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.tokens)
}

// count returns how many requests with method reached path.
func (f *fakeIMDS) count(method, path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[method+" "+fullPath(path)]
}

// gets returns how many GETs reached a metadata path, authorised or not.
func (f *fakeIMDS) gets(path string) int { return f.count(http.MethodGet, path) }

// tokenPuts returns how many tokens were asked for.
func (f *fakeIMDS) tokenPuts() int { return f.count(http.MethodPut, imdsTokenPath) }

// unauthorized returns how many requests were refused for a missing or dead token.
func (f *fakeIMDS) unauthorized() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.denied
}

func fullPath(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return imdsMetaPrefix + p
}

func (f *fakeIMDS) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests[r.Method+" "+r.URL.Path]++
	var resp *imdsResponse
	if rs := f.scripts[r.URL.Path]; len(rs) > 0 {
		resp = &rs[0]
		if len(rs) > 1 {
			f.scripts[r.URL.Path] = rs[1:]
		}
	}
	f.mu.Unlock()

	if r.URL.Path == imdsTokenPath {
		if resp != nil {
			f.answer(w, r, *resp)
			return
		}
		f.issueToken(w, r)
		return
	}
	if !f.authorised(r) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if resp == nil {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	f.answer(w, r, *resp)
}

// issueToken answers PUT /latest/api/token as AWS does: 405 for another method, 403 when the
// request went through a proxy, 400 without a TTL in 1..21600.
func (f *fakeIMDS) issueToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get(imdsTTLRequestHeader))
	if err != nil || ttl < 1 || ttl > imdsMaxTokenTTLSeconds {
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.seq++
	tok := fmt.Sprintf("fake-token-%d", f.seq)
	f.tokens[tok] = f.clock.Now().Add(time.Duration(ttl) * time.Second)
	f.mu.Unlock()
	w.Header().Set(imdsTTLResponseHeader, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprint(w, tok)
}

func (f *fakeIMDS) authorised(r *http.Request) bool {
	tok := r.Header.Get(imdsTokenHeader)
	f.mu.Lock()
	defer f.mu.Unlock()
	exp, ok := f.tokens[tok]
	if ok && f.clock.Now().Before(exp) {
		return true
	}
	delete(f.tokens, tok)
	f.denied++
	return false
}

func (f *fakeIMDS) answer(w http.ResponseWriter, r *http.Request, resp imdsResponse) {
	status := resp.status
	if status == 0 {
		status = http.StatusOK
	}
	switch resp.fault {
	case faultHang:
		f.block(r)
	case faultHangBody:
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.body)))
		w.WriteHeader(status)
		fmt.Fprint(w, resp.body[:len(resp.body)/2])
		w.(http.Flusher).Flush()
		f.block(r)
	case faultTruncate:
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			f.t.Errorf("fake IMDS: hijacking for a truncated body: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			status, http.StatusText(status), len(resp.body)+64, resp.body)
		buf.Flush()
	case faultEndless:
		w.WriteHeader(status)
		chunk := []byte(strings.Repeat(`{"action": "terminate", "time": "2017-09-18T08:22:00Z"} `, 1<<10))
		for f.streamed.Load() < endlessCap {
			n, err := w.Write(chunk)
			f.streamed.Add(int64(n))
			if err != nil {
				return // the client went away
			}
		}
		w.(http.Flusher).Flush()
		f.block(r)
	default:
		if strings.HasPrefix(strings.TrimSpace(resp.body), "{") || strings.HasPrefix(strings.TrimSpace(resp.body), "[") {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		fmt.Fprint(w, resp.body)
	}
}

// block waits until the client goes away or the fake closes.
func (f *fakeIMDS) block(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-f.closed:
	}
}

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("reading testdata: %v", err)
	}
	return string(b)
}
