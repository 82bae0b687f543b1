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

{{/* The Secret the guard serves from: evictionGuard.tls.existingSecret, else the chart's own
(Helm's generated pair, or the one cert-manager issues). */}}
{{- define "reprieve.guard.secretName" -}}
{{- .Values.evictionGuard.tls.existingSecret | default (include "reprieve.guard.name" .) -}}
{{- end -}}

{{/* The job label of the guard's series (its PodMonitor sets it, ReprieveEvictionGuard* select
on it): the agent's job with -eviction-guard. */}}
{{- define "reprieve.guard.job" -}}
{{- printf "%s-eviction-guard" (include "reprieve.job" .) -}}
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
{{- if and .Values.evictionGuard.clientAuth.allowedNames (not .Values.evictionGuard.clientAuth.caConfigMap) -}}
{{- fail "evictionGuard.clientAuth.allowedNames needs evictionGuard.clientAuth.caConfigMap" -}}
{{- end -}}
{{- end -}}
