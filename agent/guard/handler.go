// Package guard is the eviction guard: a validating admission webhook that lets reprieve's
// ServiceAccount evict only pods bound to the node named in its token's node claim. An Eviction
// carries the pod's name, not its node, so neither RBAC nor a ValidatingAdmissionPolicy can bind
// it (and the eviction registry deletes the pod without running DELETE admission); the guard
// finds the pod's node in its index of the cluster's pods (PodIndex), or, for a pod the index has
// not seen, reads it.
package guard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
)

// NodeClaim is the key of request.userInfo.extra under which the API server passes the node of
// the pod a ServiceAccount token is bound to (always from Kubernetes 1.32; on 1.30 and 1.31 unless
// the ServiceAccountTokenPodNodeInfo feature gate is off).
const NodeClaim = "authentication.kubernetes.io/node-name"

// maxReviewBytes bounds an AdmissionReview body. The API server's review of an Eviction is about
// 1.7 KiB (the caller's userInfo and the Eviction); 64 KiB leaves room for long group lists, and
// keeps the memory of Limits.InFlight reviews at a few megabytes.
const maxReviewBytes = 64 << 10

// podReadTimeout bounds a review's pod read: less than the chart's timeoutSeconds (3 s).
const podReadTimeout = 2 * time.Second

// bodyReadTimeout bounds the wait for a review's body once its headers are in: the API server
// writes the whole review at once, and a caller that trickles it holds a connection, not a slot.
const bodyReadTimeout = 2 * time.Second

// errReadBudget is the refusal of a pod read past the source's budget (Limiter.AllowRead).
var errReadBudget = errors.New("the source's budget of pod reads is spent")

// PodGetter reads one pod: the fallback for a pod that Handler.Pods does not know.
type PodGetter func(ctx context.Context, namespace, name string) (*v1.Pod, error)

// PodLocator says, from memory, where the pod an eviction names is bound (PodIndex.Locate).
type PodLocator interface {
	Locate(namespace, name string, uid types.UID) (node string, loc Location)
}

// Handler answers AdmissionReviews of evictions.
type Handler struct {
	// Username is the agent's identity, system:serviceaccount:<namespace>:<name>. Requests
	// from anyone else are allowed: the webhook's matchConditions should never send them, and
	// no other workload's evictions may depend on the guard.
	Username string
	// Pods, if set, answers where a pod is bound without a call to the API server; a pod it
	// does not know is read with GetPod.
	Pods PodLocator
	// GetPod reads the pod being evicted.
	GetPod  PodGetter
	Metrics *Metrics
	// Limits, if set, bounds each source's reviews in flight and pod reads.
	Limits *Limiter
	// ClientAuth, if set, admits reviews only from callers with a client certificate it accepts.
	ClientAuth *ClientAuth
}

// DeniedMessage is the message of every refusal, whatever its reason. A review that anyone who
// reaches the port can forge must not tell whether a pod exists, or its node or UID: the reason
// goes to the guard's log, under the review's UID (the caller's own value), and nowhere else.
func DeniedMessage(reviewUID types.UID) string {
	return fmt.Sprintf("reprieve's eviction guard refused this eviction; its log gives the reason under review UID %s", reviewUID)
}

// Verdict is the guard's answer to one review: allowed, or refused with a message.
type Verdict struct {
	Allowed bool
	Message string
}

// Review judges one admission request. It returns an error only when the pod could not be read
// for another reason than its absence: the caller answers with an error status, and the API
// server's failurePolicy (Fail) refuses the eviction.
func (h *Handler) Review(ctx context.Context, req *admissionv1.AdmissionRequest) (Verdict, error) {
	return h.review(ctx, req, h.GetPod)
}

func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest, getPod PodGetter) (Verdict, error) {
	if req.UserInfo.Username != h.Username || req.Operation != admissionv1.Create ||
		req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "eviction" {
		return Verdict{Allowed: true, Message: "not an eviction by reprieve's agent"}, nil
	}
	claims := req.UserInfo.Extra[NodeClaim]
	if len(claims) != 1 || claims[0] == "" {
		return Verdict{Message: fmt.Sprintf("reprieve may evict only pods on the node its token is bound to; this token is bound to no node (no %s claim)", NodeClaim)}, nil
	}
	node := claims[0]
	// The options first, as the eviction-options policy checks them: the guard must bind on its
	// own where that policy is not installed. Without a UID precondition the pod judged here
	// could be replaced, under the same name on another node, before the eviction lands.
	uid, grace, err := evictionOptions(req)
	switch {
	case err != nil:
		return Verdict{Message: err.Error()}, nil
	case uid == "":
		return Verdict{Message: "reprieve may evict only with a UID precondition (deleteOptions.preconditions.uid)"}, nil
	case grace == nil || *grace < 1:
		return Verdict{Message: "reprieve may evict only with deleteOptions.gracePeriodSeconds of at least 1"}, nil
	}
	// A name no pod can have is a forgery (the API server validates the path first): refused
	// without a read, which would fail and count as the guard's error.
	if errs := validation.IsDNS1123Label(req.Namespace); len(errs) > 0 {
		return Verdict{Message: fmt.Sprintf("namespace %q is not a namespace name: %s", req.Namespace, strings.Join(errs, "; "))}, nil
	}
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return Verdict{Message: fmt.Sprintf("%q is not a pod name: %s", req.Name, strings.Join(errs, "; "))}, nil
	}
	// From memory first: the UID names the one pod the eviction can end (its precondition), and
	// that pod's node never changes (PodIndex).
	if h.Pods != nil {
		switch on, loc := h.Pods.Locate(req.Namespace, req.Name, uid); loc {
		case OtherPod:
			h.lookedUp(FromIndex)
			// The eviction would fail its precondition anyway (409).
			return Verdict{Message: fmt.Sprintf("the eviction's UID precondition %s is another pod's than %s/%s", uid, req.Namespace, req.Name)}, nil
		case Bound:
			h.lookedUp(FromIndex)
			return onNode(node, req.Namespace, req.Name, on), nil
		}
	}
	pod, err := getPod(ctx, req.Namespace, req.Name)
	if !errors.Is(err, errReadBudget) {
		h.lookedUp(FromAPI)
	}
	switch {
	case apierrors.IsNotFound(err):
		return Verdict{Message: fmt.Sprintf("pod %s/%s not found", req.Namespace, req.Name)}, nil
	case err != nil:
		return Verdict{}, fmt.Errorf("reading pod %s/%s: %w", req.Namespace, req.Name, err)
	}
	if pod.Spec.NodeName != node {
		return onNode(node, req.Namespace, req.Name, pod.Spec.NodeName), nil
	}
	if uid != pod.UID {
		// The eviction would fail its precondition anyway (409); refuse here so that a pod
		// recreated under the same name on another node is never judged by its predecessor.
		return Verdict{Message: fmt.Sprintf("the eviction's UID precondition %s is not pod %s/%s's UID %s", uid, req.Namespace, req.Name, pod.UID)}, nil
	}
	return onNode(node, req.Namespace, req.Name, pod.Spec.NodeName), nil
}

// onNode is the verdict on evicting pod namespace/name, bound to on, with a token of node.
func onNode(node, namespace, name, on string) Verdict {
	if on == node {
		return Verdict{Allowed: true, Message: fmt.Sprintf("pod %s/%s is on the token's node %s", namespace, name, node)}
	}
	if on == "" {
		on = "no node (not scheduled)"
	}
	return Verdict{Message: fmt.Sprintf("reprieve may evict only pods on the node its token is bound to (%s); pod %s/%s is on %s", node, namespace, name, on)}
}

// evictionOptions returns the UID precondition ("" when there is none) and the grace (nil when
// there is none) of the Eviction in req. An Eviction of policy/v1 and of policy/v1beta1 have the
// same fields.
func evictionOptions(req *admissionv1.AdmissionRequest) (types.UID, *int64, error) {
	if len(req.Object.Raw) == 0 {
		return "", nil, errors.New("the request carries no Eviction")
	}
	var ev policyv1.Eviction
	if err := json.Unmarshal(req.Object.Raw, &ev); err != nil {
		return "", nil, fmt.Errorf("decoding the Eviction: %w", err)
	}
	if ev.DeleteOptions == nil {
		return "", nil, nil
	}
	var uid types.UID
	if p := ev.DeleteOptions.Preconditions; p != nil && p.UID != nil {
		uid = *p.UID
	}
	return uid, ev.DeleteOptions.GracePeriodSeconds, nil
}

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1) posted by the API server. What is
// refused before it is judged (a caller without the client certificate, a source past its limits,
// a body that is not an AdmissionReview) gets an HTTP error at once, counted as rejected: the API
// server turns it into a failed call, which its failurePolicy (Fail) refuses with a 500 that the
// agent retries, as it does when the guard is down.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	src := SourceKey(r.RemoteAddr)
	if h.ClientAuth != nil {
		if err := h.ClientAuth.Verify(r.TLS); err != nil {
			h.reject(w, r, src, http.StatusForbidden, err)
			return
		}
	}
	if r.Method != http.MethodPost {
		h.reject(w, r, src, http.StatusMethodNotAllowed, fmt.Errorf("method %s; want POST", r.Method))
		return
	}
	// The body first, within bodyReadTimeout, and only then a review slot: a caller that sends
	// headers and no body (issue 39: 64 connections from each of four pods held all 256 slots
	// for the server's 10 s read timeout) holds a connection of its source's, never a slot. The
	// API server sends its review at once, a few KiB.
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyReadTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		h.reject(w, r, src, http.StatusInternalServerError, fmt.Errorf("setting the body's read deadline: %w", err))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	switch {
	case err != nil:
		h.reject(w, r, src, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err))
		return
	case len(body) > maxReviewBytes:
		h.reject(w, r, src, http.StatusRequestEntityTooLarge, fmt.Errorf("a body of more than %d bytes", maxReviewBytes))
		return
	}
	if h.Limits != nil {
		release, ok := h.Limits.Acquire(src)
		if !ok {
			h.reject(w, r, src, http.StatusTooManyRequests, errors.New("too many reviews in flight from this source, or in all"))
			return
		}
		defer release()
		if h.Metrics != nil {
			h.Metrics.SourceInFlightPeak.Set(float64(h.Limits.Peak()))
		}
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		h.reject(w, r, src, http.StatusBadRequest, fmt.Errorf("the body is not an AdmissionReview with a request (%v)", err))
		return
	}
	req := review.Request
	getPod := h.GetPod
	if h.Limits != nil {
		getPod = func(ctx context.Context, ns, name string) (*v1.Pod, error) {
			if !h.Limits.AllowRead(src) {
				return nil, errReadBudget
			}
			return h.GetPod(ctx, ns, name)
		}
	}
	// The read gets less time than the API server gives the review (timeoutSeconds, 3 s in the
	// chart), so that a slow read ends here, as an error, before the caller hangs up.
	ctx, cancel := context.WithTimeout(r.Context(), podReadTimeout)
	defer cancel()
	verdict, err := h.review(ctx, req, getPod)
	logger = logger.WithValues("pod", klog.KRef(req.Namespace, req.Name), "uid", req.UID, "source", r.RemoteAddr, "bytes", len(body))
	switch {
	case errors.Is(err, errReadBudget):
		h.reject(w, r, src, http.StatusTooManyRequests, err)
		return
	case err != nil && r.Context().Err() != nil:
		// The caller hung up before the answer: a forger that does not wait for it must not
		// count as the guard failing the API server.
		h.reject(w, r, src, http.StatusServiceUnavailable, fmt.Errorf("the caller went away before the answer: %w", err))
		return
	case err != nil:
		// An error status, not a refusal: the API server applies failurePolicy (Fail) and
		// answers the agent with a 500, which it retries and, near the deadline, replaces with
		// its node-bound DELETE.
		h.count(ResultError)
		logger.Error(err, "Reviewing an eviction failed")
		http.Error(w, "the eviction guard could not read the pod", http.StatusInternalServerError)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: verdict.Allowed}
	if verdict.Allowed {
		h.count(ResultAllowed)
		logger.V(4).Info("Allowed an eviction", "user", req.UserInfo.Username, "reason", verdict.Message)
	} else {
		h.count(ResultDenied)
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden, Message: DeniedMessage(req.UID)}
		logger.Info("Denied an eviction", "user", req.UserInfo.Username, "reason", verdict.Message)
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = admissionv1.SchemeGroupVersion.String(), "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		logger.Error(err, "Writing the AdmissionReview response failed")
	}
}

// reject answers a request refused before it was judged with status and its generic text, and
// logs the reason, at most once a minute per source when there are Limits.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, src string, status int, reason error) {
	h.count(ResultRejected)
	if h.Limits == nil || h.Limits.ShouldLog(src) {
		klog.FromContext(r.Context()).Info("Rejected a request before reviewing it (further ones from this source are not logged for a minute)",
			"source", r.RemoteAddr, "status", status, "reason", reason.Error())
	}
	http.Error(w, http.StatusText(status), status)
}

func (h *Handler) count(result string) {
	if h.Metrics != nil {
		h.Metrics.ReviewsTotal.WithLabelValues(result).Inc()
	}
}

func (h *Handler) lookedUp(from string) {
	if h.Metrics != nil {
		h.Metrics.PodLookups.WithLabelValues(from).Inc()
	}
}
