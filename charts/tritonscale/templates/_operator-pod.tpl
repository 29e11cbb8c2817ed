{{/* The operator's pod template, shared by its Deployment (one replica, or several with
peering) and its StatefulSet (operator.shards above 1: each pod one shard). */}}
{{- define "tritonscale.operatorPodTemplate" -}}
{{- $operator := .Values.operator -}}
{{- $shards := int (include "tritonscale.operatorShards" .) -}}
{{- $sharded := gt $shards 1 -}}
metadata:
  labels:
    {{- include "tritonscale.componentLabels" (list . "operator") | nindent 4 }}
    {{- with $operator.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $operator.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "tritonscale.serviceAccountName" . }}
  automountServiceAccountToken: true
  enableServiceLinks: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $operator.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $operator.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $operator.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $operator.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with include "tritonscale.operatorAffinity" . }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: operator
      image: {{ include "tritonscale.image" (dict "image" $operator.image "root" .) }}
      imagePullPolicy: {{ $operator.image.pullPolicy }}
      command: ["tritonscale", "operator"]
      {{- if $sharded }}
      # The shard options are flags, not TRITONSCALE_OPERATOR_* variables like the others: an
      # image without sharding refuses an unknown flag but ignores an unknown variable, and each
      # of its pods would then act on every set.
      args:
        - --total-shards={{ $shards }}
        - --shard=$(POD_NAME)
        {{- with $operator.args }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- else if $operator.args }}
      args:
        {{- toYaml $operator.args | nindent 8 }}
      {{- end }}
      env:
        {{- include "tritonscale.repositoryKeyEnv" . | nindent 8 }}
        # kopf names this pod in peering and logs by POD_ID.
        - name: POD_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if $sharded }}
        # The StatefulSet pod's name, <name>-<ordinal>: --shard takes its ordinal from it.
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        # Options of `tritonscale operator` by click's auto_envvar_prefix (TRITONSCALE_OPERATOR_*);
        # a multiple option splits its variable on spaces.
        - name: TRITONSCALE_OPERATOR_NAMESPACES
          value: {{ join " " (fromJsonArray (include "tritonscale.watchNamespaces" .)) | quote }}
        - name: TRITONSCALE_OPERATOR_LIVENESS
          value: "http://0.0.0.0:8080/healthz"
        {{- if $operator.readinessProbe.enabled }}
        - name: TRITONSCALE_OPERATOR_READINESS
          value: "http://0.0.0.0:8081/readyz"
        {{- end }}
        - name: TRITONSCALE_OPERATOR_METRICS_PORT
          value: "9102"
        {{- if $operator.peering.enabled }}
        - name: TRITONSCALE_OPERATOR_PEERING
          value: {{ include "tritonscale.peeringName" . | quote }}
        - name: TRITONSCALE_OPERATOR_PEERING_LIFETIME
          value: {{ $operator.peering.lifetimeSeconds | quote }}
        {{- end }}
        {{- with $operator.prometheusUrl }}
        - name: TRITONSCALE_OPERATOR_PROMETHEUS_URL
          value: {{ . | quote }}
        {{- end }}
        {{- with $operator.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: healthz
          containerPort: 8080
          protocol: TCP
        {{- if $operator.readinessProbe.enabled }}
        - name: readyz
          containerPort: 8081
          protocol: TCP
        {{- end }}
        - name: metrics
          containerPort: 9102
          protocol: TCP
      {{- if $operator.readinessProbe.enabled }}
      # Ready once it has listed what it watches, or as a standby that sees a live active peer
      # (tritonscale.drivers.readiness): a rollout waits on it, and stops at a new pod that
      # never gets there.
      readinessProbe:
        httpGet:
          path: /readyz
          port: readyz
        periodSeconds: {{ $operator.readinessProbe.periodSeconds }}
        failureThreshold: {{ $operator.readinessProbe.failureThreshold }}
        timeoutSeconds: {{ $operator.readinessProbe.timeoutSeconds }}
      {{- end }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: healthz
        periodSeconds: {{ $operator.livenessProbe.periodSeconds }}
        failureThreshold: {{ $operator.livenessProbe.failureThreshold }}
        timeoutSeconds: {{ $operator.livenessProbe.timeoutSeconds }}
      {{- with $operator.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $operator.containerSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        # The root filesystem is read-only; Python and kopf may still want a /tmp.
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
{{- end -}}
