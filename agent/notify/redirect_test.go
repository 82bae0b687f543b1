package notify

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRedirectNotFollowed: a receiver that redirects gets one request and no retry, the target
// of the redirect gets nothing (Go would forward the custom headers, an API key among them), and
// the error names the redirect without the URL's token.
func TestRedirectNotFollowed(t *testing.T) {
	target := newReceiver(t)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/collect", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)
	cfg := testConfig(redirector.URL + "/services/T000/s3cretT0ken")
	cfg.Headers = map[string]string{"X-Api-Key": "k3y"}
	n, _, ct := newTestNotifier(t, cfg)

	res := n.post(context.Background(), []byte(`{"text":"x"}`))
	if res.err == nil || res.retry {
		t.Fatalf("post through a redirect: err %v, retry %v; want a failure without retry", res.err, res.retry)
	}
	if !strings.Contains(res.err.Error(), "redirect") || strings.Contains(res.err.Error(), "s3cretT0ken") {
		t.Errorf("error %q: want it to name the redirect and not the URL's token", res.err)
	}
	if got := len(target.requests()); got != 0 {
		t.Errorf("the redirect's target got %d requests (with the API key); want none", got)
	}
	if got := ct.n.Load(); got != 1 {
		t.Errorf("%d requests sent, want exactly the first", got)
	}
}

// TestSendErrorsRedacted: on the send path, a connection failure's error carries neither the
// URL's token nor a header value.
func TestSendErrorsRedacted(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/services/T000/s3cretT0ken"
	srv.Close() // nothing listens there any more: connection refused
	cfg := testConfig(url)
	cfg.Headers = map[string]string{"Authorization": "Bearer k3y"}
	n, _, _ := newTestNotifier(t, cfg)
	res := n.post(context.Background(), []byte(`{}`))
	if res.err == nil || !res.retry {
		t.Fatalf("post to a closed port: err %v, retry %v; want a failure to retry", res.err, res.retry)
	}
	for _, secret := range []string{"s3cretT0ken", "k3y", srv.URL} {
		if strings.Contains(res.err.Error(), secret) {
			t.Errorf("error %q contains %q", res.err, secret)
		}
	}
}
