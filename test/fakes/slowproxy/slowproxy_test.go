package slowproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAddsLatencyWithoutSerialising: each request is answered at least latency later, and
// requests in flight together are not queued behind one another.
func TestAddsLatencyWithoutSerialising(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	const latency = 200 * time.Millisecond
	p, err := Start(strings.TrimPrefix(backend.URL, "http://"), latency)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	get := func() (time.Duration, error) {
		begin := time.Now()
		resp, err := client.Get("http://" + p.Addr())
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && string(b) != "ok" {
			t.Errorf("body %q", b)
		}
		return time.Since(begin), err
	}
	if d, err := get(); err != nil || d < latency {
		t.Fatalf("one request: %v, %v; want at least %v", d, err, latency)
	}
	const n = 20
	var wg sync.WaitGroup
	durs := make([]time.Duration, n)
	begin := time.Now()
	for i := range n {
		wg.Go(func() {
			d, err := get()
			if err != nil {
				t.Error(err)
			}
			durs[i] = d
		})
	}
	wg.Wait()
	total := time.Since(begin)
	for i, d := range durs {
		if d < latency {
			t.Errorf("request %d answered in %v, under the latency", i, d)
		}
	}
	// Serialised, 20 requests would take 20 x 200 ms = 4 s.
	if total > 10*latency {
		t.Errorf("%d concurrent requests took %v: the proxy serialises them", n, total)
	}
}
