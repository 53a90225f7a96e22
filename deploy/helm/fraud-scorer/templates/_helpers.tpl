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

{{- define "fraud-scorer.labels" -}}
{{ include "fraud-scorer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fraud-scorer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the librdkafka properties file, if any. */}}
{{- define "fraud-scorer.kafkaConfigSecret" -}}
{{- if .Values.kafka.config.existingSecret -}}
{{- .Values.kafka.config.existingSecret -}}
{{- else if .Values.kafka.config.properties -}}
{{- printf "%s-kafka" (include "fraud-scorer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "fraud-scorer.kafkaConfigDir" -}}/etc/fraud-scorer/kafka{{- end -}}

{{/*
The environment of every container of our image: where Kafka is, the topics and the group
(the ScaledObject reads the same values), then the free-form `env` values. Settings the chart
derives from other values cannot be overridden through `env`.
*/}}
{{- define "fraud-scorer.env" -}}
{{- $reserved := list "KAFKA_BOOTSTRAP_SERVERS" "FRAUD_INPUT_TOPIC" "FRAUD_OUTPUT_TOPIC" "FRAUD_DLQ_TOPIC" "FRAUD_GROUP_ID" "FRAUD_METRICS_PORT" "FRAUD_SHUTDOWN_TIMEOUT_S" "FRAUD_KAFKA_CONFIG_FILE" "FRAUD_INSTANCE_ID" -}}
{{- range $name, $value := .Values.env }}
{{- if has $name $reserved }}
{{- fail (printf "env.%s is set by the chart from other values (kafka.*, metrics.port, shutdownTimeoutSeconds)" $name) }}
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
{{- end -}}

{{- define "fraud-scorer.kafkaConfigVolume" -}}
{{- if include "fraud-scorer.kafkaConfigSecret" . }}
- name: kafka-config
  secret:
    secretName: {{ include "fraud-scorer.kafkaConfigSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.kafka.config.key }}
        path: {{ .Values.kafka.config.key }}
{{- end }}
{{- end -}}

{{- define "fraud-scorer.kafkaConfigMount" -}}
{{- if include "fraud-scorer.kafkaConfigSecret" . }}
- name: kafka-config
  mountPath: {{ include "fraud-scorer.kafkaConfigDir" . }}
  readOnly: true
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
