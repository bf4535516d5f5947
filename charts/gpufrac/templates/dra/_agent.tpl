{{- /* What the agent DaemonSet adds with dra.enabled (templates/agent/daemonset.yaml includes these three): the
flags, and the host paths the driver serves and writes: its plugin socket and the kubelet's registration
directory (mounted already when the CSI plugin runs), the claims' CDI specs (at a path of their own in the
container: nri.cdiSpecDirs mounts the same host directory read-only), its state. Each renders nothing with
dra.enabled false. */}}

{{- define "gpufrac.dra.agentArgs" -}}
{{- if .Values.dra.enabled }}
- --dra
- --kubelet-dir
- {{ trimSuffix "/" .Values.csi.kubeletDir | quote }}
- --dra-cdi-dir
- "/run/gpufrac/dra-cdi"
{{- /* the host directory behind it, and the runtime's CDI directories: the agent refuses claims (and says so on the
node's condition) while the runtime does not read what it writes */}}
- --dra-cdi-host-dir
- {{ .Values.dra.cdiDir | quote }}
{{- range .Values.nri.cdiSpecDirs }}
- --dra-runtime-cdi-dir
- {{ . | quote }}
{{- end }}
- --dra-state-file
- {{ printf "%s/prepared.json" (trimSuffix "/" .Values.dra.stateDir) | quote }}
- --dra-default-front-door
- {{ .Values.dra.defaultFrontDoor | quote }}
{{- end }}
{{- end }}

{{- define "gpufrac.dra.agentVolumeMounts" -}}
{{- if .Values.dra.enabled }}
{{- $kubeletDir := trimSuffix "/" .Values.csi.kubeletDir }}
- name: dra-plugin-dir
  mountPath: {{ printf "%s/plugins/gpu.gpufrac.io" $kubeletDir }}
{{- if ne .Values.mps.delivery "csi" }}
- name: dra-plugins-registry
  mountPath: {{ printf "%s/plugins_registry" $kubeletDir }}
{{- end }}
- name: dra-cdi
  mountPath: /run/gpufrac/dra-cdi
- name: dra-state
  mountPath: {{ .Values.dra.stateDir }}
{{- end }}
{{- end }}

{{- define "gpufrac.dra.agentVolumes" -}}
{{- if .Values.dra.enabled }}
{{- $kubeletDir := trimSuffix "/" .Values.csi.kubeletDir }}
- name: dra-plugin-dir
  hostPath:
    path: {{ printf "%s/plugins/gpu.gpufrac.io" $kubeletDir }}
    type: DirectoryOrCreate
{{- if ne .Values.mps.delivery "csi" }}
- name: dra-plugins-registry
  hostPath:
    path: {{ printf "%s/plugins_registry" $kubeletDir }}
    type: Directory
{{- end }}
- name: dra-cdi
  hostPath:
    path: {{ .Values.dra.cdiDir }}
    type: DirectoryOrCreate
- name: dra-state
  hostPath:
    path: {{ .Values.dra.stateDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
