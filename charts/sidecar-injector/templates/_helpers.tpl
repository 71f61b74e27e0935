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
A webhook's clientConfig: the Service, at the path of its revision (/mutate, /mutate/NAME). The CA comes from
cert-manager's CA injector (the annotation below) or, with a provided Secret, from certificates.caBundle.
*/ -}}
{{- define "sidecar-injector.clientConfig" -}}
service:
  name: sidecar-injector
  namespace: sidecar-injector
  path: /{{ .path }}{{ with .revision }}/{{ . }}{{ end }}
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
revision's, those labelled sidecar-injector.io/rev=NAME. Never the system namespaces or ours.
*/ -}}
{{- define "sidecar-injector.namespaceSelector" -}}
matchExpressions:
{{- if . }}
  - key: sidecar-injector.io/rev
    operator: In
    values: [{{ . | quote }}]
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
