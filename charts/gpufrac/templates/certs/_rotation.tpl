{{/*
RBAC of the certificate reconciler: include "gpufrac.certs.rbac" (dict "root" . "name" NAME "hook" BOOL).
Narrow: the one Secret (create cannot be limited by name) and the two webhook configurations by name.
*/}}
{{- define "gpufrac.certs.rbac" -}}
{{- $root := .root -}}
{{- $meta := include "gpufrac.certs.hookMeta" (dict "root" $root "hook" .hook "weight" "-10") -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- $meta | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- $meta | nindent 2 }}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: [{{ include "gpufrac.certs.secretName" $root | quote }}]
    verbs: ["get", "update", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- $meta | nindent 2 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $root.Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  {{- $meta | nindent 2 }}
rules:
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    resourceNames: [{{ include "gpufrac.webhookConfigName" $root | quote }}]
    verbs: ["get", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  {{- $meta | nindent 2 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}

{{/* labels (+ hook annotations when hook): include "gpufrac.certs.hookMeta" (dict "root" . "hook" BOOL "phases" "..." "weight" "N") */}}
{{- define "gpufrac.certs.hookMeta" -}}
labels:
  {{- include "gpufrac.componentLabels" (list .root "certs") | nindent 2 }}
{{- if .hook }}
annotations:
  helm.sh/hook: {{ default "pre-install,pre-upgrade,post-install,post-upgrade" .phases }}
  helm.sh/hook-weight: {{ .weight | quote }}
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}
{{- end }}

{{/* Pod spec of a reconciler run: include "gpufrac.certs.podSpec" (dict "root" . "sa" NAME "extraArgs" LIST) */}}
{{- define "gpufrac.certs.podSpec" -}}
{{- $root := .root -}}
{{- $sm := $root.Values.certs.selfManaged -}}
serviceAccountName: {{ .sa }}
{{- include "gpufrac.jobPod" $root | nindent 0 }}
containers:
  - name: rotate
    image: {{ include "gpufrac.image" (list $root $root.Values.webhook.image) }}
    imagePullPolicy: {{ include "gpufrac.imagePullPolicy" (list $root $root.Values.webhook.image) }}
    command: ["gpufrac"]
    args:
      - certs
      - rotate
      - --namespace
      - {{ $root.Release.Namespace | quote }}
      - --secret
      - {{ include "gpufrac.certs.secretName" $root | quote }}
      - --service
      - {{ include "gpufrac.webhook.serviceName" $root | quote }}
      - --webhook-config
      - {{ include "gpufrac.webhookConfigName" $root | quote }}
      - --ca-validity-days
      - {{ $sm.caValidityDays | quote }}
      - --ca-renew-before-days
      - {{ $sm.caRenewBeforeDays | quote }}
      - --cert-validity-days
      - {{ $sm.certValidityDays | quote }}
      - --renew-before-days
      - {{ $sm.renewBeforeDays | quote }}
      - --overlap-minutes
      - {{ $sm.overlapMinutes | quote }}
      {{- include "gpufrac.logArgs" $root | nindent 6 }}
      {{- range .extraArgs }}
      - {{ . | quote }}
      {{- end }}
    {{- with $sm.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- include "gpufrac.jobContainerSecurityContext" $root | nindent 4 }}
{{- end }}
