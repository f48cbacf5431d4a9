{{- define "fleetprof.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* labels of every object; the component's selector labels are added where used */}}
{{- define "fleetprof.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/part-of: fleetprof
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "server") */}}
{{- define "fleetprof.selector" -}}
app.kubernetes.io/name: fleetprof
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetprof.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{- define "fleetprof.serverService" -}}
{{- printf "%s-server" (include "fleetprof.fullname" .) -}}
{{- end -}}

{{- define "fleetprof.claim" -}}
{{- default (printf "%s-data" (include "fleetprof.fullname" .)) .Values.dataVolume.existingClaim -}}
{{- end -}}

{{/* the environment of every control-plane container */}}
{{- define "fleetprof.controlEnv" -}}
envFrom:
  - configMapRef: {name: {{ include "fleetprof.fullname" . }}-config}
env:
  - name: FLEETPROF_DATABASE_URL
    valueFrom: {secretKeyRef: {name: {{ .Values.database.secretName }}, key: {{ .Values.database.secretKey }}}}
{{- end -}}

{{- define "fleetprof.podSecurity" -}}
securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
