{{/* One Locust workload: the master or the workers. With the web UI, Deployments. Headless, Jobs:
a headless master runs once and exits, so that it is not restarted into a second run; its
workers too, since the master tells them to quit at its end and a Deployment would restart them
into a master that is gone. A headless run's Jobs carry its id (`run`, a hash of both Jobs as
rendered with an empty id: see locust.yaml) in their names and pod labels, and are plain
release objects, not hooks: Helm waits for a hook Job to finish, so a 10-minute run would hold
`helm install` and `helm upgrade` for 10 minutes (and fail them at Helm's default 5-minute
timeout), where a release object lets them return as soon as it is created. Every wait of a
run is bounded: the master's wait for Triton (locust.waitForTritonSeconds), its wait for the
workers (locust.expectWorkersSeconds) and both Jobs as a whole (activeDeadlineSeconds).
Call with (dict "root" . "role" "master"|"worker" "run" id). */}}
{{- define "tritonscale.locustWorkload" -}}
{{- $ := .root -}}
{{- $role := .role -}}
{{- $run := .run -}}
{{- $locust := $.Values.locust -}}
{{- $job := $locust.headless -}}
{{- $image := include "tritonscale.image" (dict "image" $locust.image "root" $) -}}
{{- $host := default (printf "http://%s:%v" (include "tritonscale.tritonHost" $) $.Values.triton.service.httpPort) $locust.host -}}
{{- $name := printf "locust-%s" $role -}}
{{- if $run -}}
{{- $name = printf "locust-%s-%s" $role $run -}}
{{- end -}}
apiVersion: {{ ternary "batch/v1" "apps/v1" $job }}
kind: {{ ternary "Job" "Deployment" $job }}
metadata:
  name: {{ include "tritonscale.componentName" (list $ $name) }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "tritonscale.componentLabels" (list $ "locust") | nindent 4 }}
    tritonscale.io/locust-role: {{ $role }}
    {{- with $run }}
    tritonscale.io/locust-run: {{ . | quote }}
    {{- end }}
spec:
  {{- if $job }}
  # The whole run, waits included, ends by then: Kubernetes stops what still runs and marks
  # the Job Failed with reason DeadlineExceeded.
  activeDeadlineSeconds: {{ include "tritonscale.locustDeadlineSeconds" $ }}
  {{- if eq (include "tritonscale.isSet" $locust.ttlSecondsAfterFinished) "true" }}
  ttlSecondsAfterFinished: {{ int $locust.ttlSecondsAfterFinished }}
  {{- end }}
  {{- end }}
  {{- if and $job (eq $role "master") }}
  backoffLimit: 0
  {{- else if $job }}
  # Every worker runs until the master's quit; one that lost its master is retried.
  parallelism: {{ $locust.workers }}
  completions: {{ $locust.workers }}
  backoffLimit: {{ mul 3 $locust.workers }}
  {{- else }}
  replicas: {{ ternary 1 $locust.workers (eq $role "master") }}
  selector:
    matchLabels:
      {{- include "tritonscale.componentSelectorLabels" (list $ "locust") | nindent 6 }}
      tritonscale.io/locust-role: {{ $role }}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "tritonscale.componentLabels" (list $ "locust") | nindent 8 }}
        tritonscale.io/locust-role: {{ $role }}
        {{- with $run }}
        tritonscale.io/locust-run: {{ . | quote }}
        {{- end }}
      annotations:
        checksum/locustfiles: {{ ($.Files.Glob "files/loadtests/*.py").AsConfig | sha256sum }}
    spec:
      {{- if $job }}
      restartPolicy: {{ ternary "Never" "OnFailure" (eq $role "master") }}
      {{- end }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      {{- with $locust.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if eq $role "master" }}
      initContainers:
        # bls.py stops at once (exit 2) when Triton is not ready, and a headless master is a
        # Job that runs once: installed together, it would end before Triton has loaded. The
        # wait is bounded: at locust.waitForTritonSeconds it fails the run with one line that
        # names the URL and what was not ready (the pod's termination message too).
        - name: wait-for-triton
          image: {{ $image }}
          imagePullPolicy: {{ $locust.image.pullPolicy }}
          command:
            - python3
            - /opt/tritonscale/scripts/triton_ready.py
            - --url={{ $host }}
            - --wait={{ include "tritonscale.locustWaitSeconds" (list $locust "waitForTritonSeconds") }}
            {{- range $.Values.triton.readyModels }}
            - {{ . | quote }}
            {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          {{- with $locust.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          env:
            {{- include "tritonscale.locustWritableEnv" $ | nindent 12 }}
          {{- with $locust.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            {{- include "tritonscale.locustWritableMounts" $ | nindent 12 }}
            - name: scripts
              mountPath: /opt/tritonscale/scripts
              readOnly: true
      {{- end }}
      containers:
        - name: locust
          image: {{ $image }}
          imagePullPolicy: {{ $locust.image.pullPolicy }}
          command: ["locust"]
          args:
            - --locustfile=/mnt/locust/{{ $locust.locustfile }}
            {{- if eq $role "master" }}
            - --master
            - --host={{ $host }}
            - --web-port={{ $locust.webPort }}
            {{- if $locust.headless }}
            - --headless
            - --users={{ $locust.users }}
            - --spawn-rate={{ $locust.spawnRate }}
            - --expect-workers={{ $locust.workers }}
            # Without it the master waits for its workers forever.
            - --expect-workers-max-wait={{ include "tritonscale.locustWaitSeconds" (list $locust "expectWorkersSeconds") }}
            {{- with $locust.runTime }}
            - --run-time={{ . }}
            {{- end }}
            {{- end }}
            {{- with $locust.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- else }}
            - --worker
            - --master-host={{ include "tritonscale.componentName" (list $ "locust") }}
            {{- end }}
          # A failed run's last lines (Locust's reason) become the pod's termination message.
          terminationMessagePolicy: FallbackToLogsOnError
          env:
            {{- include "tritonscale.locustWritableEnv" $ | nindent 12 }}
            {{- with $locust.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if eq $role "master" }}
          ports:
            - name: web
              containerPort: {{ $locust.webPort }}
              protocol: TCP
            - name: master
              containerPort: 5557
              protocol: TCP
          {{- end }}
          {{- with $locust.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $locust.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            {{- include "tritonscale.locustWritableMounts" $ | nindent 12 }}
            - name: locustfiles
              mountPath: /mnt/locust
              readOnly: true
      volumes:
        # The root filesystem is read-only (locust.securityContext): these are what Locust,
        # Python and the init container's tools may write to.
        - name: home
          emptyDir:
            sizeLimit: 64Mi
        - name: tmp
          emptyDir:
            sizeLimit: {{ $locust.tmp.sizeLimit }}
        - name: locustfiles
          configMap:
            name: {{ include "tritonscale.componentName" (list $ "locustfiles") }}
        {{- if eq $role "master" }}
        - name: scripts
          configMap:
            name: {{ include "tritonscale.componentName" (list $ "scripts") }}
        {{- end }}
{{- end -}}

{{/* locust.runTime (`1h30m`, `10m`, `40s`) in seconds; 0 when empty. */}}
{{- define "tritonscale.locustRunSeconds" -}}
{{- $units := dict "s" 1 "m" 60 "h" 3600 -}}
{{- $seconds := 0 -}}
{{- range regexFindAll "[0-9]+[smh]" (toString .Values.locust.runTime) -1 -}}
{{- $seconds = add $seconds (mul (int (regexFind "[0-9]+" .)) (get $units (regexFind "[smh]$" .))) -}}
{{- end -}}
{{- $seconds -}}
{{- end -}}

{{/* A headless run's activeDeadlineSeconds: locust.activeDeadlineSeconds where set; otherwise
its longest waits, its run time and two minutes for Locust to stop and report. */}}
{{- define "tritonscale.locustDeadlineSeconds" -}}
{{- $locust := .Values.locust -}}
{{- if eq (include "tritonscale.isSet" $locust.activeDeadlineSeconds) "true" -}}
{{- int $locust.activeDeadlineSeconds -}}
{{- else -}}
{{- $triton := int (include "tritonscale.locustWaitSeconds" (list $locust "waitForTritonSeconds")) -}}
{{- $workers := int (include "tritonscale.locustWaitSeconds" (list $locust "expectWorkersSeconds")) -}}
{{- add $triton $workers (int (include "tritonscale.locustRunSeconds" .)) 120 -}}
{{- end -}}
{{- end -}}

{{/* One of a headless run's waits in seconds: its value, or the chart's default where a release
upgraded with --reuse-values from a chart before it has none (Helm then keeps the old chart's
defaults), so that no wait becomes 0, which Locust reads as forever. Call with
(list .Values.locust "waitForTritonSeconds"|"expectWorkersSeconds"). */}}
{{- define "tritonscale.locustWaitSeconds" -}}
{{- $value := get (index . 0) (index . 1) -}}
{{- $defaults := dict "waitForTritonSeconds" 600 "expectWorkersSeconds" 300 -}}
{{- if eq (include "tritonscale.isSet" $value) "true" -}}
{{- int $value -}}
{{- else -}}
{{- get $defaults (index . 1) -}}
{{- end -}}
{{- end -}}

{{/* "true" when a value is set: neither missing (null) nor empty. */}}
{{- define "tritonscale.isSet" -}}
{{- and (not (kindIs "invalid" .)) (ne (toString .) "") | toString -}}
{{- end -}}
