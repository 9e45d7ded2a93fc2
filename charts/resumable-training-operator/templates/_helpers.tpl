{{/*
Names. The application is "rtj-operator" (the name the operator's own manifests use). Objects
are named after the release: the release name itself when it already contains "rtj-operator",
else "<release>-operator", so both `helm install rtj-operator` and `helm install rtj` name
everything "rtj-operator". At most 52 characters, so that suffixes such as "-cluster" and
"-metrics" keep names within 63.
*/}}
{{- define "rtj.name" -}}
{{- default "rtj-operator" .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "rtj.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else if contains (include "rtj.name" .) .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-operator" .Release.Name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "rtj.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels on every object. */}}
{{- define "rtj.labels" -}}
helm.sh/chart: {{ include "rtj.chart" . }}
{{ include "rtj.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: resumable-training
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Deployment's selector: never changes across upgrades. */}}
{{- define "rtj.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rtj.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rtj.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rtj.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rtj.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* True (non-empty) when the operator serves every namespace. */}}
{{- define "rtj.clusterwide" -}}
{{- if eq .Values.watch.mode "all-namespaces" }}true{{ end }}
{{- end }}

{{/*
Checks the JSON schema cannot express; each fails the install with the value's name.
*/}}
{{- define "rtj.validate" -}}
{{- if and (not .Values.peering.enabled) (gt (int .Values.replicas) 1) }}
{{- fail (printf "replicas: %d needs peering.enabled: true (without peering, replicas would all act at once)" (int .Values.replicas)) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "serviceMonitor.enabled needs metrics.enabled: true (the ServiceMonitor scrapes the metrics Service)" }}
{{- end }}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.health.port)) }}
{{- fail (printf "metrics.port and health.port must differ (both are %d)" (int .Values.health.port)) }}
{{- end }}
{{- if and (eq .Values.watch.mode "all-namespaces") .Values.watch.namespaces }}
{{- fail "watch.namespaces is set but watch.mode is all-namespaces: set watch.mode: namespaces to serve only those namespaces, or empty watch.namespaces" }}
{{- end }}
{{- with .Values.serviceMonitor }}
{{- if and .enabled (gt (include "rtj.durationMs" .scrapeTimeout | int64) (include "rtj.durationMs" .interval | int64)) }}
{{- fail (printf "serviceMonitor.scrapeTimeout (%s) must not exceed serviceMonitor.interval (%s): Prometheus refuses such a scrape" .scrapeTimeout .interval) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A duration of the schema's form ("30s", "1m30s", "500ms") in milliseconds.
*/}}
{{- define "rtj.durationMs" -}}
{{- $total := 0 -}}
{{- $unitMs := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" (toString .) -1 -}}
{{- $digits := regexFind "^[0-9]+" . -}}
{{- $total = add $total (mul ($digits | int64) (get $unitMs (trimPrefix $digits .))) -}}
{{- end -}}
{{- $total -}}
{{- end }}

{{/*
"true" when the ValidatingAdmissionPolicy is rendered: enabled, and the cluster is Kubernetes
1.30 or newer (admissionregistration.k8s.io/v1 has the kind from 1.30 on). On 1.29 the chart
installs without it and NOTES.txt says so; `helm template` renders it unless --kube-version
says 1.29.
*/}}
{{- define "rtj.admissionPolicyInstalled" -}}
{{- if and .Values.admissionPolicy.enabled (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end }}
