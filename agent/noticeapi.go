package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/netutil"
	v1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// The node-local notice endpoint (--notice-bind-address): GET /v1/pods/{namespace}/{name}/notice
// answers what the pod's warning says (podnotice.go), for workloads that hold no API
// credentials. Its shape follows GCP's metadata server, so that one client serves every cloud:
// ?wait=true is a hanging GET that returns when the answer changes from last_etag (or from the
// answer at the time of the request), or after timeout_sec with the answer as it is then.
const (
	noticeWaitDefault = 60 * time.Second
	noticeWaitMax     = 300 * time.Second
	// noticeWaitersMax bounds the hanging GETs held at once (a goroutine and a timer each), so
	// that a pod looping on wait=true cannot exhaust the agent; past it a wait is answered at
	// once, which a client following the ETags takes as a changed answer and asks again.
	noticeWaitersMax = 1024
	// noticeConnsSpare is how many connections beyond noticeWaitersMax the listener accepts at
	// once; a connection past them waits in the kernel's backlog.
	noticeConnsSpare = 64
	// noticeIdleTimeout closes a kept-alive connection that sends no request.
	noticeIdleTimeout = 30 * time.Second
)

// NoticeAnswer is the endpoint's JSON answer.
type NoticeAnswer struct {
	// Notice is true while a notice plans the pod's eviction, or its end with the machine.
	Notice bool `json:"notice"`
	// Reason is the notice kind, as the pod condition's reason (SpotInterruption, ...).
	Reason string `json:"reason,omitempty"`
	// EvictAt is when reprieve will evict the pod; absent for a pod that tolerates the
	// interruption forever.
	EvictAt *time.Time `json:"evictAt,omitempty"`
	// ReclaimDeadline is when the machine is reclaimed.
	ReclaimDeadline *time.Time `json:"reclaimDeadline,omitempty"`
	// Message is the pod condition's message.
	Message string `json:"message,omitempty"`
}

func answerOf(pw podWarning) NoticeAnswer {
	if !pw.active {
		return NoticeAnswer{}
	}
	a := NoticeAnswer{Notice: true, Reason: pw.reason, Message: pw.message}
	d := pw.deadline.UTC()
	a.ReclaimDeadline = &d
	if !pw.evictAt.IsZero() {
		e := pw.evictAt.UTC()
		a.EvictAt = &e
	}
	return a
}

// noticeAPI serves the endpoint from the notifier's wanted warnings.
type noticeAPI struct {
	notices *podNotifier
	pods    corelisters.PodLister
	clock   clock.WithTicker
	// waiters holds a token per hanging GET; nil: unbounded (tests).
	waiters chan struct{}
}

// warningOf returns what pod should carry now, and a channel closed at the next change of any
// pod's warning.
func (n *podNotifier) warningOf(pod *v1.Pod) (podWarning, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.want[pod.Namespace+"/"+pod.Name]
	if !ok || w.uid != pod.UID {
		return podWarning{}, n.changed
	}
	return w.warn, n.changed
}

func (s *noticeAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/pods/{namespace}/{name}/notice", s.serveNotice)
	return mux
}

// serveNotice answers only a pod about itself: the request must come from one of the named
// pod's own IPs, and the pod must be bound to this node (the agent's informer holds only
// those). Pod IPs are the only identity a credential-less request has; letting any pod of the
// node ask about any other would tell it its neighbours' names and plans, which it does not
// need. A host-network pod's IP is the node's, so host-network pods can ask about one another.
// Anything else is 404, as for a pod that does not exist, so that the endpoint tells a stranger
// nothing.
func (s *noticeAPI) serveNotice(w http.ResponseWriter, r *http.Request) {
	pod, ok := s.requester(r)
	if !ok {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	pw, changed := s.notices.warningOf(pod)
	body, etag := encodeAnswer(answerOf(pw))
	if q.Get("wait") == "true" || q.Get("wait_for_change") == "true" {
		timeout := noticeWaitDefault
		if v := q.Get("timeout_sec"); v != "" {
			secs, err := strconv.Atoi(v)
			if err != nil || secs < 1 {
				http.Error(w, "timeout_sec: want a positive number of seconds", http.StatusBadRequest)
				return
			}
			// Bounded before the multiplication, which would overflow for a huge value.
			timeout = time.Duration(min(secs, int(noticeWaitMax/time.Second))) * time.Second
		}
		last := q.Get("last_etag")
		if last == "" {
			last = etag
		}
		if s.waiters != nil {
			select {
			case s.waiters <- struct{}{}:
				defer func() { <-s.waiters }()
			default:
				s.write(w, body, etag)
				return
			}
		}
		t := s.clock.NewTimer(timeout)
		defer t.Stop()
		for etag == last {
			select {
			case <-changed:
			case <-t.C():
				s.write(w, body, etag)
				return
			case <-r.Context().Done():
				return
			}
			// The pod may have been replaced or deleted while the request waited.
			if pod, ok = s.requester(r); !ok {
				http.NotFound(w, r)
				return
			}
			pw, changed = s.notices.warningOf(pod)
			body, etag = encodeAnswer(answerOf(pw))
		}
	}
	s.write(w, body, etag)
}

func (s *noticeAPI) write(w http.ResponseWriter, body []byte, etag string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", etag)
	_, _ = w.Write(body)
}

// requester returns the pod the request names, when it is on this node and the request comes
// from one of its IPs.
func (s *noticeAPI) requester(r *http.Request) (*v1.Pod, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return nil, false
	}
	src := net.ParseIP(host)
	pod, err := s.pods.Pods(r.PathValue("namespace")).Get(r.PathValue("name"))
	if err != nil || src == nil {
		return nil, false
	}
	// A host-network pod's IP is the node's, shared by every process and host-network pod on
	// it: no request proves it comes from that pod. A finished pod's IP may already be a new
	// pod's.
	if pod.Spec.HostNetwork || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil, false
	}
	for _, ip := range podIPs(pod) {
		if ip.Equal(src) {
			return pod, true
		}
	}
	return nil, false
}

func podIPs(pod *v1.Pod) []net.IP {
	var out []net.IP
	for _, p := range pod.Status.PodIPs {
		if ip := net.ParseIP(p.IP); ip != nil {
			out = append(out, ip)
		}
	}
	if ip := net.ParseIP(pod.Status.PodIP); ip != nil && len(out) == 0 {
		out = append(out, ip)
	}
	return out
}

// encodeAnswer is the answer's JSON and its ETag, a hash of it: the same answer always has the
// same ETag, across requests and agent restarts. Unquoted hex, as GCP's metadata server sends
// it, so that a client can put it in last_etag as it is.
func encodeAnswer(a NoticeAnswer) ([]byte, string) {
	b, err := json.Marshal(a)
	if err != nil {
		// A struct of strings, times and a bool always encodes.
		panic(fmt.Sprintf("encoding a notice answer: %v", err))
	}
	b = append(b, '\n')
	h := fnv.New64a()
	_, _ = h.Write(b)
	return b, strconv.FormatUint(h.Sum64(), 16)
}

// serveNoticeAPI serves the endpoint on --notice-bind-address until ctx ends.
func (a *Agent) serveNoticeAPI(ctx context.Context) error {
	if a.cfg.NoticeBindAddress == "" || a.podNotice == nil {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.NoticeBindAddress)
	if err != nil {
		return fmt.Errorf("listening on --notice-bind-address %s: %w", a.cfg.NoticeBindAddress, err)
	}
	// The port is open to anyone who reaches the node: bound the connections, so that a flood
	// of them cannot take the agent's file descriptors, which its API client needs too. Room
	// beyond the hanging GETs' cap keeps quick answers going.
	ln = netutil.LimitListener(ln, noticeWaitersMax+noticeConnsSpare)
	s := &noticeAPI{notices: a.podNotice, pods: a.podLister, clock: a.clock, waiters: make(chan struct{}, noticeWaitersMax)}
	// No write timeout: a hanging GET lasts up to noticeWaitMax. A connection idle between
	// requests is closed after noticeIdleTimeout (a hanging GET is a request, not idle).
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: noticeIdleTimeout}
	klog.FromContext(ctx).Info("Serving the node-local notice endpoint", "address", ln.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// Shutdown waits for hanging GETs; Close after the grace ends them.
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the notice endpoint: %w", err)
	}
	return nil
}
