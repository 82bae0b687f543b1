package podnotice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/serve"
)

// The node-local notice endpoint (--notice-bind-address): GET /v1/pods/{namespace}/{name}/notice
// answers what the pod's warning says (podnotice.go), for workloads that hold no API
// credentials. Its shape follows GCP's metadata server, so that one client serves every cloud:
// ?wait=true is a hanging GET that returns when the answer changes from last_etag (or from the
// answer at the time of the request), or after timeout_sec with the answer as it is then.
const (
	noticeWaitDefault = 60 * time.Second
	WaitMax           = 300 * time.Second
	// WaitersMax bounds the hanging GETs held at once (a goroutine and a timer each), so
	// that the node's pods together cannot exhaust the agent; past it a wait is answered at
	// once, which a client following the ETags takes as a changed answer and asks again.
	WaitersMax = 1024
	// noticeWaitsPerPod is how many of them one pod may hold (its containers share its IP): a
	// pod looping on wait=true about itself takes its own slots, not its neighbours'.
	noticeWaitsPerPod = 4
	// noticeConnsSpare is how many connections beyond WaitersMax the pods' pool holds, so
	// that quick answers go on while every wait slot is taken.
	noticeConnsSpare = 64
	// noticeWriteTimeout bounds an answer that does not wait; a hanging GET gets its wait on top.
	noticeWriteTimeout = 10 * time.Second
)

// The endpoint's connection pools (poolListener). A source address that some pod of the node
// lists as its IP is in the pods' pool, eight connections each. Any other source (another
// node, the node itself, a host-network pod) is no pod's requester and only ever gets 404: a
// pool of its own, two connections per address and 16 in all, so that strangers cannot take
// the pods' connections however many addresses they send from.
var (
	PodPool      = &serve.Pool{Name: "pods", Total: WaitersMax + noticeConnsSpare, PerSource: 8}
	StrangerPool = &serve.Pool{Name: "strangers", Total: 16, PerSource: 2}
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

func answerOf(pw Warning) NoticeAnswer {
	if !pw.Active {
		return NoticeAnswer{}
	}
	a := NoticeAnswer{Notice: true, Reason: pw.Reason, Message: pw.Message}
	d := pw.Deadline.UTC()
	a.ReclaimDeadline = &d
	if !pw.EvictAt.IsZero() {
		e := pw.EvictAt.UTC()
		a.EvictAt = &e
	}
	return a
}

// Endpoint serves the endpoint from the notifier's wanted warnings.
type Endpoint struct {
	notices *Notifier
	pods    corelisters.PodLister
	clock   clock.WithTicker
	// waiters holds a token per hanging GET; nil: unbounded (tests).
	waiters chan struct{}

	mu sync.Mutex
	// waiting counts each pod's hanging GETs by UID (noticeWaitsPerPod).
	waiting map[types.UID]int
}

// warningOf returns what pod should carry now, and a channel closed at the next change of any
// pod's warning.
func (n *Notifier) warningOf(pod *v1.Pod) (Warning, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.want[pod.Namespace+"/"+pod.Name]
	if !ok || w.uid != pod.UID {
		return Warning{}, n.changed
	}
	return w.warn, n.changed
}

func (s *Endpoint) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/pods/{namespace}/{name}/notice", s.serveNotice)
	mux.HandleFunc("/", notFound)
	return mux
}

// notFound answers 404 and closes the connection: a stranger gets one answer per connection it
// opens, and holds none of the endpoint's connections between requests.
func notFound(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	http.NotFound(w, r)
}

// serveNotice answers only a pod about itself: the request must come from one of the named
// pod's own IPs, and the pod must be bound to this node (the agent's informer holds only
// those). Pod IPs are the only identity a credential-less request has; letting any pod of the
// node ask about any other would tell it its neighbours' names and plans, which it does not
// need. A host-network pod's IP is the node's, so host-network pods can ask about one another.
// Anything else is 404, as for a pod that does not exist, so that the endpoint tells a stranger
// nothing.
func (s *Endpoint) serveNotice(w http.ResponseWriter, r *http.Request) {
	pod, ok := s.requester(r)
	if !ok {
		notFound(w, r)
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
			timeout = time.Duration(min(secs, int(WaitMax/time.Second))) * time.Second
		}
		last := q.Get("last_etag")
		if last == "" {
			last = etag
		}
		if !s.takeWait(pod.UID) {
			s.write(w, body, etag)
			return
		}
		defer s.endWait(pod.UID)
		// The server's write timeout runs from the request; a hanging GET answers up to its wait
		// later. The connection's deadline is the kernel's wall clock, not the agent's clock.
		// (A bodiless request's read deadline is already off while the handler runs: net/http's
		// connReader.startBackgroundRead clears it.) A test's recorder has no deadline to set.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout + noticeWriteTimeout))
		t := s.clock.NewTimer(timeout)
		defer t.Stop()
		for expired := false; etag == last && !expired; {
			select {
			case <-changed:
			case <-t.C():
				expired = true
			case <-r.Context().Done():
				return
			}
			// The pod may have been replaced or deleted while the request waited, with or
			// without a change of its warning: a deleted pod's last answer is not its answer.
			if pod, ok = s.requester(r); !ok {
				notFound(w, r)
				return
			}
			pw, changed = s.notices.warningOf(pod)
			body, etag = encodeAnswer(answerOf(pw))
		}
	}
	s.write(w, body, etag)
}

// takeWait takes one of the node's wait slots and one of pod's; false when either is full.
func (s *Endpoint) takeWait(pod types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting[pod] >= noticeWaitsPerPod {
		return false
	}
	if s.waiters != nil {
		select {
		case s.waiters <- struct{}{}:
		default:
			return false
		}
	}
	if s.waiting == nil {
		s.waiting = map[types.UID]int{}
	}
	s.waiting[pod]++
	return true
}

func (s *Endpoint) endWait(pod types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters != nil {
		<-s.waiters
	}
	if s.waiting[pod]--; s.waiting[pod] <= 0 {
		delete(s.waiting, pod)
	}
}

func (s *Endpoint) write(w http.ResponseWriter, body []byte, etag string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", etag)
	_, _ = w.Write(body)
}

// requester returns the pod the request names, when it is on this node and the request comes
// from one of its IPs, which no other pod of the node claims.
func (s *Endpoint) requester(r *http.Request) (*v1.Pod, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return nil, false
	}
	pods := s.Claimants(ap.Addr().Unmap())
	// Two unfinished pods with one IP (after a node reboot, or a sandbox re-created while the
	// cache still shows the old one): the request may come from either, and answering the one
	// it names could tell the other its neighbour's plan.
	if len(pods) != 1 || pods[0].Namespace != r.PathValue("namespace") || pods[0].Name != r.PathValue("name") {
		return nil, false
	}
	return pods[0], true
}

// claimants returns the pods of the node that list src as one of their IPs. A host-network
// pod's IP is the node's, shared by every process and host-network pod on it: no request
// proves it comes from that pod. A finished pod's IP may already be a new pod's.
func (s *Endpoint) Claimants(src netip.Addr) []*v1.Pod {
	pods, err := s.pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []*v1.Pod
	for _, pod := range pods {
		if pod.Spec.HostNetwork || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		for _, ip := range PodIPs(pod) {
			if ip == src {
				out = append(out, pod)
				break
			}
		}
	}
	return out
}

// Pool is the endpoint's serve.NewListener rule: a source that some pod of the node claims is in
// the pods' pool, any other in the strangers'.
func (s *Endpoint) Pool(_, remote netip.Addr) *serve.Pool {
	if len(s.Claimants(remote)) > 0 {
		return PodPool
	}
	return StrangerPool
}

func PodIPs(pod *v1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, p := range pod.Status.PodIPs {
		if ip, err := netip.ParseAddr(p.IP); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil && len(out) == 0 {
		out = append(out, ip.Unmap())
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

// NewServer returns the endpoint's server, serving h with every timeout. A connection
// idle between requests is closed after serve.IdleTimeout (a hanging GET is a request, not
// idle); a hanging GET extends its own write deadline past noticeWriteTimeout.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: serve.ReadHeaderTimeout, ReadTimeout: serve.ReadTimeout,
		WriteTimeout: noticeWriteTimeout, IdleTimeout: serve.IdleTimeout,
		MaxHeaderBytes: serve.MaxHeaderBytes,
	}
}

// Serve serves the endpoint on ln (--notice-bind-address) from notices' warnings
// until ctx ends.
func Serve(ctx context.Context, ln net.Listener, notices *Notifier, pods corelisters.PodLister, clk clock.WithTicker) error {
	s := &Endpoint{notices: notices, pods: pods, clock: clk, waiters: make(chan struct{}, WaitersMax)}
	// The port is open to anyone who reaches the node: bound the connections, so that a flood
	// of them cannot take the agent's memory or file descriptors, and by source, so that
	// strangers cannot take the pods' share.
	ln = serve.NewListener(ln, s.Pool)
	srv := NewServer(s.Handler())
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

// NewEndpoint is the endpoint answering from notices' warnings about the pods pods lists, at
// most waiters hanging GETs at once (0: unbounded). Serve builds the agent's with WaitersMax.
func NewEndpoint(notices *Notifier, pods corelisters.PodLister, clk clock.WithTicker, waiters int) *Endpoint {
	s := &Endpoint{notices: notices, pods: pods, clock: clk}
	if waiters > 0 {
		s.waiters = make(chan struct{}, waiters)
	}
	return s
}
