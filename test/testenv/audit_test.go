package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReadAudit reads kube-apiserver's JSON audit lines as v1.37 writes them: the events of the
// ResponseComplete stage only, a line still being written left for the next read, and the first
// accepted end of a pod picked by when the server received it.
func TestReadAudit(t *testing.T) {
	const lines = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/pods/p/eviction","verb":"create","user":{"username":"system:serviceaccount:reprieve:reprieve"},"objectRef":{"resource":"pods","namespace":"ns","name":"p","apiVersion":"v1","subresource":"eviction"},"responseStatus":{"metadata":{},"status":"Failure","reason":"TooManyRequests","code":429},"requestReceivedTimestamp":"2026-12-05T10:00:01.000100Z","stageTimestamp":"2026-12-05T10:00:01.020000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"c","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/pods/p","verb":"delete","user":{"username":"testenv-admin"},"objectRef":{"resource":"pods","namespace":"ns","name":"p","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestObject":{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0},"requestReceivedTimestamp":"2026-12-05T10:00:03.500000Z","stageTimestamp":"2026-12-05T10:00:03.510000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/pods/p/eviction","verb":"create","user":{"username":"system:serviceaccount:reprieve:reprieve"},"objectRef":{"resource":"pods","namespace":"ns","name":"p","apiVersion":"v1","subresource":"eviction"},"responseStatus":{"metadata":{},"code":201},"requestObject":{"kind":"Eviction","apiVersion":"policy/v1","metadata":{"name":"p","namespace":"ns"},"deleteOptions":{"gracePeriodSeconds":5,"preconditions":{"uid":"u"}}},"requestReceivedTimestamp":"2026-12-05T10:00:02.250000Z","stageTimestamp":"2026-12-05T10:00:04.000000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"d","stage":"Panic","verb":"delete","objectRef":{"resource":"pods","namespace":"ns","name":"p"},"responseStatus":{"code":500},"requestReceivedTimestamp":"2026-12-05T10:00:00.000000Z","stageTimestamp":"2026-12-05T10:00:00.000000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"e","stage":"ResponseCompl`
	path := filepath.Join(t.TempDir(), "kube-apiserver-audit.log")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	events, err := readAudit(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 3 {
		t.Fatalf("read %d events, want the 3 complete ResponseComplete lines: %+v", len(events), events)
	}
	first, ok := FirstPodEnd(events, "ns", "p")
	want := time.Date(2026, 12, 5, 10, 0, 2, 250_000_000, time.UTC)
	if !ok || first.Verb != "create" || !first.Received.Equal(want) || first.Answered.Sub(first.Received) != 1750*time.Millisecond {
		t.Errorf("first end of ns/p: %+v, %v; want the accepted eviction received at %v, answered 1.75 s later", first, ok, want)
	}
	if g, ok := first.Grace(); !ok || g != 5*time.Second {
		t.Errorf("the eviction's grace: %v, %v; want 5s", g, ok)
	}
	if g, ok := events[1].Grace(); !ok || g != 0 || events[1].Verb != "delete" {
		t.Errorf("the delete's grace: %v, %v; want 0s", g, ok)
	}
	if _, ok := events[0].Grace(); ok {
		t.Error("a request without a body has a grace")
	}
	if _, ok := FirstPodEnd(events, "ns", "q"); ok {
		t.Error("an end of ns/q found where the log has none")
	}
	if _, err := readAudit(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("reading a missing audit log: no error")
	}
}
