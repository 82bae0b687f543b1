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
{{- if not (has .Values.cloud (list "aws" "gcp" "azure")) -}}
{{- fail (printf "cloud %q: choose the cloud this release runs on, aws (EKS), gcp (GKE) or azure (AKS): --set cloud=aws, or -f deploy/chart/values-aws.yaml (values-gcp.yaml, values-azure.yaml). Without it the agent would watch the wrong metadata service and see nothing" (.Values.cloud | toString)) -}}
{{- end -}}
{{- if not (has .Values.nodes (list "spot" "all")) -}}
{{- fail (printf "nodes %q: want spot (the spot nodes of every platform) or all (every Linux node, for scheduled maintenance on on-demand nodes too)" (.Values.nodes | toString)) -}}
{{- end -}}
{{- if and .Values.pressure.kubeletInsecureTLS (eq .Values.pressure.source "off") -}}
{{- fail "pressure.kubeletInsecureTLS applies to pressure.source=summary or host only" -}}
{{- end -}}
{{- end -}}

{{/* "true" when something says the agents are scraped under the job the rules select: the chart's
PodMonitor, or monitoring.job naming the user's own scrape. */}}
{{- define "reprieve.agentsScraped" -}}
{{- if or .Values.podMonitor.enabled .Values.monitoring.job }}true{{ end -}}
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
"true" when this render has a cluster to look at: helm install, upgrade and uninstall, and Flux's
helm-controller (Helm's own actions, which run hooks); not `helm template`, Argo CD's render or
kustomize's helmCharts, where lookup gives an empty result. The namespace "default" always
exists.
*/}}
{{- define "reprieve.renderedWithCluster" -}}
{{- if lookup "v1" "Namespace" "" "default" -}}
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

{{/*
The spot and preemptible capacity of every platform, one label each, as a JSON list of
{"key", "value"}: the one list that the DaemonSet's default selection, the eviction guard's
anti-affinity and the warning policy read (nodefacts.SpotPoolSelectors, which `reprieve audit`
uses, holds the same: TestSpotLabelsOneList compares them). Every platform's, whatever the
cloud: a label of another platform is on no node of this one, and Karpenter runs on more than
one cloud (AKS node autoprovisioning labels its nodes karpenter.sh/capacity-type too).
  karpenter.sh/capacity-type=spot          Karpenter (kubernetes-sigs/karpenter pkg/apis/v1/labels.go)
  eks.amazonaws.com/capacityType=SPOT      EKS managed node groups (EKS, "Managed node groups: capacity types")
  cloud.google.com/gke-spot=true           GKE Spot VMs (GKE, "Spot VMs")
  cloud.google.com/gke-preemptible=true    GKE preemptible VMs (GKE, "Preemptible VMs")
  kubernetes.azure.com/scalesetpriority=spot  AKS Spot node pools (AKS, "Add a Spot node pool")
A self-managed group carries whatever its bootstrap sets: select it with nodeSelector.
*/}}
{{- define "reprieve.spotLabels" -}}
[{"key":"karpenter.sh/capacity-type","value":"spot"},{"key":"eks.amazonaws.com/capacityType","value":"SPOT"},{"key":"cloud.google.com/gke-spot","value":"true"},{"key":"cloud.google.com/gke-preemptible","value":"true"},{"key":"kubernetes.azure.com/scalesetpriority","value":"spot"}]
{{- end -}}

{{/*
The nodes no agent runs on, whatever the selection, as a JSON list of node selector requirements
that every term of the DaemonSet's node affinity carries:
  - nodes no agent can run on: EKS Fargate (eks.amazonaws.com/compute-type=fargate: one pod per
    micro-VM, no DaemonSets; aws-node-termination-handler's chart leaves them out the same way)
    and virtual-kubelet nodes (type=virtual-kubelet: AKS virtual nodes, ACI, other providers),
    where the pod would stay Pending and the DaemonSet's alerts count a missing agent;
  - the value excludeNodes: nodes whose notices another handler acts on (Karpenter's interruption
    queue: karpenter.sh/nodepool), each item a label key (nodes with the label, any value:
    DoesNotExist) or {key, values} (nodes whose label has one of the values: NotIn).
*/}}
{{- define "reprieve.excludedNodes" -}}
{{- $out := list (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" (list "fargate")) (dict "key" "type" "operator" "NotIn" "values" (list "virtual-kubelet")) -}}
{{- range .Values.excludeNodes -}}
{{- if kindIs "string" . -}}
{{- $out = append $out (dict "key" . "operator" "DoesNotExist") -}}
{{- else if .values -}}
{{- $out = append $out (dict "key" .key "operator" "NotIn" "values" .values) -}}
{{- else -}}
{{- $out = append $out (dict "key" .key "operator" "DoesNotExist") -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/*
The DaemonSet's selection as a JSON dict: "nodeSelector" (always kubernetes.io/os=linux, the
binary's only OS: a Windows spot pool must get no pod that never starts, and tolerate-all would
let it on) and "affinity" (required node affinity: the user's terms, or on spot nodes by default
one term per spot label, or with nodes=all or a nodeSelector of the user's a single term; every
term then carries reprieve.excludedNodes, so that excludeNodes and the nodes no agent runs on
narrow any selection without rewriting it), and "what", a line for NOTES.txt. A user's affinity is
kept whole (its pod affinities, its preferred terms) but for those requirements added.
*/}}
{{- define "reprieve.selection" -}}
{{- $sel := merge (dict "kubernetes.io/os" "linux") (.Values.nodeSelector | default dict) -}}
{{- $out := dict "nodeSelector" $sel -}}
{{- $excluded := include "reprieve.excludedNodes" . | fromJsonArray -}}
{{- $terms := list -}}
{{- $affinity := dict -}}
{{- if .Values.affinity -}}
{{- $affinity = deepCopy .Values.affinity -}}
{{- $req := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" (list) $affinity -}}
{{- range $req -}}
{{- $terms = append $terms (deepCopy .) -}}
{{- end -}}
{{- if not $terms -}}{{- $terms = list (dict) -}}{{- end -}}
{{- $_ := set $out "what" "the nodes that the values nodeSelector and affinity select" -}}
{{- else if .Values.nodeSelector -}}
{{- $terms = list (dict) -}}
{{- $_ := set $out "what" "the nodes that the value nodeSelector selects" -}}
{{- else if eq .Values.nodes "all" -}}
{{- $terms = list (dict) -}}
{{- $_ := set $out "what" "every Linux node (nodes=all) but Fargate and virtual-kubelet nodes" -}}
{{- else -}}
{{- range (include "reprieve.spotLabels" . | fromJsonArray) -}}
{{- $terms = append $terms (dict "matchExpressions" (list (dict "key" .key "operator" "In" "values" (list .value)))) -}}
{{- end -}}
{{- $_ := set $out "what" "the Linux nodes with a spot label of any platform" -}}
{{- end -}}
{{- $withExcluded := list -}}
{{- range $terms -}}
{{- $t := . -}}
{{- $_ := set $t "matchExpressions" (concat ($t.matchExpressions | default list) $excluded) -}}
{{- $withExcluded = append $withExcluded $t -}}
{{- end -}}
{{- $na := get $affinity "nodeAffinity" | default dict -}}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $withExcluded) -}}
{{- $_ := set $affinity "nodeAffinity" $na -}}
{{- $_ := set $out "affinity" $affinity -}}
{{- if .Values.excludeNodes -}}
{{- $_ := set $out "what" (printf "%s, less the nodes excludeNodes leaves to other handlers" $out.what) -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/*
reprieve.image is the agent's image, for every workload of the chart (the DaemonSet, the
eviction guard, the cleanup hook): pinned by digest when image.digest is set (a packaged release
sets it: deploy/release.sh), else by tag (the chart's appVersion by default).
*/}}
{{- define "reprieve.image" -}}
{{ .Values.image.repository }}{{ if .Values.image.digest }}@{{ .Values.image.digest }}{{ else }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{ end }}
{{- end -}}
