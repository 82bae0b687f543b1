package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// imdsFake is a minimal IMDSv2 endpoint whose spot notice the benchmark switches on and off at
// will (amazon-ec2-metadata-mock fixes its notice when it starts). It answers what the agent's
// AWS provider reads: the token, spot/instance-action (404 while nothing is pending),
// events/maintenance/scheduled ([]) and the rebalance recommendation (404).
type imdsFake struct {
	mu     sync.Mutex
	notice string
	srv    *http.Server
	URL    string
}

func startIMDSFake() (*imdsFake, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the IMDS fake: %w", err)
	}
	f := &imdsFake{URL: "http://" + ln.Addr().String()}
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := f.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("bench: IMDS fake: %v\n", err)
		}
	}()
	return f, nil
}

func (f *imdsFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		if ttl == "" {
			ttl = "21600"
		}
		// The SDK rejects a token answer without the TTL header.
		w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", ttl)
		_, _ = w.Write([]byte("bench-token"))
	case r.Method != http.MethodGet:
		w.WriteHeader(http.StatusMethodNotAllowed)
	case strings.HasSuffix(r.URL.Path, "/spot/instance-action"):
		f.mu.Lock()
		notice := f.notice
		f.mu.Unlock()
		if notice == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(notice))
	case strings.HasSuffix(r.URL.Path, "/events/maintenance/scheduled"):
		_, _ = w.Write([]byte("[]"))
	default:
		http.NotFound(w, r)
	}
}

// Post makes a terminate notice for deadline visible and returns the moment it became so.
func (f *imdsFake) Post(deadline time.Time) time.Time {
	body := fmt.Sprintf(`{"action": "terminate", "time": %q}`, deadline.UTC().Format(time.RFC3339))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notice = body
	return time.Now()
}

// Withdraw removes the notice.
func (f *imdsFake) Withdraw() {
	f.mu.Lock()
	f.notice = ""
	f.mu.Unlock()
}

func (f *imdsFake) Close() { _ = f.srv.Close() }
