{{/* The chart's name, or nameOverride: the app.kubernetes.io/name label. */}}
{{- define "reprieve.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride when set; else "reprieve" for a release named
reprieve (or one containing the name), else <release>-reprieve. Object names, and the
ServiceAccount unless serviceAccount.name says. */}}
{{- define "reprieve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "reprieve.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "reprieve.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "reprieve.fullname" .) -}}
{{- end -}}

{{/* Selector labels: fixed for a release's life (a DaemonSet's selector cannot change). */}}
{{- define "reprieve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reprieve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The common labels of every object (Helm's and Kubernetes' recommended set). */}}
{{- define "reprieve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "reprieve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: reprieve
{{- end -}}

{{/* The interruption taint (--interruption-taint, default cloud=spot:NoExecute) as a dict
of key, value and effect, for the toleration and the admission policy. */}}
{{- define "reprieve.interruptionTaint" -}}
{{- $spec := .Values.interruptionTaint | default "cloud=spot:NoExecute" -}}
{{- $parts := splitList ":" $spec -}}
{{- if ne (len $parts) 2 -}}
{{- fail (printf "interruptionTaint %q: want key=value:NoExecute" $spec) -}}
{{- end -}}
{{- $kv := splitn "=" 2 (first $parts) -}}
{{- if or (not $kv._0) (ne (last $parts) "NoExecute") -}}
{{- fail (printf "interruptionTaint %q: want key=value:NoExecute" $spec) -}}
{{- end -}}
{{- dict "key" $kv._0 "value" ($kv._1 | default "") "effect" (last $parts) | toJson -}}
{{- end -}}

{{/* Fails on values the schema (values.schema.json) cannot check alone. */}}
{{- define "reprieve.validate" -}}
{{- if and .Values.pressure.kubeletInsecureTLS (eq .Values.pressure.source "off") -}}
{{- fail "pressure.kubeletInsecureTLS applies to pressure.source=summary or host only" -}}
{{- end -}}
{{- end -}}

{{/* The job label of the agent's series: monitoring.job, else the release's name. The PodMonitor
sets it; the alert rules and the dashboard select on it, so every release sees its own agents. */}}
{{- define "reprieve.job" -}}
{{- .Values.monitoring.job | default .Release.Name -}}
{{- end -}}

{{/*
"true" when the agent runs on the host network, "" when not: the hostNetwork value, or when it is
null, the cloud's need (aws: IMDSv2's default hop limit of 1 keeps the token's answer from pods).
*/}}
{{- define "reprieve.hostNetwork" -}}
{{- if kindIs "bool" .Values.hostNetwork -}}
{{- if .Values.hostNetwork }}true{{ end -}}
{{- else if eq .Values.cloud "aws" -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the admission policies are rendered: admissionPolicy.enabled and the cluster serves
ValidatingAdmissionPolicy at admissionregistration.k8s.io/v1 (Kubernetes 1.30 and later). Where it
does not, applying them would fail the whole release; NOTES.txt says that the node binding is off.
*/}}
{{- define "reprieve.admissionPolicy" -}}
{{- if and .Values.admissionPolicy.enabled (include "reprieve.vapServed" .) -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the cluster serves ValidatingAdmissionPolicy v1. A cluster's discovery lists kinds
(apps/v1/DaemonSet); `helm template` without a cluster lists only group versions, and then the
chart's kubeVersion (>=1.30) stands for the API.
*/}}
{{- define "reprieve.vapServed" -}}
{{- $discovered := .Capabilities.APIVersions.Has "apps/v1/DaemonSet" -}}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- if or $served (not $discovered) -}}
true
{{- end -}}
{{- end }}
