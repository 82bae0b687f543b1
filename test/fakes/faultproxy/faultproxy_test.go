package faultproxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

func TestModes(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
			http.Error(w, "X-Forwarded-For header is not allowed", http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "backend "+r.Method+" "+r.URL.Path)
	}))
	defer backend.Close()
	p, url := startProxy(t, backend.URL)
	client := &http.Client{Timeout: 2 * time.Second}
	get := func(method string) (int, string, error) {
		req, _ := http.NewRequest(method, url+"/x", nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	for _, tc := range []struct {
		mode   Mode
		status int
		body   string
		err    bool
	}{
		{Pass, 200, "backend GET /x", false},
		{ServerError, 503, "Service Unavailable\n", false},
		{Malformed, 200, MalformedBody, false},
		{Truncated, 200, "", true},
		{Unauthorized, 401, "Unauthorized\n", false},
		{Throttled, 429, "Too many requests\n", false},
		{Reset, 0, "", true},
	} {
		p.Set(tc.mode)
		status, body, err := get(http.MethodGet)
		if (err != nil) != tc.err || status != tc.status || (!tc.err && body != tc.body) {
			t.Errorf("%s: status %d body %q err %v; want status %d body %q err %v", tc.mode, status, body, err, tc.status, tc.body, tc.err)
		}
		if tc.mode == Truncated && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("truncated: err %v, want an unexpected EOF", err)
		}
		// Go's transport retries an idempotent request once on a connection reset.
		if n := p.Count(tc.mode); n != 1 && !(tc.mode == Reset && n == 2) {
			t.Errorf("%s: count %d, want 1", tc.mode, n)
		}
		// Writes always pass.
		if status, body, err := get(http.MethodPut); err != nil || status != 200 || body != "backend PUT /x" {
			t.Errorf("%s: PUT got %d %q %v, want it passed to the backend", tc.mode, status, body, err)
		}
	}
}

func TestHangUntilTheClientGivesUp(t *testing.T) {
	backend := httptest.NewServer(http.NotFoundHandler())
	defer backend.Close()
	p, url := startProxy(t, backend.URL)
	p.Set(Hang)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	_, err := http.DefaultClient.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want the client's deadline", err)
	}
}

func TestDownUntilStarted(t *testing.T) {
	addr, err := ReserveAddr()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("before Start: err %v, want connection refused", err)
	}
	p, err := New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start(addr); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Set(ServerError)
	resp, err := http.Get("http://" + addr)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("after Start: %v %v, want 503", resp, err)
	}
	resp.Body.Close()
}

func TestNewRejectsABadBackend(t *testing.T) {
	if _, err := New("not a url"); err == nil || !strings.Contains(err.Error(), `"not a url"`) {
		t.Errorf("err %v, want one quoting the backend", err)
	}
}

func TestHeldRequestsResetWhenTheModeChanges(t *testing.T) {
	backend := httptest.NewServer(http.NotFoundHandler())
	defer backend.Close()
	p, url := startProxy(t, backend.URL)
	p.Set(Hang)
	done := getAsync(url)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return p.Count(Hang) > 0, nil
	}); err != nil {
		t.Fatalf("the request never reached the proxy: %v", err)
	}
	p.Set(Pass)
	expectReset(t, done, "the held request")
}

// TestPassedRequestsResetWhenTheModeChanges: a request waiting at the backend (a GCP hanging
// GET) is reset when the mode changes, so the client's next request meets the new fault.
func TestPassedRequestsResetWhenTheModeChanges(t *testing.T) {
	held := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(held)
		<-r.Context().Done()
	}))
	defer backend.Close()
	p, url := startProxy(t, backend.URL)
	done := getAsync(url)
	<-held
	p.Set(ServerError)
	expectReset(t, done, "the request waiting at the backend")
}

// startProxy serves a proxy to backend on a free port until the test ends.
func startProxy(t *testing.T, backend string) (*Proxy, string) {
	t.Helper()
	p, err := New(backend)
	if err != nil {
		t.Fatal(err)
	}
	url, err := p.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, url
}

// getAsync GETs url on a connection of its own and reports the error (nil for an answer).
func getAsync(url string) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get(url)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// expectReset checks that the request behind done ended without an answer once the mode changed.
func expectReset(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("%s answered; want its connection reset", what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not released when the mode changed", what)
	}
}

// TestBlackHole: every request, the token PUT included, is accepted and never answered nor
// reset, even when the mode changes; only the client's timeout ends it.
func TestBlackHole(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "backend")
	}))
	defer backend.Close()
	p, url := startProxy(t, backend.URL)
	p.Set(BlackHole)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodPost} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, method, url+"/latest/api/token", nil)
		_, err := http.DefaultClient.Do(req)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err %v, want the client's deadline (no answer, no reset)", method, err)
		}
	}
	if n := p.Count(BlackHole); n != 3 {
		t.Errorf("count %d, want 3", n)
	}
	// A request held when the mode changes stays held: unlike Hang, nothing resets it.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/x", nil)
		_, err := http.DefaultClient.Do(req)
		errc <- err
	}()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return p.Count(BlackHole) == 4, nil
	}); err != nil {
		t.Fatal("the request never reached the proxy")
	}
	p.Set(Pass)
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("held across a mode change: err %v, want the client's deadline", err)
	}
}
