package main

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// guardWebhook is the eviction guard's webhook, as the chart names it
// (templates/eviction-guard.yaml).
const guardWebhook = "eviction-guard.reprieve.io"

// guardUnreachable says whether err is the API server's failure to call the eviction guard: with
// failurePolicy Fail it answers 500 with the message of k8s.io/apiserver's ErrCallingWebhook,
// `failed calling webhook "NAME": REASON` (no replica answering, or a certificate that the
// webhook's caBundle does not verify).
func guardUnreachable(err error) bool {
	return apierrors.IsInternalError(err) && strings.Contains(err.Error(), `failed calling webhook "`+guardWebhook+`"`)
}

// guardUnreachableFix is doctor's fix for it.
const guardUnreachableFix = "check that the guard's pods are ready (kubectl get deploy -A -l app.kubernetes.io/component=eviction-guard) and serve a certificate its webhook's caBundle verifies (the guard's metric reprieve_guard_ca_bundle_published, alert ReprieveEvictionGuardDown). Meanwhile every eviction of the agent is refused: at a reclaim it deletes each pod at its last safe moment, past its PodDisruptionBudget"
