{{/* The release's full name: "reprieve" for a release named reprieve (or reprieve-*), else
<release>-reprieve. Object names, and the ServiceAccount unless serviceAccount.name says. */}}
{{- define "reprieve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "reprieve.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "reprieve.fullname" .) -}}
{{- end -}}

{{/* Selector labels. The PodMonitor selects on app.kubernetes.io/name alone, and the alerts
expect job="reprieve", its value. */}}
{{- define "reprieve.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "reprieve.labels" -}}
{{ include "reprieve.selectorLabels" . }}
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
{{- if and .Values.pressure.kubeletInsecureTLS (ne .Values.pressure.source "summary") -}}
{{- fail "pressure.kubeletInsecureTLS applies to pressure.source=summary only" -}}
{{- end -}}
{{- end -}}
