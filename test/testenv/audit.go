package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The API server's own clock for the writes a timing test asserts on. A test's watch sees a
// pod's deletion when the event reaches a process that shares two cores with 30 others: on a
// loaded machine that is up to seconds after the server wrote it, and a bound on the watch's
// time measures the machine as much as the agent. The audit log says when the server received
// each request and when it answered, in microseconds, on the machine's one clock: an eviction
// took effect between the two. The policy records only the requests those tests time: a pod's
// eviction or delete with its body (the grace it asked for), a service account's write to a
// pod's status (an agent's warning or DisruptionTarget condition: while one is in flight the
// agent's gate may hold an eviction), a write to a node object (not its status), so that it
// costs the server one short line per such request.

// auditPolicy is kube-apiserver's --audit-policy-file.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  verbs: ["create"]
  resources: [{group: "", resources: ["pods/eviction"]}]
- level: Request
  verbs: ["delete"]
  resources: [{group: "", resources: ["pods"]}]
- level: Metadata
  verbs: ["patch", "update"]
  userGroups: ["system:serviceaccounts"]
  resources: [{group: "", resources: ["pods/status"]}]
- level: Metadata
  verbs: ["patch", "update"]
  resources: [{group: "", resources: ["nodes"]}]
- level: None
`

// auditFlags are the flags that make a kube-apiserver write its audit log to path.
func (e *Env) auditFlags(path string) []string {
	return []string{"--audit-policy-file=" + filepath.Join(e.dataDir, "audit-policy.yaml"), "--audit-log-path=" + path,
		"--audit-log-format=json", "--audit-log-mode=blocking"}
}

// writeAuditPolicy writes the policy auditFlags names.
func (e *Env) writeAuditPolicy() error {
	if err := os.WriteFile(filepath.Join(e.dataDir, "audit-policy.yaml"), []byte(auditPolicy), 0o600); err != nil {
		return fmt.Errorf("writing the audit policy: %w", err)
	}
	return nil
}

// AuditEvent is one request as the API server's audit log records it (the fields of
// k8s.io/apiserver/pkg/apis/audit/v1.Event the tests read).
type AuditEvent struct {
	Verb string `json:"verb"`
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// Received is when the server began handling the request; Answered when it had sent the
	// whole answer (the ResponseComplete stage). A write took effect between the two.
	Received time.Time `json:"requestReceivedTimestamp"`
	Answered time.Time `json:"stageTimestamp"`
	Stage    string    `json:"stage"`
	// RequestObject is the body of an eviction or a delete.
	RequestObject struct {
		GracePeriodSeconds *int64 `json:"gracePeriodSeconds"`
		DeleteOptions      struct {
			GracePeriodSeconds *int64 `json:"gracePeriodSeconds"`
		} `json:"deleteOptions"`
	} `json:"requestObject"`
}

// Grace is the grace an eviction or a delete asked for, and whether it named one.
func (a AuditEvent) Grace() (time.Duration, bool) {
	g := a.RequestObject.GracePeriodSeconds
	if g == nil {
		g = a.RequestObject.DeleteOptions.GracePeriodSeconds
	}
	if g == nil {
		return 0, false
	}
	return time.Duration(*g) * time.Second, true
}

// Accepted reports whether the server accepted the request (a 2xx answer).
func (a AuditEvent) Accepted() bool {
	return a.ResponseStatus.Code >= 200 && a.ResponseStatus.Code < 300
}

// TimedOut reports whether the server answered the request with its own timeout (504). The
// request's write may still have taken effect: kube-apiserver's timeout answers for the
// handler, which goes on (a loaded run's eviction answered 504 after 0.68 s set the pod's
// deletionTimestamp all the same, issue 52).
func (a AuditEvent) TimedOut() bool { return a.ResponseStatus.Code == 504 }

// PodEnded reports whether a is an eviction or a delete of pod ns/name.
func (a AuditEvent) PodEnded(ns, name string) bool {
	o := a.ObjectRef
	return o.Resource == "pods" && o.Namespace == ns && o.Name == name &&
		(a.Verb == "create" && o.Subresource == "eviction" || a.Verb == "delete" && o.Subresource == "")
}

// Audit returns the requests the Env's kube-apiserver has answered so far that its audit
// policy records (see above), in the order it answered them.
func (e *Env) Audit() ([]AuditEvent, error) { return readAudit(e.auditLog("kube-apiserver")) }

// Audit is Env.Audit for this server.
func (a *APIServer) Audit() ([]AuditEvent, error) { return readAudit(a.env.auditLog(a.name)) }

// auditLog is the audit log of the kube-apiserver whose process (and log) is named name.
func (e *Env) auditLog(name string) string { return filepath.Join(e.LogDir, name+"-audit.log") }

// readAudit reads an audit log: one JSON event a line. A line still being written (the last,
// without its newline) is left for the next read.
func readAudit(path string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // io.EOF, with a partial line or none
		}
		var ev AuditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("reading the audit log %s: %w", path, err)
		}
		if ev.Stage == "ResponseComplete" {
			out = append(out, ev)
		}
	}
	return out, nil
}

// FirstPodEnd returns the request in events, received first, that the server accepted to
// evict or delete pod ns/name, and whether there was one.
func FirstPodEnd(events []AuditEvent, ns, name string) (AuditEvent, bool) {
	var first AuditEvent
	found := false
	for _, a := range events {
		if a.Accepted() && a.PodEnded(ns, name) && (!found || a.Received.Before(first.Received)) {
			first, found = a, true
		}
	}
	return first, found
}

// AdminUser is the user the Env's admin credentials (Token, Client, Kubeconfig) authenticate
// as, as the audit log names it.
const AdminUser = adminUser
