{{- define "relay.fullname" -}}
{{- printf "%s-relay" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "relay.labels" -}}
app.kubernetes.io/name: relay
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "relay.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end -}}

{{- define "relay.adminSecret" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin" (include "relay.fullname" .)) -}}
{{- end -}}

{{/*
The pod spec shared by every service: non-root, read-only root filesystem, no capabilities,
probes on /healthz and /readyz, a 10 s grace that covers the services' drain-and-commit.
Arguments: root, service (name), values (the service's values), stateful (bool).
*/}}
{{- define "relay.podSpec" -}}
terminationGracePeriodSeconds: 10
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
containers:
  - name: {{ .service }}
    image: "{{ .root.Values.image.repository }}-{{ .service }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}"
    imagePullPolicy: {{ .root.Values.image.pullPolicy }}
    ports:
      - {name: http, containerPort: 8080, protocol: TCP}
    envFrom:
      - configMapRef: {name: {{ include "relay.fullname" .root }}}
    env:
      - name: RELAY_INSTANCE
        valueFrom: {fieldRef: {fieldPath: metadata.name}}
      - name: RELAY_ADMIN_TOKEN
        valueFrom: {secretKeyRef: {name: {{ include "relay.adminSecret" .root }}, key: token}}
      {{- if hasPrefix "SASL" .root.Values.kafka.securityProtocol }}
      - name: RELAY_KAFKA__SASL_USERNAME
        valueFrom: {secretKeyRef: {name: {{ required "kafka.saslSecret is required for SASL" .root.Values.kafka.saslSecret }}, key: username}}
      - name: RELAY_KAFKA__SASL_PASSWORD
        valueFrom: {secretKeyRef: {name: {{ .root.Values.kafka.saslSecret }}, key: password}}
      {{- end }}
      {{- if .stateful }}
      - {name: RELAY_DATA__DIR, value: /data}
      - {name: RELAY_DATA__REPLICAS, value: {{ .values.replicas | quote }}}
      {{- end }}
      {{- if eq .service "replicator" }}
      {{- $name := printf "%s-%s" (include "relay.fullname" .root) .service }}
      {{- $peers := list }}
      {{- range $k := until (int .values.replicas) }}
      {{- $peers = append $peers (printf "http://%s-%d.%s:8080" $name $k $name) }}
      {{- end }}
      # Every replicator's address on the headless service: each learns the others' site ids.
      - {name: RELAY_KV__PEERS, value: {{ toJson $peers | quote }}}
      {{- end }}
    startupProbe:
      httpGet: {path: /healthz, port: http}
      periodSeconds: 2
      failureThreshold: 30
    livenessProbe:
      httpGet: {path: /healthz, port: http}
      periodSeconds: 10
    readinessProbe:
      httpGet: {path: /readyz, port: http}
      periodSeconds: 5
    resources: {{- toYaml .values.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
      {{- if .stateful }}
      - {name: data, mountPath: /data}
      {{- end }}
volumes:
  - name: tmp
    emptyDir: {}
{{- end -}}

{{- define "relay.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "relay.fullname" .root }}-{{ .service }}
  labels: {{- include "relay.labels" . | nindent 4 }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels: {{- include "relay.selector" . | nindent 6 }}
  template:
    metadata:
      labels: {{- include "relay.labels" . | nindent 8 }}
    spec: {{- include "relay.podSpec" . | nindent 6 }}
{{- end -}}

{{/* Stateful owners: instance k of n is the pod with ordinal k; each keeps its own volume. */}}
{{- define "relay.statefulset" -}}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ include "relay.fullname" .root }}-{{ .service }}
  labels: {{- include "relay.labels" . | nindent 4 }}
spec:
  serviceName: {{ include "relay.fullname" .root }}-{{ .service }}
  replicas: {{ .values.replicas }}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{- include "relay.selector" . | nindent 6 }}
  template:
    metadata:
      labels: {{- include "relay.labels" . | nindent 8 }}
    spec: {{- include "relay.podSpec" . | nindent 6 }}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        {{- with .values.storage.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ .values.storage.size }}
{{- end -}}

{{- define "relay.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "relay.fullname" .root }}-{{ .service }}
  labels: {{- include "relay.labels" . | nindent 4 }}
spec:
  {{- if .headless }}
  clusterIP: None
  {{- else }}
  type: {{ .type | default "ClusterIP" }}
  {{- end }}
  selector: {{- include "relay.selector" . | nindent 4 }}
  ports:
    - {name: http, port: {{ .port | default 8080 }}, targetPort: http, protocol: TCP}
{{- end -}}
