{{/* The chart's name. */}}
{{- define "subflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: the release name when it contains the chart's name
(release "subflow" gives the names config/default renders), else <release>-<chart>. */}}
{{- define "subflow.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "subflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "subflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "subflow.labels" -}}
{{ include "subflow.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: subflow
{{- end -}}

{{- define "subflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- printf "%s-controller" (include "subflow.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Names the controller is told through its flags, and the certificate's objects. */}}
{{- define "subflow.webhookService" -}}{{ include "subflow.fullname" . }}-webhook-service{{- end -}}
{{- define "subflow.certSecret" -}}{{ include "subflow.fullname" . }}-webhook-server-cert{{- end -}}
{{- define "subflow.mutatingConfiguration" -}}{{ include "subflow.fullname" . }}-mutating-webhook-configuration{{- end -}}
{{- define "subflow.validatingConfiguration" -}}{{ include "subflow.fullname" . }}-validating-webhook-configuration{{- end -}}
{{- define "subflow.certificate" -}}{{ include "subflow.fullname" . }}-serving-cert{{- end -}}
{{- define "subflow.issuer" -}}{{ include "subflow.fullname" . }}-selfsigned-issuer{{- end -}}

{{- define "subflow.selfManagedCerts" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certs "self-managed") -}}true{{- end -}}
{{- end -}}

{{- define "subflow.certManager" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certs "cert-manager") -}}true{{- end -}}
{{- end -}}

{{- define "subflow.validate" -}}
{{- if not (has .Values.webhook.certs (list "self-managed" "cert-manager")) -}}
{{- fail (printf "webhook.certs must be self-managed or cert-manager, not %q" .Values.webhook.certs) -}}
{{- end -}}
{{- end -}}

{{/* A resource list as the controller's --sidecar-requests and --sidecar-limits take it: cpu=10m,memory=32Mi. */}}
{{- /* The sidecar's image: webhook.sidecarImage as given when it names a tag or a digest, else
with the controller's tag (image.tag, else the chart's appVersion); empty stays empty. */ -}}
{{- define "subflow.sidecarImage" -}}
{{- $image := .Values.webhook.sidecarImage -}}
{{- if and $image (not (regexMatch "(:[^/]+|@.+)$" $image)) -}}
{{- $image = printf "%s:%s" $image (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- $image -}}
{{- end -}}

{{- define "subflow.resourceList" -}}
{{- $items := list -}}
{{- range $name, $quantity := . -}}
{{- $items = append $items (printf "%s=%v" $name $quantity) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}
