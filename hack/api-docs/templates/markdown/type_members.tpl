{{- define "type_members" -}}
{{- $field := . -}}
{{- if eq $field.Name "metadata" -}}
Refer to Kubernetes API documentation for fields of `metadata`.
{{- else -}}
{{- /* Join a comment's wrapped lines; keep its paragraphs apart. */ -}}
{{ regexReplaceAll "([^\n])\n([^\n])" $field.Doc "${1} ${2}" | markdownRenderFieldDoc }}
{{- end -}}
{{- end -}}

{{- /* validation renders a field's or type's markers: the kubebuilder ones crd-ref-docs reads,
then each CEL rule's message. */ -}}
{{- define "validation" -}}
{{- range .Validation -}}
{{ . | replace ": {}" "" | markdownRenderFieldDoc }}<br />
{{- end -}}
{{- /* A field without rules of its own carries its type's, which the type lists. */ -}}
{{- $inherited := list -}}
{{- with .Type -}}
{{- range index .Markers "kubebuilder:validation:XValidation" }}{{ $inherited = append $inherited .Message }}{{ end -}}
{{- with .UnderlyingType -}}
{{- range index .Markers "kubebuilder:validation:XValidation" }}{{ $inherited = append $inherited .Message }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range index .Markers "kubebuilder:validation:XValidation" -}}
{{- if not (has .Message $inherited) -}}
Rule: {{ .Message | markdownRenderFieldDoc }}<br />
{{- end -}}
{{- end -}}
{{- end -}}
