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

// TestListPodMetadata lists pods' metadata: the request asks for a PartialObjectMetadataList
// with the caller's selectors and page, and the answer's items keep their UIDs. A server that
// sends whole pods anyway is read the same.
func TestListPodMetadata(t *testing.T) {
	answers := map[string]string{
		"converted": `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"continue":"next"},"items":[{"metadata":{"name":"a","namespace":"ns","uid":"u-a"}}]}`,
		"whole":     `{"kind":"PodList","apiVersion":"v1","metadata":{"continue":"next"},"items":[{"metadata":{"name":"a","namespace":"ns","uid":"u-a"},"spec":{"nodeName":"n1","containers":[{"name":"c","args":["x"]}]},"status":{"phase":"Running"}}]}`,
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get("Accept"); got != metadataListOnly {
					t.Errorf("Accept %q; want %q", got, metadataListOnly)
				}
				if r.URL.Path != "/api/v1/pods" || r.URL.Query().Get("fieldSelector") != "spec.nodeName=n1,status.phase!=Failed" || r.URL.Query().Get("limit") != "4" {
					t.Errorf("request %s?%s; want every namespace's pods with the caller's selector and limit", r.URL.Path, r.URL.RawQuery)
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(answer))
			}))
			defer srv.Close()
			c, err := NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			list, err := ListPodMetadata(context.Background(), c, "", metav1.ListOptions{FieldSelector: "spec.nodeName=n1,status.phase!=Failed", Limit: 4})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != 1 || list.Items[0].UID != "u-a" || list.Continue != "next" {
				t.Errorf("listed %+v; want pod a's UID and the next page's token", list)
			}
		})
	}
}
