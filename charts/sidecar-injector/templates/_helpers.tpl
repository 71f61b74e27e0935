{{- /*
The pieces the objects share. The chart adds no labels or annotations of Helm's own (helm.sh/chart,
app.kubernetes.io/instance, ...): it renders exactly the objects of manifests/, which tests/e2e/helm.rs compares
with `kubectl kustomize` object by object. `helm install` still marks every object as the release's (the label
app.kubernetes.io/managed-by: Helm and the meta.helm.sh/release-* annotations it adds itself).

The names and the namespace are fixed, as in manifests/: the injector leaves its own namespace, sidecar-injector,
out by that name (core/src/decision.rs), the webhooks' selectors do too, and `certs` issues its certificate for the
Service sidecar-injector.sidecar-injector.svc.
*/ -}}

{{- define "sidecar-injector.labels" -}}
app.kubernetes.io/name: sidecar-injector
{{- end }}

{{- /*
A webhook's clientConfig: the Service, at the path of its revision (/mutate, /mutate/NAME) and, for a revision tag's
webhook, the tag (/mutate/NAME/tag/TAG). The CA comes from cert-manager's CA injector (the annotation below) or,
with a provided Secret, from certificates.caBundle.
*/ -}}
{{- define "sidecar-injector.clientConfig" -}}
service:
  name: sidecar-injector
  namespace: sidecar-injector
  path: /{{ .path }}{{ with .revision }}/{{ . }}{{ end }}{{ with .tag }}/tag/{{ . }}{{ end }}
  port: 443
{{- if eq .root.Values.certificates.mode "secret" }}
caBundle: {{ required "certificates.caBundle: the PEM of the CA that signed the Secret's certificate (certificates.mode secret)" .root.Values.certificates.caBundle | b64enc }}
{{- end }}
{{- end }}

{{- /* cert-manager's CA injector keeps the caBundle of every webhook of the configuration current. */ -}}
{{- define "sidecar-injector.caInjection" -}}
{{- if eq .Values.certificates.mode "certManager" -}}
annotations:
  cert-manager.io/inject-ca-from: sidecar-injector/sidecar-injector-serving
{{- end }}
{{- end }}

{{- /*
The namespaces a revision's webhooks see: the default revision's, those opted in and on no named revision; a named
revision's, those labelled sidecar-injector.io/rev=NAME; a revision tag's, those labelled with the tag. Never the
system namespaces or ours. Given (dict "revision" NAME "tag" TAG), either may be empty.
*/ -}}
{{- define "sidecar-injector.namespaceSelector" -}}
matchExpressions:
{{- if or .tag .revision }}
  - key: sidecar-injector.io/rev
    operator: In
    values: [{{ .tag | default .revision | quote }}]
{{- else }}
  - key: sidecar-injector.io/inject
    operator: In
    values: [enabled]
  - key: sidecar-injector.io/rev
    operator: DoesNotExist
{{- end }}
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [kube-system, kube-node-lease, kube-public, sidecar-injector]
{{- end }}

{{- /* The pods the two pod webhooks leave to the API server to skip (manifests/base/mutatingwebhookconfiguration.yaml). */ -}}
{{- define "sidecar-injector.podSelection" -}}
objectSelector:
  matchExpressions:
    - key: sidecar-injector.io/inject
      operator: NotIn
      values: ["false", "no", "off", "0", "disabled"]
matchConditions:
  - name: not-opted-out-by-annotation
    expression: >-
      !has(object.metadata.annotations) ||
      !('sidecar-injector.io/inject' in object.metadata.annotations) ||
      !(object.metadata.annotations['sidecar-injector.io/inject'].trim().lowerAscii()
      in ['false', 'no', 'off', '0', 'disabled'])
  - name: not-a-mirror-pod
    expression: >-
      !has(object.metadata.annotations) ||
      !('kubernetes.io/config.mirror' in object.metadata.annotations)
{{- end }}

{{- /*
The webhook's name: NAME.sidecar-injector.io for the default revision, REVISION.NAME... for a named one, and
TAG.tag. before either for a revision tag's (as `sidecar-injector tag set` names them).
*/ -}}
{{- define "sidecar-injector.webhookName" -}}
{{ with .tag }}{{ . }}.tag.{{ end }}{{ with .revision }}{{ . }}.{{ end }}{{ .name }}.sidecar-injector.io
{{- end }}

{{- /*
The revision tags (revisionTags: TAG -> REVISION), each checked: a DNS label that is not a revision's name, pointing
to `default` or one of .Values.revisions. Renders a YAML map of TAG -> the revision as the chart names it ("" for
the default revision).
*/ -}}
{{- define "sidecar-injector.tags" -}}
{{- range $tag, $revision := .Values.revisionTags }}
{{- if or (eq $tag "default") (has $tag $.Values.revisions) }}
{{- fail (printf "revisionTags.%s: %q is a revision's name: a namespace labelled with it would be that revision's and the tag's" $tag $tag) }}
{{- end }}
{{- if not (or (eq $revision "default") (has $revision $.Values.revisions)) }}
{{- fail (printf "revisionTags.%s: revision %q is neither default nor one of revisions" $tag $revision) }}
{{- end }}
{{ $tag }}: {{ ternary "" $revision (eq $revision "default") | quote }}
{{- end }}
{{- end }}
