{{/* The eviction guard's names, shared by its templates (eviction-guard*.yaml). */}}

{{/* The guard's objects' name: <fullname>-eviction-guard. */}}
{{- define "reprieve.guard.name" -}}
{{- printf "%s-eviction-guard" (include "reprieve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The guard pods' selector labels: a name of their own, so that neither the agent's DaemonSet
nor its PodMonitor selects them. */}}
{{- define "reprieve.guard.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-eviction-guard" (include "reprieve.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Whether the guard makes, rotates and publishes its own certificate (the default: neither
evictionGuard.tls.existingSecret nor certManager). */}}
{{- define "reprieve.guard.selfCert" -}}
{{- if not (or .Values.evictionGuard.tls.existingSecret .Values.evictionGuard.tls.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{/* The Secret the guard's pair is in: evictionGuard.tls.existingSecret; else the one
cert-manager issues (<name>); else the one the guard keeps itself (<name>-tls, a name of its own:
the chart before the guard kept its own made a kubernetes.io/tls Secret <name>, and a Secret's
type cannot change in an upgrade). */}}
{{- define "reprieve.guard.secretName" -}}
{{- if .Values.evictionGuard.tls.existingSecret -}}
{{- .Values.evictionGuard.tls.existingSecret -}}
{{- else if .Values.evictionGuard.tls.certManager.enabled -}}
{{- include "reprieve.guard.name" . -}}
{{- else -}}
{{- printf "%s-tls" (include "reprieve.guard.name" . | trunc 59 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{/* The job label of the guard's series (its PodMonitor sets it, ReprieveEvictionGuard* select
on it): the agent's job with -eviction-guard. */}}
{{- define "reprieve.guard.job" -}}
{{- printf "%s-eviction-guard" (include "reprieve.job" .) -}}
{{- end -}}

{{/* The port the guard serves on: evictionGuard.port, else 10250 on the pod network (the port a
GKE private cluster's control plane reaches without a firewall rule, as cert-manager's webhook
uses), 10260 on the host network, where 10250 is the kubelet's. */}}
{{- define "reprieve.guard.port" -}}
{{- if .Values.evictionGuard.port -}}
{{- .Values.evictionGuard.port -}}
{{- else if .Values.evictionGuard.hostNetwork -}}
10260
{{- else -}}
10250
{{- end -}}
{{- end -}}

{{/* The DNS name the API server dials and checks the serving certificate against. */}}
{{- define "reprieve.guard.host" -}}
{{- printf "%s.%s.svc" (include "reprieve.guard.name" .) .Release.Namespace -}}
{{- end -}}

{{/* Fails on guard values that do not go together. */}}
{{- define "reprieve.guard.validate" -}}
{{- $tls := .Values.evictionGuard.tls -}}
{{- if and $tls.existingSecret $tls.certManager.enabled -}}
{{- fail "evictionGuard.tls: set existingSecret or certManager.enabled, not both (cert-manager writes the chart's own Secret)" -}}
{{- end -}}
{{- if and $tls.existingSecret (not $tls.caBundle) -}}
{{- fail "evictionGuard.tls.existingSecret needs evictionGuard.tls.caBundle: the PEM of the CA that signed its certificate, for the webhook's caBundle" -}}
{{- end -}}
{{- if and $tls.caBundle (not $tls.existingSecret) -}}
{{- fail "evictionGuard.tls.caBundle applies to evictionGuard.tls.existingSecret only" -}}
{{- end -}}
{{- with $tls.certManager.issuerRef -}}
{{- if not .name -}}
{{- fail "evictionGuard.tls.certManager.issuerRef needs a name (and kind Issuer or ClusterIssuer)" -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.evictionGuard.offSpot (list "required" "preferred")) -}}
{{- fail (printf "evictionGuard.offSpot %q: want required (never on spot capacity) or preferred (on spot capacity only where nothing else is: a cluster of spot nodes only)" .Values.evictionGuard.offSpot) -}}
{{- end -}}
{{- with .Values.evictionGuard.limits -}}
{{- if lt (int .reviewsInFlight) (int .sourceReviewsInFlight) -}}
{{- fail (printf "evictionGuard.limits.reviewsInFlight %v: want at least sourceReviewsInFlight (%v)" .reviewsInFlight .sourceReviewsInFlight) -}}
{{- end -}}
{{- if lt (int .connections) (int .sourceConnections) -}}
{{- fail (printf "evictionGuard.limits.connections %v: want at least sourceConnections (%v)" .connections .sourceConnections) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.evictionGuard.hostNetwork (eq (include "reprieve.guard.port" . | int) 10250) -}}
{{- fail "evictionGuard.port 10250 on the host network is the kubelet's port: leave evictionGuard.port empty (10260) or choose another" -}}
{{- end -}}
{{- if and .Values.evictionGuard.hostNetwork .Values.metrics.port (eq (include "reprieve.guard.port" . | int) (int .Values.metrics.port)) -}}
{{- fail (printf "evictionGuard.port %v is the agent's metrics.port: on the host network the two would take the same node port" .Values.evictionGuard.port) -}}
{{- end -}}
{{- if and .Values.evictionGuard.clientAuth.allowedNames (not .Values.evictionGuard.clientAuth.caConfigMap) -}}
{{- fail "evictionGuard.clientAuth.allowedNames needs evictionGuard.clientAuth.caConfigMap" -}}
{{- end -}}
{{- end -}}
