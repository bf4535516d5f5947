{{/* Names. */}}
{{- define "gpufrac.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufrac.fullname" -}}
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

{{- define "gpufrac.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of both webhook configurations (Mutating and Validating; different kinds, one name). */}}
{{- define "gpufrac.webhookConfigName" -}}
{{- include "gpufrac.fullname" . }}
{{- end }}

{{- define "gpufrac.webhook.fullname" -}}
{{- printf "%s-webhook" (include "gpufrac.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufrac.webhook.serviceName" -}}
{{- include "gpufrac.webhook.fullname" . }}
{{- end }}

{{- define "gpufrac.agent.fullname" -}}
{{- printf "%s-agent" (include "gpufrac.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufrac.mps.fullname" -}}
{{- printf "%s-mps" (include "gpufrac.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufrac.certs.fullname" -}}
{{- printf "%s-certs" (include "gpufrac.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "gpufrac.certs.secretName" -}}
{{- default (printf "%s-webhook-tls" (include "gpufrac.fullname" .)) .Values.certs.secretName }}
{{- end }}

{{/* cert-manager Certificate whose CA is injected into the webhook configurations. */}}
{{- define "gpufrac.certs.servingCertificateName" -}}
{{- printf "%s-serving" (include "gpufrac.webhook.fullname" .) }}
{{- end }}

{{- define "gpufrac.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create }}
{{- default (include "gpufrac.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpufrac.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "gpufrac.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* True ("true") when the webhook configurations point at an explicit URL (local mode). */}}
{{- define "gpufrac.urlMode" -}}
{{- if .Values.webhook.clientConfig.url }}true{{ end }}
{{- end }}

{{/* True when the chart runs the self-managed certificate reconciler. */}}
{{- define "gpufrac.selfManagedCerts" -}}
{{- if and (eq .Values.certs.mode "self-managed") (not .Values.webhook.clientConfig.url) (not .Values.webhook.clientConfig.caBundle) }}true{{ end }}
{{- end }}

{{/* The agent's --ready-condition-type flags (the agent and the uninstall hook): one per agent.readyConditionTypes,
or one "" for none. */}}
{{- define "gpufrac.agent.conditionTypeArgs" -}}
{{- if .Values.agent.readyConditionTypes }}
{{- range .Values.agent.readyConditionTypes }}
- --ready-condition-type
- {{ . | quote }}
{{- end }}
{{- else }}
- --ready-condition-type
- ""
{{- end }}
{{- end }}

{{/* labels and the pre-delete hook annotations of the uninstall hook's objects:
include "gpufrac.agent.withdrawMeta" (dict "root" . "weight" "N") */}}
{{- define "gpufrac.agent.withdrawMeta" -}}
labels:
  {{- include "gpufrac.componentLabels" (list .root "agent-withdraw") | nindent 2 }}
annotations:
  helm.sh/hook: pre-delete
  helm.sh/hook-weight: {{ .weight | quote }}
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

{{/* Labels. */}}
{{- define "gpufrac.labels" -}}
helm.sh/chart: {{ include "gpufrac.chart" . }}
app.kubernetes.io/name: {{ include "gpufrac.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpufrac
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "gpufrac.selectorLabels" (list . "webhook") */}}
{{- define "gpufrac.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "gpufrac.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The selector labels of a component as a label selector (k=v,...): include "gpufrac.selectorString" (list . "agent") */}}
{{- define "gpufrac.selectorString" -}}
{{- $labels := include "gpufrac.selectorLabels" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $key := keys $labels | sortAlpha }}{{ $pairs = append $pairs (printf "%s=%s" $key (index $labels $key)) }}{{ end -}}
{{- join "," $pairs -}}
{{- end }}

{{- define "gpufrac.componentLabels" -}}
{{- $root := index . 0 -}}
{{ include "gpufrac.labels" $root }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Image of a component: include "gpufrac.image" (list . .Values.webhook.image) */}}
{{- define "gpufrac.image" -}}
{{- $root := index . 0 -}}
{{- $img := merge (deepCopy (index . 1)) (deepCopy $root.Values.image) -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ default $root.Chart.AppVersion $img.tag }}
{{- end -}}
{{- end }}

{{- define "gpufrac.imagePullPolicy" -}}
{{- $root := index . 0 -}}
{{- $img := merge (deepCopy (index . 1)) (deepCopy $root.Values.image) -}}
{{- $img.pullPolicy }}
{{- end }}

{{/*
CEL: does `obj` (object or oldObject) carry a fraction key? An annotation named like one of KAI's pod-level
shorthands or starting with one of the per-container prefixes, or our fractional label. Guards: metadata.annotations
and metadata.labels may be absent (has()); on pods/binding the object is a Binding (it has metadata too).
*/}}
{{- define "gpufrac.cel.hasFractionKey" -}}
{{- $o := . -}}
{{- $keys := include "gpufrac.shorthandKeys" . | fromJsonArray -}}
{{- $prefixes := list "nvidia.com/container." "kai.scheduler/container." "gpufrac.io/" -}}
{{- $quoted := list -}}
{{- range $keys }}{{ $quoted = append $quoted (quote .) }}{{ end -}}
{{- $starts := list -}}
{{- range $prefixes }}{{ $starts = append $starts (printf "k.startsWith(%s)" (quote .)) }}{{ end -}}
(has({{ $o }}.metadata.annotations) && {{ $o }}.metadata.annotations.exists(k,
    k in [{{ join ", " $quoted }}]
    || {{ join "\n    || " $starts }}))
|| (has({{ $o }}.metadata.labels) && "gpufrac.io/fractional" in {{ $o }}.metadata.labels)
{{- end }}

{{/* KAI's pod-level shorthands (gpufrac.core.annotations.SHORTHAND_KEYS; tests/chart/test_chart.py checks they agree). */}}
{{- define "gpufrac.shorthandKeys" -}}
["gpu-fraction", "gpu-fraction.limit", "gpu-memory", "gpu-memory.limit", "gpu-fraction-num-devices", "gpu-fraction-container-name", "kai.scheduler/gpu-compute-sharing-mode"]
{{- end }}

{{/*
CEL: does the pod template at `t` (e.g. object.spec.template) carry a fraction annotation? Every level may be
absent in a workload (a template without metadata is valid), so each is guarded: an unguarded one is a CEL error,
i.e. failurePolicy for every workload.
*/}}
{{- define "gpufrac.cel.templateHasFractionKey" -}}
{{- $t := . -}}
{{- $quoted := list -}}
{{- range (include "gpufrac.shorthandKeys" . | fromJsonArray) }}{{ $quoted = append $quoted (quote .) }}{{ end -}}
has({{ $t }}.metadata) && has({{ $t }}.metadata.annotations) && {{ $t }}.metadata.annotations.exists(k,
    k in [{{ join ", " $quoted }}]
    || k.startsWith("nvidia.com/container.") || k.startsWith("kai.scheduler/container."))
{{- end }}

{{/*
The matchConditions of the workloads webhook: only objects whose pod template asks for a fraction are sent.
Deployment, StatefulSet, DaemonSet, ReplicaSet and Job hold it at spec.template, CronJob at
spec.jobTemplate.spec.template, PodTemplate at template.
*/}}
{{- define "gpufrac.workloadMatchConditions" -}}
{{- $root := . -}}
- name: template-has-fraction-keys
  expression: |-
    (has(object.spec) && has(object.spec.template)
     && ({{ include "gpufrac.cel.templateHasFractionKey" "object.spec.template" }}))
    || (has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec)
     && has(object.spec.jobTemplate.spec.template)
     && ({{ include "gpufrac.cel.templateHasFractionKey" "object.spec.jobTemplate.spec.template" }}))
    || (has(object.template) && ({{ include "gpufrac.cel.templateHasFractionKey" "object.template" }}))
{{- with $root.Values.webhook.extraMatchConditions }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The matchConditions of a webhook: include "gpufrac.matchConditions" (list . ALL_BINDINGS). On CREATE oldObject is
null. ALL_BINDINGS (validating only, opt-in): also every pods/binding request, whose object is a Binding that
carries no pod labels, so a fractional pod's bind is seen even when the Binding has no fraction annotations.
request.subResource is absent (not "") on requests without one: unguarded, it is a CEL error, i.e. failurePolicy
for every pod (seen on kube-apiserver 1.36.3). SCHEDULER_ELSEWHERE (optional): the scheduler's UPDATEs are kept out
by a condition of their own after these; changes-fraction-keys then passes them without comparing every key, since
the API server evaluates every condition (a bind's comparison cost ~0.1 ms per gate, issue 47).
*/}}
{{- define "gpufrac.matchConditions" -}}
{{- $root := index . 0 -}}
{{- $schedulerElsewhere := and (gt (len .) 2) (index . 2) -}}
- name: has-fraction-keys
  expression: |-
    {{- if index . 1 }}
    (has(request.subResource) && request.subResource == "binding")
    || {{ include "gpufrac.cel.hasFractionKey" "object" | nindent 4 | trim }}
    {{- else }}
    {{- include "gpufrac.cel.hasFractionKey" "object" | nindent 4 }}
    {{- end }}
    || (oldObject != null && (
    {{- include "gpufrac.cel.hasFractionKey" "oldObject" | nindent 6 }}
    ))
# An UPDATE of a pod (or of its status) is judged only when it changes a fraction key or the label: nothing else of a
# pod can change a rule's verdict (its spec is immutable but for images, tolerations and deadlines). Ephemeral
# containers are always judged (they add a container, not a key).
- name: changes-fraction-keys
  expression: |-
    request.operation != "UPDATE" || oldObject == null
    || (has(request.subResource) && request.subResource != "status")
    {{- if $schedulerElsewhere }}
    || {{ include "gpufrac.cel.isASchedulerUpdate" $root | nindent 4 | trim }}
    {{- end }}
    || {{ include "gpufrac.cel.fractionKeysChanged" . | nindent 4 | trim }}
{{- with $root.Values.webhook.extraMatchConditions }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
CEL: do object and oldObject differ in a fraction key's presence or value, or in the fractional label? Keys are
compared one by one, not as lists: a map's order is not defined.
*/}}
{{- define "gpufrac.cel.fractionKeysChanged" -}}
{{- $keys := include "gpufrac.shorthandKeys" . | fromJsonArray -}}
{{- $quoted := list -}}
{{- range $keys }}{{ $quoted = append $quoted (quote .) }}{{ end -}}
{{- $isKey := printf "(k in [%s] || k.startsWith(\"nvidia.com/container.\") || k.startsWith(\"kai.scheduler/container.\") || k.startsWith(\"gpufrac.io/\"))" (join ", " $quoted) -}}
(has(object.metadata.annotations) && object.metadata.annotations.exists(k, {{ $isKey }}
    && !(has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations
         && oldObject.metadata.annotations[k] == object.metadata.annotations[k])))
|| (has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, {{ $isKey }}
    && !(has(object.metadata.annotations) && k in object.metadata.annotations)))
|| (has(object.metadata.labels) && "gpufrac.io/fractional" in object.metadata.labels)
   != (has(oldObject.metadata.labels) && "gpufrac.io/fractional" in oldObject.metadata.labels)
|| (has(object.metadata.labels) && "gpufrac.io/fractional" in object.metadata.labels
    && has(oldObject.metadata.labels) && "gpufrac.io/fractional" in oldObject.metadata.labels
    && object.metadata.labels["gpufrac.io/fractional"] != oldObject.metadata.labels["gpufrac.io/fractional"])
{{- end }}

{{/*
Whether the mutating webhook alone judges a pod's CREATE (the lighter CREATE path; docs/admission-policies.md): it
fails closed (failurePolicy Fail), is called again after a later mutating webhook changed the pod (reinvocationPolicy
IfNeeded) and runs every validating rule on the pod as it will be stored. Then, with the policies on, neither the
validating webhook nor the pods policy evaluates a pod's CREATE. Failing open, both keep judging it.
*/}}
{{- define "gpufrac.mutatingJudgesCreate" -}}
{{- $failure := default .Values.webhook.failurePolicy .Values.webhook.mutating.failurePolicy -}}
{{- if and (include "gpufrac.policiesEnabled" .) (eq $failure "Fail") (eq .Values.webhook.mutating.reinvocationPolicy "IfNeeded") -}}
true
{{- end -}}
{{- end }}

{{/*
The matchConditions of the pods policy: the gates of every webhook and policy, and, where the validating webhook fails
closed, not the scheduler's UPDATEs (the bind-time values: issue 47's binder UPDATE). The validating webhook judges
every rule the policy carries on them (and the scheduler's own keys, which the policy leaves to it), and failing
closed it refuses them when it is down: judged again in CEL they cost the API server as much as both webhooks.
Failing open, the policy judges them as before.
*/}}
{{- define "gpufrac.podsPolicyMatchConditions" -}}
{{- $skip := or (eq (default .Values.webhook.failurePolicy .Values.webhook.validating.failurePolicy) "Fail") (include "gpufrac.mutatingJudgesSchedulerUpdates" .) }}
{{- include "gpufrac.matchConditions" (list . false $skip) }}
{{- if $skip }}
- name: not-a-scheduler-update-the-webhook-judges
  expression: |-
    {{- include "gpufrac.cel.notASchedulerUpdate" . | nindent 4 }}
{{- end }}
{{- end }}

{{/*
Whether the mutating webhook alone judges the scheduler's UPDATEs (issue 47: one webhook call per bind, not two): it
fails closed and is called again after a later mutating webhook changed the pod, and it runs every validating rule on
the pod as it will be stored. Then the validating webhook is not called on them (not-a-scheduler-update-the-mutating-
webhook-judges), nor the pods policy.
*/}}
{{- define "gpufrac.mutatingJudgesSchedulerUpdates" -}}
{{- $failure := default .Values.webhook.failurePolicy .Values.webhook.mutating.failurePolicy -}}
{{- if and (eq $failure "Fail") (eq .Values.webhook.mutating.reinvocationPolicy "IfNeeded") -}}
true
{{- end -}}
{{- end }}

{{/* CEL: an UPDATE of a pod itself (no subresource) by the scheduler's users or groups. */}}
{{- define "gpufrac.cel.isASchedulerUpdate" -}}
(request.operation == "UPDATE" && !has(request.subResource)
 && (request.userInfo.username in {{ .Values.webhook.schedulerUsers | sortAlpha | toJson }}
     || (has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {{ .Values.webhook.schedulerGroups | sortAlpha | toJson }}))))
{{- end }}

{{/* CEL: true but for the scheduler's UPDATEs. */}}
{{- define "gpufrac.cel.notASchedulerUpdate" -}}
!{{ include "gpufrac.cel.isASchedulerUpdate" . }}
{{- end }}

{{/* The operations of the pods policy: a pod's CREATE only where the mutating webhook does not judge it alone. */}}
{{- define "gpufrac.podsPolicyOperations" -}}
{{- if include "gpufrac.mutatingJudgesCreate" . -}}
["UPDATE"]
{{- else -}}
["CREATE", "UPDATE"]
{{- end -}}
{{- end }}

{{/*
The label gate (webhook.podLabelSelector, opt-in): an objectSelector on the pod webhooks and the pod and pod-status
policies, matched by the API server on labels before any matchCondition, so an unlabelled pod meets no CEL at all.
Empty when the gate is off. A Binding carries no labels: binds are gated apart (validate-bindings.gpufrac.io).
*/}}
{{- define "gpufrac.objectSelector" -}}
{{- with .Values.webhook.podLabelSelector }}
objectSelector:
  matchLabels:
    {{- range $key, $value := . }}
    {{ $key }}: {{ toString $value | quote }}
    {{- end }}
{{- end }}
{{- end }}

{{- define "gpufrac.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml (uniq (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludedNamespaces)) | nindent 6 }}
{{- end }}

{{/*
clientConfig of one webhook: include "gpufrac.clientConfig" (list . "/mutate").
url mode: <url><path> with webhook.clientConfig.caBundle. Service mode: the Service, with caBundle from
webhook.clientConfig.caBundle when given, else (self-managed certs) from the live Secret so an upgrade does not
blank it; cert-manager's cainjector fills it otherwise.
*/}}
{{- define "gpufrac.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $cc := $root.Values.webhook.clientConfig -}}
{{- if $cc.url -}}
url: {{ printf "%s%s" (trimSuffix "/" $cc.url) $path | quote }}
{{- with $cc.caBundle }}
caBundle: {{ . | quote }}
{{- end }}
{{- else -}}
service:
  name: {{ include "gpufrac.webhook.serviceName" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ $path | quote }}
  port: {{ $root.Values.webhook.service.port }}
{{- if $cc.caBundle }}
caBundle: {{ $cc.caBundle | quote }}
{{- else if include "gpufrac.selfManagedCerts" $root }}
{{- $secret := lookup "v1" "Secret" $root.Release.Namespace (include "gpufrac.certs.secretName" $root) }}
{{- if and $secret $secret.data }}
{{- with (index $secret.data "ca-bundle.crt") }}
caBundle: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpufrac.webhookConfigAnnotations" -}}
{{- $annotations := deepCopy .Values.webhook.configurationAnnotations -}}
{{- if and (eq .Values.certs.mode "cert-manager") (not .Values.webhook.clientConfig.url) (not .Values.webhook.clientConfig.caBundle) }}
{{- $_ := set $annotations "cert-manager.io/inject-ca-from" (printf "%s/%s" .Release.Namespace (include "gpufrac.certs.servingCertificateName" .)) }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* One mode's MPS pipe directory, <mps.root>/<mode>: the layout gpufrac.core.contract.mps_pipe_dir defines, and
the only place the chart spells it. Call with (list . "<mode>"). */}}
{{- define "gpufrac.mpsPipeDir" -}}
{{- printf "%s/%s" (trimSuffix "/" (index . 0).Values.mps.root) (index . 1) -}}
{{- end }}

{{/*
Refuse a release namespace where users may run GPU pods: it is excluded from the webhook, so its pods would be
exempt from every rule. `default` is refused unless allowDefaultNamespace.
*/}}
{{- define "gpufrac.checkNamespace" -}}
{{- if and (eq .Release.Namespace "default") (not .Values.allowDefaultNamespace) }}
{{- fail "gpufrac must not be installed into the default namespace: the release namespace is never sent to the webhook, so GPU pods there would be exempt. Use --namespace gpufrac-system --create-namespace, or set allowDefaultNamespace=true if no user runs pods in default" }}
{{- end }}
{{- end }}

{{/* nodeSelector of a pod: linux nodes only, plus the given selector: include "gpufrac.nodeSelector" SELECTOR */}}
{{- define "gpufrac.nodeSelector" -}}
nodeSelector:
  {{- toYaml (merge (deepCopy (default (dict) .)) (dict "kubernetes.io/os" "linux")) | nindent 2 }}
{{- end }}

{{/*
What every pod of the chart's Jobs shares (the certificate Jobs and CronJob, the uninstall hook): restartPolicy,
scheduling from certs.selfManaged (nodeSelector, tolerations, affinity, priorityClassName), imagePullSecrets and a
non-root pod securityContext. include "gpufrac.jobPod" .
*/}}
{{- define "gpufrac.jobPod" -}}
{{- $sm := .Values.certs.selfManaged -}}
restartPolicy: OnFailure
{{- include "gpufrac.nodeSelector" $sm.nodeSelector | nindent 0 }}
{{- with $sm.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $sm.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $sm.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* The securityContext of a Job's container: include "gpufrac.jobContainerSecurityContext" . */}}
{{- define "gpufrac.jobContainerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end }}

{{/* Bind argument: listen on every address of the pod's IP family (POD_IP decides): include "gpufrac.bind" PORT */}}
{{- define "gpufrac.bind" -}}
{{- printf ":%d" (int .) | quote -}}
{{- end }}

{{/* The downward-API env the programs read their pod's IP family from. */}}
{{- define "gpufrac.podIPEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/* Whether the cluster serves a Prometheus Operator kind: include "gpufrac.hasMonitoringKind" (list . "PodMonitor") */}}
{{- define "gpufrac.hasMonitoringKind" -}}
{{- $root := index . 0 -}}
{{- if $root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 1)) }}true{{ end }}
{{- end }}

{{/* --log-level and --log-format of every gpufrac container (values: log.level, log.format): include "gpufrac.logArgs" . */}}
{{- define "gpufrac.logArgs" -}}
- --log-level
- {{ .Values.log.level | quote }}
- --log-format
- {{ .Values.log.format | quote }}
{{- end }}

{{/*
Whether to render the ValidatingAdmissionPolicies: policies.enabled, on a cluster that has them in v1 (1.30+).
*/}}
{{- define "gpufrac.policiesEnabled" -}}
{{- if and .Values.policies.enabled (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) -}}
{{- if and (has "Deny" .Values.policies.validationActions) (has "Warn" .Values.policies.validationActions) -}}
{{- fail "policies.validationActions: Deny and Warn cannot be used together (the API server refuses the Binding); use [Deny], or [Warn] and/or [Audit] for a dry run" -}}
{{- end -}}
true
{{- end -}}
{{- end }}

{{/* The name of one policy and its Binding: include "gpufrac.policyName" (list . "pods"). */}}
{{- define "gpufrac.policyName" -}}
{{- printf "%s-%s" (include "gpufrac.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Whether the policies enforce everything the validating webhook checks on a pod's CREATE, so the webhook can skip
it: they are on, they deny (not a Warn/Audit dry run), and the MPS directories come by CSI (with hostPath delivery
the injection check stays with the webhook).
*/}}
{{- define "gpufrac.policiesCheckCreate" -}}
{{- if and (include "gpufrac.policiesEnabled" .) (has "Deny" .Values.policies.validationActions) (eq .Values.mps.delivery "csi") -}}
true
{{- end -}}
{{- end }}
