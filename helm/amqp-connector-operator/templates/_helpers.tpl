{{/* The operator's name: the release name, trimmed for labels and DNS. */}}
{{- define "aco.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object of the chart carries. */}}
{{- define "aco.labels" -}}
app.kubernetes.io/name: amqp-connector-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: kubemq
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pod selector: name and instance only (a selector is immutable). */}}
{{- define "aco.selector" -}}
app.kubernetes.io/name: amqp-connector-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "aco.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "aco.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What the operator may do with AmqpConnectors and their children (no Secrets, ever). */}}
{{- define "aco.rules" -}}
{{- /* Exactly what the operator asks for (the real-cluster test compares the API server's audit
log with these): it watches AmqpConnectors and its children, reads the Deployment that still
runs while a spec cannot be applied (to report its pods), server-side-applies the children
and its status (create is needed for an apply that creates), deletes only the metrics Service,
the PDB and the ServiceMonitor (ConfigMap and Deployment go with their owner, by the garbage
collector), and sets blockOwnerDeletion (which needs update on the finalizers). ServiceMonitors,
only with connectorServiceMonitors.enabled, are not watched: their CRD may be missing, and the
periodic resync restores a changed one. */}}
- apiGroups: ["amqp.kubemq.io"]
  resources: ["amqpconnectors"]
  verbs: ["list", "watch"]
- apiGroups: ["amqp.kubemq.io"]
  resources: ["amqpconnectors/status"]
  verbs: ["patch"]
- apiGroups: ["amqp.kubemq.io"]
  resources: ["amqpconnectors/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.connectorServiceMonitors.enabled }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
