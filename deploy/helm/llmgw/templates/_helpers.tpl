{{/*
The objects' names are fixed (llmgw-server, llmgw-agents, ...), not prefixed by the release:
`llmgw cert kubernetes-secrets` names the agent Service in the server's certificate and the
Secrets by these names. One release per namespace.
*/}}

{{- define "llmgw.labels" -}}
app.kubernetes.io/part-of: llmgw
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The labels of one component's objects: (list $ "llmgw-server"). */}}
{{- define "llmgw.componentLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ index . 1 }}
{{ include "llmgw.labels" $root }}
{{- end }}

{{- define "llmgw.selector" -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
{{- end }}

{{- define "llmgw.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{- define "llmgw.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The security context of a container that runs as the image's llmgw user. */}}
{{- define "llmgw.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{- define "llmgw.podSecurity" -}}
runAsUser: 999
runAsGroup: 999
fsGroup: 999
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "llmgw.agentServer" -}}
llmgw-agents.{{ .Release.Namespace }}.svc:{{ .Values.agentService.port }}
{{- end }}
