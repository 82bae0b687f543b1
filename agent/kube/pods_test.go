package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// TestPodWritesDiscardTheAnswer answers a pod patch and a pod delete with a 4 MiB pod, as a
// server that ignores the Accept's conversion would (a tenant's pod, issue 39 item 3): the client
// reads it into nothing, allocating far less than the pod, and still returns the server's errors
// as API errors.
func TestPodWritesDiscardTheAnswer(t *testing.T) {
	big := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","annotations":{"a":"` + strings.Repeat("x", 4<<20) + `"}}}`)
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Accept"); got != metadataOnly {
			t.Errorf("%s with Accept %q; want %q", r.Method, got, metadataOnly)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status != http.StatusOK {
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
			return
		}
		_, _ = w.Write(big) // made once: the server's allocations count in this process too
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	UseProtobuf(cfg)
	c, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	write := map[string]func() error{
		"patch": func() error {
			p, err := c.CoreV1().Pods("ns").Patch(ctx, "p", types.StrategicMergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status")
			if err == nil && (p.Name != "p" || p.Namespace != "ns") {
				t.Errorf("the patch returned %s/%s; want ns/p", p.Namespace, p.Name)
			}
			return err
		},
		"delete": func() error { return c.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{}) },
	}
	for name, f := range write {
		if err := f(); err != nil { // warm the connection and the client
			t.Fatalf("%s: %v", name, err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Errorf("%s of a 4 MiB pod allocated %d KiB; want the answer discarded (under 1 MiB)", name, alloc>>10)
		}
	}
	status = http.StatusNotFound
	for name, f := range write {
		if err := f(); !apierrors.IsNotFound(err) {
			t.Errorf("%s answered 404: %v; want a NotFound API error", name, err)
		}
	}
}
