// Package guard is the eviction guard: a validating admission webhook that lets reprieve's
// ServiceAccount evict only pods bound to the node named in its token's node claim. An Eviction
// carries the pod's name, not its node, so neither RBAC nor a ValidatingAdmissionPolicy can bind
// it (and the eviction registry deletes the pod without running DELETE admission); the guard
// reads the pod to find out.
package guard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// NodeClaim is the key of request.userInfo.extra under which the API server passes the node of
// the pod a ServiceAccount token is bound to (always from Kubernetes 1.32; on 1.30 and 1.31 unless
// the ServiceAccountTokenPodNodeInfo feature gate is off).
const NodeClaim = "authentication.kubernetes.io/node-name"

// maxReviewBytes bounds an AdmissionReview body: an Eviction is a few hundred bytes.
const maxReviewBytes = 1 << 20

// PodGetter reads one pod. The guard reads each evicted pod once per review: an informer on all
// pods would cost memory and API server watch load in proportion to the cluster.
type PodGetter func(ctx context.Context, namespace, name string) (*v1.Pod, error)

// Handler answers AdmissionReviews of evictions.
type Handler struct {
	// Username is the agent's identity, system:serviceaccount:<namespace>:<name>. Requests
	// from anyone else are allowed: the webhook's matchConditions should never send them, and
	// no other workload's evictions may depend on the guard.
	Username string
	// GetPod reads the pod being evicted.
	GetPod  PodGetter
	Metrics *Metrics
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
	pod, err := h.GetPod(ctx, req.Namespace, req.Name)
	switch {
	case apierrors.IsNotFound(err):
		return Verdict{Message: fmt.Sprintf("pod %s/%s not found", req.Namespace, req.Name)}, nil
	case err != nil:
		return Verdict{}, fmt.Errorf("reading pod %s/%s: %w", req.Namespace, req.Name, err)
	}
	if pod.Spec.NodeName != node {
		on := pod.Spec.NodeName
		if on == "" {
			on = "no node (not scheduled)"
		}
		return Verdict{Message: fmt.Sprintf("reprieve may evict only pods on the node its token is bound to (%s); pod %s/%s is on %s", node, req.Namespace, req.Name, on)}, nil
	}
	if uid != pod.UID {
		// The eviction would fail its precondition anyway (409); refuse here so that a pod
		// recreated under the same name on another node is never judged by its predecessor.
		return Verdict{Message: fmt.Sprintf("the eviction's UID precondition %s is not pod %s/%s's UID %s", uid, req.Namespace, req.Name, pod.UID)}, nil
	}
	return Verdict{Allowed: true, Message: fmt.Sprintf("pod %s/%s is on the token's node %s", req.Namespace, req.Name, node)}, nil
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

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1) posted by the API server.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil || len(body) > maxReviewBytes {
		http.Error(w, "reading the AdmissionReview failed or it is too large", http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "the body is not an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	req := review.Request
	verdict, err := h.Review(r.Context(), req)
	if err != nil {
		// An error status, not a refusal: the API server applies failurePolicy (Fail) and
		// answers the agent with a 500, which it retries and, near the deadline, replaces with
		// its node-bound DELETE.
		h.count(ResultError)
		logger.Error(err, "Reviewing an eviction failed", "pod", klog.KRef(req.Namespace, req.Name), "uid", req.UID)
		http.Error(w, "the eviction guard could not read the pod", http.StatusInternalServerError)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: verdict.Allowed}
	if verdict.Allowed {
		h.count(ResultAllowed)
		logger.V(4).Info("Allowed an eviction", "pod", klog.KRef(req.Namespace, req.Name), "user", req.UserInfo.Username, "reason", verdict.Message)
	} else {
		h.count(ResultDenied)
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden, Message: verdict.Message}
		logger.Info("Denied an eviction", "pod", klog.KRef(req.Namespace, req.Name), "user", req.UserInfo.Username, "reason", verdict.Message)
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = admissionv1.SchemeGroupVersion.String(), "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		logger.Error(err, "Writing the AdmissionReview response failed", "uid", req.UID)
	}
}

func (h *Handler) count(result string) {
	if h.Metrics != nil {
		h.Metrics.ReviewsTotal.WithLabelValues(result).Inc()
	}
}
