{{/* The one image both containers run. */}}
{{- define "macvtap.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The kubelet dir without a trailing slash. */}}
{{- define "macvtap.kubeletDir" -}}
{{ trimSuffix "/" .Values.kubeletDir }}
{{- end -}}
