{{/* What the agent holds on its node beyond the audit (enforcement.*, reclaim.*): its flags, and whether it may
evict. `policy: off` written unquoted is YAML's false: it means off too. */}}
{{- define "gpufrac.reclaimPolicy" -}}
{{- $policy := .Values.reclaim.policy -}}
{{- if or (kindIs "bool" $policy) (eq (toString $policy) "off") -}}off{{- else -}}{{ $policy }}{{- end -}}
{{- end }}

{{- define "gpufrac.agent.guaranteeArgs" -}}
- --over-limit-action
- {{ .Values.enforcement.overLimitAction | quote }}
- --without-hard-limit
- {{ .Values.enforcement.withoutHardLimit | quote }}
- --reclaim-policy
- {{ include "gpufrac.reclaimPolicy" . | quote }}
- --reclaim-grace-period
- {{ .Values.reclaim.gracePeriodSeconds | quote }}
- --reclaim-hysteresis-mib
- {{ .Values.reclaim.hysteresisMiB | quote }}
- --reclaim-backoff
- {{ .Values.reclaim.backoffSeconds | quote }}
- --reclaim-victim-grace-period
- {{ if kindIs "invalid" .Values.reclaim.victimGracePeriodSeconds }}"-1"{{ else }}{{ .Values.reclaim.victimGracePeriodSeconds | int64 | quote }}{{ end }}
{{- if not (kindIs "invalid" .Values.reclaim.protectedPriority) }}
- --reclaim-protected-priority
- {{ .Values.reclaim.protectedPriority | int64 | quote }}
{{- end }}
{{- if .Values.reclaim.evictGangMembers }}
- --reclaim-evict-gang-members
{{- end }}
{{- end }}

{{/* "true" when the agent can evict: overLimitAction evict, reclaim evict, or --evict-on-violation in extraArgs. */}}
{{- define "gpufrac.agent.mayEvict" -}}
{{- if or (eq .Values.enforcement.overLimitAction "evict") (eq (include "gpufrac.reclaimPolicy" .) "evict") (has "--evict-on-violation" .Values.agent.extraArgs) -}}true{{- end -}}
{{- end }}

{{/* The host paths the release writes on each node, removed at the uninstall (the agent's --withdraw-host-path):
the NRI plugin's lock directory, the MPS pipe directories and shared memory, the DRA state and the claims' CDI
specs. The MPS logs (mps.logRoot) stay for a post-mortem: docs/operations.md, "Uninstall". */}}
{{- define "gpufrac.agent.hostPaths" -}}
- /run/gpufrac/nri
- {{ .Values.mps.root }}
{{- if .Values.dra.enabled }}
- {{ .Values.dra.stateDir }}
- {{ printf "%s/gpu.gpufrac.io-claim_*.json" (trimSuffix "/" .Values.dra.cdiDir) }}
{{- end }}
{{- end }}
