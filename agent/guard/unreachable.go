package guard

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// WebhookName is the eviction guard's webhook, as the chart names it
// (templates/eviction-guard.yaml).
const WebhookName = "eviction-guard.reprieve.io"

// Unreachable says whether err is the API server's failure to call the eviction guard: with
// failurePolicy Fail it answers 500 with the message of k8s.io/apiserver's ErrCallingWebhook,
// `failed calling webhook "NAME": REASON` (no replica answering, or a certificate that the
// webhook's caBundle does not verify).
func Unreachable(err error) bool {
	return apierrors.IsInternalError(err) && strings.Contains(err.Error(), `failed calling webhook "`+WebhookName+`"`)
}
