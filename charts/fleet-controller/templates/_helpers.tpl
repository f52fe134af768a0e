{{- define "fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: fleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleet.secretName" -}}
{{- default (printf "%s-credentials" (include "fleet.fullname" .)) .Values.credentials.existingSecret }}
{{- end }}

{{- define "fleet.hasCredentials" -}}
{{- if or .Values.credentials.existingSecret (and .Values.credentials.clientId .Values.credentials.clientSecret) }}true{{ end }}
{{- end }}

{{- define "fleet.mirrorNamespace" -}}
{{- default .Release.Namespace .Values.mirror.namespace }}
{{- end }}

{{/* The HA mode (docs/behaviour.md#high-availability): the store is PostgreSQL. */}}
{{- define "fleet.ha" -}}
{{- if or .Values.database.existingSecret .Values.database.url (hasPrefix "postgres" .Values.databaseUrl) }}true{{ end }}
{{- end }}

{{- define "fleet.databaseSecretName" -}}
{{- default (printf "%s-database" (include "fleet.fullname" .)) .Values.database.existingSecret }}
{{- end }}

{{/* FLEET_REPLICA_SECRET's Secret in the HA mode (docs/behaviour.md#high-availability). */}}
{{- define "fleet.replicaSecretName" -}}
{{- default (printf "%s-replica" (include "fleet.fullname" .)) .Values.replicaSecret.existingSecret }}
{{- end }}
