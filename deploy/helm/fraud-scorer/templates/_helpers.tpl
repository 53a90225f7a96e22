{{/* Names and labels. */}}
{{- define "fraud-scorer.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fraud-scorer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fraud-scorer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fraud-scorer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The scorer's pods: the release's pods less the features worker's, so that its workload, its
autoscaler (an HPA averages CPU over the pods of its target's selector) and its disruption
budget count no worker pod.
*/}}
{{- define "fraud-scorer.scorerSelectorLabels" -}}
{{ include "fraud-scorer.selectorLabels" . }}
app.kubernetes.io/component: scorer
{{- end -}}

{{- define "fraud-scorer.labels" -}}
{{ include "fraud-scorer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fraud-scorer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The features worker's image: its own tag while an upgrade holds it back, else the scorer's. */}}
{{- define "fraud-scorer.featuresImage" -}}
{{- printf "%s:%s" .Values.image.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.features.imageTag) -}}
{{- end -}}

{{/* The Secret holding the librdkafka properties file, if any. */}}
{{- define "fraud-scorer.kafkaConfigSecret" -}}
{{- if .Values.kafka.config.existingSecret -}}
{{- .Values.kafka.config.existingSecret -}}
{{- else if .Values.kafka.config.properties -}}
{{- printf "%s-kafka" (include "fraud-scorer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
The Secret the topics Job mounts. The Job is a pre-install hook, so it runs before any of the
release's own objects exist: a chart-created Secret would not be there yet. It gets its own
copy, created as a hook just before it (topics-job.yaml); an existing Secret is there already.
*/}}
{{- define "fraud-scorer.topicsKafkaConfigSecret" -}}
{{- if .Values.kafka.config.existingSecret -}}
{{- .Values.kafka.config.existingSecret -}}
{{- else if .Values.kafka.config.properties -}}
{{- printf "%s-topics-kafka" (include "fraud-scorer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
A chart-created Secret holding the librdkafka properties file, one key=value per line.
Arguments: dict "root" $ "name" NAME "annotations" DICT (hook annotations, or empty).
*/}}
{{- define "fraud-scorer.kafkaConfigSecretObject" -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  labels:
    {{- include "fraud-scorer.labels" .root | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
type: Opaque
stringData:
  {{ .root.Values.kafka.config.key }}: |
    {{- range $key, $value := .root.Values.kafka.config.properties }}
    {{ $key }}={{ $value }}
    {{- end }}
{{- end -}}

{{/* The pods' ServiceAccount: the release's own, or an existing one (create: false). */}}
{{- define "fraud-scorer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fraud-scorer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The topics Job's ServiceAccount: for the reason above, a hook-scoped one when the chart
creates the pods' ServiceAccount, else the same existing one. */}}
{{- define "fraud-scorer.topicsServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-topics" (include "fraud-scorer.fullname" .) -}}
{{- else -}}
{{- include "fraud-scorer.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/*
A ServiceAccount of the chart, with serviceAccount.annotations (say, the cloud IAM role that
Kafka authentication needs). Arguments: dict "root" $ "name" NAME "annotations" DICT (hook
annotations, or empty).
*/}}
{{- define "fraud-scorer.serviceAccountObject" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  labels:
    {{- include "fraud-scorer.labels" .root | nindent 4 }}
  {{- with merge (dict) .annotations .root.Values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
# Nothing the chart runs calls the Kubernetes API.
automountServiceAccountToken: false
{{- end -}}

{{/*
What every pod of the chart shares: its identity, security context and pull secrets.
Arguments: dict "root" $ "serviceAccount" NAME.
*/}}
{{- define "fraud-scorer.podIdentity" -}}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: false
{{- with .root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "fraud-scorer.kafkaConfigDir" -}}/etc/fraud-scorer/kafka{{- end -}}

{{/*
The environment of the scorer's containers (replicas and topics Job): where Kafka is, the
topics and the group (the ScaledObject reads the same values), then the free-form `env` values
and the `extraEnv` entries. Settings the chart derives from other values cannot be overridden
through either.
*/}}
{{- define "fraud-scorer.env" -}}
{{- $reserved := list "KAFKA_BOOTSTRAP_SERVERS" "FRAUD_INPUT_TOPIC" "FRAUD_OUTPUT_TOPIC" "FRAUD_DLQ_TOPIC" "FRAUD_GROUP_ID" "FRAUD_METRICS_PORT" "FRAUD_SHUTDOWN_TIMEOUT_S" "FRAUD_KAFKA_CONFIG_FILE" "FRAUD_INSTANCE_ID" -}}
{{- range $name, $value := .Values.env }}
{{- if has $name $reserved }}
{{- fail (printf "env.%s is set by the chart from other values (kafka.*, metrics.port, shutdownTimeoutSeconds)" $name) }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name $reserved }}
{{- fail (printf "extraEnv %s is set by the chart from other values (kafka.*, metrics.port, shutdownTimeoutSeconds)" .name) }}
{{- end }}
{{- if hasKey $.Values.env .name }}
{{- fail (printf "%s is in both env and extraEnv: keep one" .name) }}
{{- end }}
{{- end }}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: FRAUD_INPUT_TOPIC
  value: {{ .Values.kafka.inputTopic | quote }}
- name: FRAUD_OUTPUT_TOPIC
  value: {{ .Values.kafka.outputTopic | quote }}
- name: FRAUD_DLQ_TOPIC
  value: {{ .Values.kafka.dlqTopic | quote }}
- name: FRAUD_GROUP_ID
  value: {{ .Values.kafka.groupId | quote }}
{{- if include "fraud-scorer.kafkaConfigSecret" . }}
- name: FRAUD_KAFKA_CONFIG_FILE
  value: {{ printf "%s/%s" (include "fraud-scorer.kafkaConfigDir" .) .Values.kafka.config.key | quote }}
{{- end }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The volumes of every pod of the chart: a writable /tmp, the Kafka properties Secret, and
extraVolumes. Arguments: dict "root" $ "kafkaSecret" NAME (the pods' Secret or the topics
Job's).
*/}}
{{- define "fraud-scorer.volumes" -}}
- name: tmp
  emptyDir: {}
{{- with .kafkaSecret }}
- name: kafka-config
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: {{ $.root.Values.kafka.config.key }}
        path: {{ $.root.Values.kafka.config.key }}
{{- end }}
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The mounts of every container of the chart (see fraud-scorer.volumes). */}}
{{- define "fraud-scorer.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "fraud-scorer.kafkaConfigSecret" . }}
- name: kafka-config
  mountPath: {{ include "fraud-scorer.kafkaConfigDir" . }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fraud-scorer.securityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
"true" when the scorer scales on lag through KEDA: autoscaling on and KEDA's API served.
Without KEDA, hpa.yaml renders the CPU fallback instead. helm template knows no cluster:
`--api-versions keda.sh/v1alpha1/ScaledObject` says KEDA is there.
*/}}
{{- define "fraud-scorer.keda" -}}
{{- if and .Values.autoscaling.enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject") -}}
true
{{- end -}}
{{- end -}}
