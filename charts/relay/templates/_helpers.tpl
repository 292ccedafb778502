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
{{- required "adminToken.existingSecret is required: create the Secret first (see values.yaml)" .Values.adminToken.existingSecret -}}
{{- end -}}

{{/* Services that serve or call the admin-token routes; no other pod gets the token. */}}
{{- define "relay.usesToken" -}}
{{- if has .service (list "ingress" "replicator" "retainer") }}true{{ end -}}
{{- end -}}

{{/*
The replica count a partition owner (queue-writer, retainer) is rendered with. A change of its
owners moves partition ownership: only the operator does that safely, by verified hand-offs.
- First install (no StatefulSet yet): the value asked.
- Upgrade with the operator: the live count stays (the operator alone changes it); the value asked
  goes to the RelayPool, which plans the moves.
- Upgrade without the operator and a different count: refused.
Other services: the value asked. `lookup` sees the cluster only on a real install or upgrade.
Arguments: root, service, values.
*/}}
{{- define "relay.replicas" -}}
{{- $wanted := int .values.replicas -}}
{{- if has .service (list "queue-writer" "retainer") -}}
{{- $name := printf "%s-%s" (include "relay.fullname" .root) .service -}}
{{- $live := lookup "apps/v1" "StatefulSet" .root.Release.Namespace $name -}}
{{- if and $live (ne (int $live.spec.replicas) $wanted) -}}
{{- if not .root.Values.operator.enabled -}}
{{- fail (printf "%s replicas %d -> %d moves partition ownership, which the chart cannot do safely: enable the operator (operator.enabled=true) and scale the RelayPool %s" .service (int $live.spec.replicas) $wanted .service) -}}
{{- end -}}
{{- int $live.spec.replicas -}}
{{- else -}}
{{- $wanted -}}
{{- end -}}
{{- else -}}
{{- $wanted -}}
{{- end -}}
{{- end -}}

{{/* The Redis URL inside a pod: the password from its Secret, the CA from its mount. */}}
{{- define "relay.redisUrl" -}}
{{- $url := .Values.redis.url -}}
{{- if .Values.redis.passwordSecret -}}
{{- $url = regexReplaceAll "^(rediss?://)" $url "${1}:$(RELAY_REDIS_PASSWORD)@" -}}
{{- end -}}
{{- if .Values.redis.caSecret -}}
{{- $url = printf "%s%sssl_ca_certs=/etc/relay/redis-ca/ca.crt" $url (ternary "&" "?" (contains "?" $url)) -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/*
The pod spec shared by every service: non-root, read-only root filesystem, no capabilities,
probes on /healthz and /readyz, a 10 s grace that covers the services' drain-and-commit (the
ingress adds its preStop drain to it). Arguments: root, service (name), values (the service's
values), stateful (bool), replicas (the rendered count, stateful only).
*/}}
{{- define "relay.podSpec" -}}
{{- $ingress := eq .service "ingress" -}}
terminationGracePeriodSeconds: {{ if $ingress }}{{ add 11 .values.preStopSeconds .values.wsCloseSeconds }}{{ else }}10{{ end }}
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
      {{- if include "relay.usesToken" . }}
      - name: RELAY_ADMIN_TOKEN
        valueFrom: {secretKeyRef: {name: {{ include "relay.adminSecret" .root }}, key: {{ .root.Values.adminToken.key }}}}
      {{- end }}
      {{- if hasPrefix "SASL" .root.Values.kafka.securityProtocol }}
      - name: RELAY_KAFKA__SASL_USERNAME
        valueFrom: {secretKeyRef: {name: {{ required "kafka.saslSecret is required for SASL" .root.Values.kafka.saslSecret }}, key: username}}
      - name: RELAY_KAFKA__SASL_PASSWORD
        valueFrom: {secretKeyRef: {name: {{ .root.Values.kafka.saslSecret }}, key: password}}
      {{- end }}
      {{- with .root.Values.kafka.tls }}
      {{- if .caSecret }}
      - {name: RELAY_KAFKA__SSL_CAFILE, value: /etc/relay/kafka-ca/ca.crt}
      {{- end }}
      {{- if .clientSecret }}
      - {name: RELAY_KAFKA__SSL_CERTFILE, value: /etc/relay/kafka-client/tls.crt}
      - {name: RELAY_KAFKA__SSL_KEYFILE, value: /etc/relay/kafka-client/tls.key}
      {{- end }}
      {{- end }}
      {{- if has .service (list "ingress" "delivery") }}
      {{- if .root.Values.redis.passwordSecret }}
      - name: RELAY_REDIS_PASSWORD
        valueFrom: {secretKeyRef: {name: {{ .root.Values.redis.passwordSecret }}, key: {{ .root.Values.redis.passwordKey }}}}
      {{- end }}
      - {name: RELAY_REDIS_URL, value: {{ include "relay.redisUrl" .root | quote }}}
      {{- end }}
      {{- if .stateful }}
      - {name: RELAY_DATA__DIR, value: /data}
      - {name: RELAY_DATA__REPLICAS, value: {{ .replicas | quote }}}
      {{- end }}
      {{- if $ingress }}
      # Lame duck on SIGTERM: unready but serving for preStopSeconds (the endpoint removal
      # spreads), then WebSockets closed at a bounded rate within wsCloseSeconds, then the drain.
      - {name: RELAY_LAME_DUCK_UNREADY_S, value: {{ .values.preStopSeconds | quote }}}
      - {name: RELAY_LAME_DUCK_S, value: {{ add 1 .values.preStopSeconds .values.wsCloseSeconds | quote }}}
      {{- end }}
      {{- if eq .service "replicator" }}
      # Every replicator's address on the headless service: each learns the others' site ids.
      - {name: RELAY_KV__PEERS, value: {{ include "relay.replicatorUrls" .root | quote }}}
      {{- end }}
      {{- if and (eq .service "retainer") .root.Values.replicator.enabled }}
      # The replicators hold the /ds replica-set targets: read at start and every 10 s.
      - {name: RELAY_RETAINED__REPLICATORS, value: {{ include "relay.replicatorUrls" .root | quote }}}
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
      {{- if .root.Values.kafka.tls.caSecret }}
      - {name: kafka-ca, mountPath: /etc/relay/kafka-ca, readOnly: true}
      {{- end }}
      {{- if .root.Values.kafka.tls.clientSecret }}
      - {name: kafka-client, mountPath: /etc/relay/kafka-client, readOnly: true}
      {{- end }}
      {{- if and .root.Values.redis.caSecret (has .service (list "ingress" "delivery")) }}
      - {name: redis-ca, mountPath: /etc/relay/redis-ca, readOnly: true}
      {{- end }}
volumes:
  - name: tmp
    emptyDir: {}
  {{- if .root.Values.kafka.tls.caSecret }}
  - name: kafka-ca
    secret: {secretName: {{ .root.Values.kafka.tls.caSecret }}, items: [{key: ca.crt, path: ca.crt}]}
  {{- end }}
  {{- if .root.Values.kafka.tls.clientSecret }}
  - name: kafka-client
    secret: {secretName: {{ .root.Values.kafka.tls.clientSecret }}}
  {{- end }}
  {{- if and .root.Values.redis.caSecret (has .service (list "ingress" "delivery")) }}
  - name: redis-ca
    secret: {secretName: {{ .root.Values.redis.caSecret }}, items: [{key: ca.crt, path: ca.crt}]}
  {{- end }}
{{- end -}}

{{/* Pod template annotations: a change of the configuration rolls the pods. */}}
{{- define "relay.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/config.yaml") .root | sha256sum }}
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
      annotations: {{- include "relay.podAnnotations" . | nindent 8 }}
    spec: {{- include "relay.podSpec" . | nindent 6 }}
{{- end -}}

{{/* Stateful owners: instance k of n is the pod with ordinal k; each keeps its own volume. */}}
{{- define "relay.statefulset" -}}
{{- $replicas := include "relay.replicas" . -}}
{{- $ctx := dict "root" .root "service" .service "values" .values "stateful" .stateful "replicas" $replicas -}}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ include "relay.fullname" .root }}-{{ .service }}
  labels: {{- include "relay.labels" . | nindent 4 }}
spec:
  serviceName: {{ include "relay.fullname" .root }}-{{ .service }}
  replicas: {{ $replicas }}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{- include "relay.selector" . | nindent 6 }}
  template:
    metadata:
      labels: {{- include "relay.labels" . | nindent 8 }}
      annotations: {{- include "relay.podAnnotations" . | nindent 8 }}
    spec: {{- include "relay.podSpec" $ctx | nindent 6 }}
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

{{/* Every replicator's URL on its headless service, as a JSON list. */}}
{{- define "relay.replicatorUrls" -}}
{{- $name := printf "%s-replicator" (include "relay.fullname" .) }}
{{- $urls := list }}
{{- range $k := until (int .Values.replicator.replicas) }}
{{- $urls = append $urls (printf "http://%s-%d.%s:8080" $name $k $name) }}
{{- end }}
{{- toJson $urls }}
{{- end }}
