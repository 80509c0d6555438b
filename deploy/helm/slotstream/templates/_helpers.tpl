{{/* Names and labels shared by every object of a release. */}}
{{- define "slotstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "slotstream.labels" -}}
app.kubernetes.io/part-of: slotstream
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "slotstream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The receivers' --transport: receiver.transport when set, else rdma on RDMA nodes (receiver.rdma.enabled), else auto. */}}
{{- define "slotstream.receiverTransport" -}}
{{- .Values.receiver.transport | default (ternary "rdma" "auto" .Values.receiver.rdma.enabled) -}}
{{- end -}}

{{- define "slotstream.tokenSecret" -}}
{{- .Values.token.existingSecret | default (printf "%s-token" (include "slotstream.fullname" .)) -}}
{{- end -}}

{{/* Where senders connect: the receivers given, else the receivers' headless Service. */}}
{{- define "slotstream.receivers" -}}
{{- if .Values.receivers -}}
{{- join "," .Values.receivers -}}
{{- else -}}
{{- printf "%s-receivers.%s.svc:%v" (include "slotstream.fullname" .) .Release.Namespace .Values.receiver.controlPort -}}
{{- end -}}
{{- end -}}

{{/* The hardened security context of every long-running container: the image's unprivileged user,
     no capability, no privilege escalation, a read-only root. */}}
{{- define "slotstream.securityContext" -}}
runAsUser: {{ .Values.receiver.runAsUser }}
runAsGroup: {{ .Values.receiver.runAsUser }}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* An init container that may do one thing as root: hand a kubelet-created node directory over
     to the unprivileged user (CHOWN is its only capability). */}}
{{- define "slotstream.chownContainer" -}}
- name: {{ .name }}
  image: {{ include "slotstream.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["chown", "{{ .root.Values.receiver.runAsUser }}:{{ .root.Values.receiver.runAsUser }}", {{ .path | quote }}]
  {{- with .env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["CHOWN"]
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 32Mi}
  volumeMounts:
    - name: {{ .volume }}
      mountPath: {{ .path }}
      {{- with .subPathExpr }}
      subPathExpr: {{ . }}
      {{- end }}
{{- end -}}
