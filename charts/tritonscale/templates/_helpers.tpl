{{/* The chart name, cut to 63 characters (a DNS label). */}}
{{- define "tritonscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The fully qualified name: an override wins; a release name that already holds the chart name is used alone. */}}
{{- define "tritonscale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's object name: fullname-suffix, cut to 63 characters. Call with (list . "suffix"). */}}
{{- define "tritonscale.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "tritonscale.fullname" $root | trunc (sub 62 (len (index . 1)) | int)) (index . 1) | trimSuffix "-" -}}
{{- end -}}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "tritonscale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select this release's pods; reused by workloads, Services, monitors and autoscalers. */}}
{{- define "tritonscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tritonscale.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "tritonscale.labels" -}}
helm.sh/chart: {{ include "tritonscale.chart" . }}
{{ include "tritonscale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tritonscale
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component's objects. Call with (list . "triton"). */}}
{{- define "tritonscale.componentLabels" -}}
{{ include "tritonscale.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Selector labels of one component's pods. Call with (list . "triton"). */}}
{{- define "tritonscale.componentSelectorLabels" -}}
{{ include "tritonscale.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "tritonscale.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "tritonscale.componentName" (list . "operator")) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}: global.imageRegistry, when set, replaces every image's registry (as in Bitnami's charts); the digest wins over the tag; an empty tag is the chart's appVersion. Call with (dict "image" .Values.x.image "root" .). */}}
{{- define "tritonscale.image" -}}
{{- $image := .image -}}
{{- $registry := default $image.registry (dig "imageRegistry" "" (default dict .root.Values.global)) -}}
{{- $ref := $image.repository -}}
{{- if $registry -}}
{{- $ref = printf "%s/%s" $registry $image.repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (toString (default .root.Chart.AppVersion $image.tag)) -}}
{{- end -}}
{{- end -}}

{{/* The Secret that holds the repository key. */}}
{{- define "tritonscale.repositoryKeySecret" -}}
{{- default (include "tritonscale.componentName" (list . "repository-key")) .Values.repositoryKey.existingSecret -}}
{{- end -}}

{{/* The environment variable with the repository key, from the Secret. */}}
{{- define "tritonscale.repositoryKeyEnv" -}}
- name: TRITONSCALE_REPOSITORY_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tritonscale.repositoryKeySecret" . }}
      key: repository-key
{{- end -}}

{{/* A model name as a DNS label (underscores are not allowed in object names). */}}
{{- define "tritonscale.dnsName" -}}
{{- . | lower | replace "_" "-" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The models of models/ (files/models links to it): the folders of files/models that hold a config.pbtxt, sorted. */}}
{{- define "tritonscale.modelNames" -}}
{{- $names := list -}}
{{- range $path, $_ := .Files.Glob "files/models/*/config.pbtxt" -}}
{{- $names = append $names (index (splitList "/" $path) 2) -}}
{{- end -}}
{{- toJson (sortAlpha $names) -}}
{{- end -}}

{{/* The Triton Service's in-cluster address. */}}
{{- define "tritonscale.tritonHost" -}}
{{- printf "%s.%s.svc" (include "tritonscale.componentName" (list . "triton")) .Release.Namespace -}}
{{- end -}}

{{/* Namespaces the operator serves: the release namespace (its autoscalers live there) and any others named. */}}
{{- define "tritonscale.watchNamespaces" -}}
{{- toJson (concat (list .Release.Namespace) .Values.operator.watchNamespaces | uniq) -}}
{{- end -}}

{{/* The KopfPeering objects' name. */}}
{{- define "tritonscale.peeringName" -}}
{{- default (include "tritonscale.fullname" .) .Values.operator.peering.name -}}
{{- end -}}

{{/* operator.shards as a number; 1 where it is unset (values kept from a release before it). */}}
{{- define "tritonscale.operatorShards" -}}
{{- int (default 1 .Values.operator.shards) -}}
{{- end -}}

{{/* The operator's pods: one per shard with operator.shards above 1, else operator.replicaCount. */}}
{{- define "tritonscale.operatorReplicas" -}}
{{- $shards := int (include "tritonscale.operatorShards" .) -}}
{{- ternary $shards (int .Values.operator.replicaCount) (gt $shards 1) -}}
{{- end -}}

{{/* The shards' StatefulSet name: fullname-operator within 52 characters, since the controller
labels each pod controller-revision-hash=<name>-<hash of up to 10 characters>, a 63-character
label value at most. */}}
{{- define "tritonscale.operatorShardsName" -}}
{{- printf "%s-operator" (include "tritonscale.fullname" . | trunc 43 | trimSuffix "-") -}}
{{- end -}}

{{/* "true" when the operator gets a PodDisruptionBudget: several pods (a budget over one pod
either blocks every drain of its node or allows nothing a drain does not) and operator.pdb.enabled. */}}
{{- define "tritonscale.operatorPdbEnabled" -}}
{{- and .Values.operator.enabled .Values.operator.pdb.enabled (gt (int (include "tritonscale.operatorReplicas" .)) 1) | toString -}}
{{- end -}}

{{/* The operator pods' affinity: operator.affinity when set; otherwise, with several pods,
a pod anti-affinity by node (operator.podAntiAffinity), so that losing or draining one node
leaves a standby elsewhere to take over (peering), or stops one shard's share only (shards).
Empty when there is none. */}}
{{- define "tritonscale.operatorAffinity" -}}
{{- $operator := .Values.operator -}}
{{- if $operator.affinity -}}
{{- toYaml $operator.affinity -}}
{{- else if and $operator.podAntiAffinity (gt (int (include "tritonscale.operatorReplicas" .)) 1) -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "tritonscale.componentSelectorLabels" (list . "operator") | fromYaml)) -}}
podAntiAffinity:
{{- if eq $operator.podAntiAffinity "required" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list $term) | nindent 4 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list (dict "weight" 100 "podAffinityTerm" $term)) | nindent 4 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* "true" when the operator pods get the chart's required anti-affinity (operator.podAntiAffinity
required, no operator.affinity, several pods): its selector matches old and new pods alike, so
a rollout's extra pod needs a node with no operator pod, which a cluster with as many nodes as
replicas lacks. */}}
{{- define "tritonscale.operatorKeptApart" -}}
{{- $operator := .Values.operator -}}
{{- and (eq (toString $operator.podAntiAffinity) "required") (not $operator.affinity) (gt (int (include "tritonscale.operatorReplicas" .)) 1) | toString -}}
{{- end -}}

{{/* The peered operator Deployment's rollingUpdate as JSON {"maxSurge", "maxUnavailable"}, each a
number or a percentage: operator.rollingUpdate where set; otherwise maxSurge 1 and
maxUnavailable 0 (a new pod Ready before an old one goes), or, where the pods are kept apart
(tritonscale.operatorKeptApart), maxSurge 0 and maxUnavailable 1 (an old pod goes first and
its node takes the new one: with three replicas two stay up, one of them active). */}}
{{- define "tritonscale.operatorRollingUpdate" -}}
{{- $set := .Values.operator.rollingUpdate | default dict -}}
{{- $apart := eq (include "tritonscale.operatorKeptApart" .) "true" -}}
{{- $surge := ternary 0 1 $apart -}}
{{- $unavailable := ternary 1 0 $apart -}}
{{- $value := get $set "maxSurge" -}}
{{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") -}}
{{- $surge = $value -}}
{{- end -}}
{{- $value = get $set "maxUnavailable" -}}
{{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") -}}
{{- $unavailable = $value -}}
{{- end -}}
{{- toJson (dict "maxSurge" $surge "maxUnavailable" $unavailable) -}}
{{- end -}}

{{/* A rollingUpdate number or percentage as pods of `replicas`, rounded as the Deployment
controller rounds it (maxSurge up, maxUnavailable down). Call with (list value replicas roundUp). */}}
{{- define "tritonscale.rolloutPods" -}}
{{- $value := toString (index . 0) -}}
{{- $replicas := int (index . 1) -}}
{{- if hasSuffix "%" $value -}}
{{- $percent := int (trimSuffix "%" $value) -}}
{{- if index . 2 -}}
{{- div (add (mul $replicas $percent) 99) 100 -}}
{{- else -}}
{{- div (mul $replicas $percent) 100 -}}
{{- end -}}
{{- else -}}
{{- int $value -}}
{{- end -}}
{{- end -}}

{{/* A rollingUpdate value as YAML: a number bare, a percentage quoted. */}}
{{- define "tritonscale.intOrPercent" -}}
{{- if hasSuffix "%" (toString .) -}}
{{- toString . | quote -}}
{{- else -}}
{{- int . -}}
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget over one component's pods from its pdb values (minAvailable or
maxUnavailable, unhealthyPodEvictionPolicy). Call with (list . "component" $pdb). */}}
{{- define "tritonscale.podDisruptionBudget" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $pdb := index . 2 -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "tritonscale.componentName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "tritonscale.componentLabels" (list $root $component) | nindent 4 }}
spec:
  {{- if ne (toString $pdb.minAvailable) "" }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- end }}
  {{- with $pdb.unhealthyPodEvictionPolicy }}
  # A running pod that is not Ready must not block drains: with AlwaysAllow it may be evicted
  # whatever the budget (a Triton pod the readiness gate holds while the operator is down).
  unhealthyPodEvictionPolicy: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "tritonscale.componentSelectorLabels" (list $root $component) | nindent 6 }}
{{- end -}}

{{/* Every model's autoscaler spec: defaults overridden key by key, disabled entries left out. Returns JSON {model: spec}. */}}
{{- define "tritonscale.autoscalerSpecs" -}}
{{- $specs := dict -}}
{{- range $model, $override := .Values.autoscalers.models -}}
{{- $entry := default dict $override -}}
{{- if ne (toString (default "true" (toString (get $entry "enabled")))) "false" -}}
{{- $spec := mergeOverwrite (deepCopy $.Values.autoscalers.defaults) (omit (deepCopy $entry) "enabled") -}}
{{- $_ := set $specs $model $spec -}}
{{- end -}}
{{- end -}}
{{- toJson $specs -}}
{{- end -}}

{{/* Fail with every impossible combination of values at once. */}}
{{- define "tritonscale.validateValues" -}}
{{- $messages := list -}}
{{- $messages = append $messages (include "tritonscale.validateValues.gpu" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.modelRepository" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.readyModels" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.termination" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.grpcDrain" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.pdb" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.autoscalers" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.hpa" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.budget" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.operator" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.operatorRollout" .) -}}
{{- $messages = append $messages (include "tritonscale.validateValues.locust" .) -}}
{{- $messages = without $messages "" -}}
{{- if $messages -}}
{{- printf "\nVALUES VALIDATION:\n%s" (join "\n" $messages) | fail -}}
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.gpu" -}}
{{- if and .Values.triton.gpu.enabled (lt (int .Values.triton.gpu.count) 1) -}}
tritonscale: triton.gpu.count is {{ .Values.triton.gpu.count }} but GPU mode (triton.gpu.enabled=true) needs at least 1 GPU; set a count or triton.gpu.enabled=false for CPU-only.
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.modelRepository" -}}
{{- $repo := .Values.triton.modelRepository -}}
{{- if and (eq $repo.source "pvc") (not $repo.pvc.claimName) -}}
tritonscale: triton.modelRepository.source is "pvc" but triton.modelRepository.pvc.claimName is empty.
{{- else if and (eq $repo.source "image") (not $repo.image.repository) -}}
tritonscale: triton.modelRepository.source is "image" but triton.modelRepository.image.repository is empty.
{{- else if and (eq $repo.source "uri") (not (regexMatch "^(s3|gs|as)://." $repo.uri)) -}}
tritonscale: triton.modelRepository.source is "uri" but triton.modelRepository.uri ({{ $repo.uri | quote }}) does not start with s3://, gs:// or as://.
{{- else if and (eq $repo.source "configMap") (eq (len (fromJsonArray (include "tritonscale.modelNames" .))) 0) -}}
tritonscale: triton.modelRepository.source is "configMap" but the chart holds no models (files/models, a link to the repository's models/, is empty or missing).
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.readyModels" -}}
{{- if eq .Values.triton.modelRepository.source "configMap" -}}
{{- $known := fromJsonArray (include "tritonscale.modelNames" .) -}}
{{- $unknown := list -}}
{{- range .Values.triton.readyModels -}}
{{- if not (has . $known) -}}
{{- $unknown = append $unknown . -}}
{{- end -}}
{{- end -}}
{{- if and $known $unknown -}}
tritonscale: triton.readyModels names {{ join ", " $unknown }}, not in the chart's model repository ({{ join ", " $known }}).
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.termination" -}}
{{- $t := .Values.triton -}}
{{- $needed := add $t.preStopSleepSeconds $t.exitTimeoutSeconds -}}
{{- if le (int $t.terminationGracePeriodSeconds) (int $needed) -}}
tritonscale: triton.terminationGracePeriodSeconds ({{ $t.terminationGracePeriodSeconds }}) must exceed triton.preStopSleepSeconds + triton.exitTimeoutSeconds ({{ $t.preStopSleepSeconds }} + {{ $t.exitTimeoutSeconds }}), or the kubelet kills Triton before in-flight requests drain.
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.grpcDrain" -}}
{{- $t := .Values.triton -}}
{{- $age := int $t.grpcMaxConnectionAgeSeconds -}}
{{- if gt $age 0 -}}
{{- /* gRPC jitters the age by up to 10 %; one second more for the endpoint removal to spread. */ -}}
{{- $drained := add $age (div (add $age 9) 10) (int $t.grpcMaxConnectionAgeGraceSeconds) 1 -}}
{{- if lt (int $t.preStopSleepSeconds) (int $drained) -}}
tritonscale: triton.preStopSleepSeconds ({{ $t.preStopSleepSeconds }}) must be at least {{ $drained }} with triton.grpcMaxConnectionAgeSeconds {{ $age }} and triton.grpcMaxConnectionAgeGraceSeconds {{ $t.grpcMaxConnectionAgeGraceSeconds }}, or gRPC clients still hold connections to a stopping pod when Triton exits and lose the requests in flight on them.
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.pdb" -}}
{{- $lines := list (include "tritonscale.validateValues.onePdb" (list .Values.triton.pdb "triton.pdb")) -}}
{{- if eq (include "tritonscale.operatorPdbEnabled" .) "true" -}}
{{- $lines = append $lines (include "tritonscale.validateValues.onePdb" (list .Values.operator.pdb "operator.pdb")) -}}
{{- end -}}
{{- join "\n" (without $lines "") -}}
{{- end -}}

{{/* One PodDisruptionBudget's values: exactly one of its limits. Call with (list $pdb "path.to.pdb"). */}}
{{- define "tritonscale.validateValues.onePdb" -}}
{{- $pdb := index . 0 -}}
{{- $path := index . 1 -}}
{{- if and $pdb.enabled (ne (toString $pdb.minAvailable) "") (ne (toString $pdb.maxUnavailable) "") -}}
tritonscale: set only one of {{ $path }}.minAvailable ({{ $pdb.minAvailable }}) and {{ $path }}.maxUnavailable ({{ $pdb.maxUnavailable }}).
{{- else if and $pdb.enabled (eq (toString $pdb.minAvailable) "") (eq (toString $pdb.maxUnavailable) "") -}}
tritonscale: {{ $path }}.enabled is true but neither {{ $path }}.minAvailable nor {{ $path }}.maxUnavailable is set.
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.autoscalers" -}}
{{- if .Values.autoscalers.enabled -}}
{{- $lines := list -}}
{{- range $model, $spec := fromJson (include "tritonscale.autoscalerSpecs" .) -}}
{{- if gt (int $spec.minInstances) (int $spec.maxInstances) -}}
{{- $lines = append $lines (printf "tritonscale: autoscalers.models.%s: minInstances (%v) is above maxInstances (%v)." $model $spec.minInstances $spec.maxInstances) -}}
{{- end -}}
{{- end -}}
{{- /* A latency objective is the pipeline's, on its root: no CEL rule of one object can see its callers. */ -}}
{{- $specs := fromJson (include "tritonscale.autoscalerSpecs" .) -}}
{{- range $model, $spec := $specs -}}
{{- if and (kindIs "map" $spec.targets) (hasKey $spec.targets "latency") -}}
{{- range $caller, $other := $specs -}}
{{- if has $model (default list $other.calls) -}}
{{- $lines = append $lines (printf "tritonscale: autoscalers.models.%s.targets.latency: only a pipeline's root may carry a latency objective, and %s is called by %s." $model $model $caller) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.hpa" -}}
{{- $lines := list -}}
{{- if and .Values.hpa.enabled (gt (int .Values.hpa.minReplicas) (int .Values.hpa.maxReplicas)) -}}
{{- $lines = append $lines (printf "tritonscale: hpa.minReplicas (%v) is above hpa.maxReplicas (%v)." .Values.hpa.minReplicas .Values.hpa.maxReplicas) -}}
{{- end -}}
{{- if and .Values.hpa.enabled (not (and .Values.autoscalers.enabled .Values.operator.enabled (gt (int .Values.autoscalers.budget.instancesPerPod) 0))) -}}
{{- $lines = append $lines "tritonscale: hpa.enabled scales pods on the instance budget's demand ratio: it needs autoscalers.enabled, operator.enabled and autoscalers.budget.instancesPerPod > 0." -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{- define "tritonscale.validateValues.budget" -}}
{{- $budget := .Values.autoscalers.budget -}}
{{- if and .Values.autoscalers.enabled (gt (int $budget.instancesPerPod) 0) -}}
{{- $lines := list -}}
{{- $minimums := 0 -}}
{{- $memory := 0 -}}
{{- range $model, $spec := fromJson (include "tritonscale.autoscalerSpecs" .) -}}
{{- $minimums = add $minimums (int $spec.minInstances) -}}
{{- $memory = add $memory (mul (int $spec.minInstances) (int (get $budget.gpuMemoryPerInstanceMiB $model | default 0))) -}}
{{- end -}}
{{- if gt (int $minimums) (int $budget.instancesPerPod) -}}
{{- $lines = append $lines (printf "tritonscale: the autoscalers' minInstances add up to %v, above autoscalers.budget.instancesPerPod (%v)." $minimums $budget.instancesPerPod) -}}
{{- end -}}
{{- if and (gt (int $budget.gpuMemoryPerPodMiB) 0) (gt (int $memory) (int $budget.gpuMemoryPerPodMiB)) -}}
{{- $lines = append $lines (printf "tritonscale: the autoscalers' minInstances take %v MiB of GPU memory, above autoscalers.budget.gpuMemoryPerPodMiB (%v)." $memory $budget.gpuMemoryPerPodMiB) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
{{- end -}}

{{- define "tritonscale.validateValues.operator" -}}
{{- $operator := .Values.operator -}}
{{- $shards := int (include "tritonscale.operatorShards" .) -}}
{{- if not $operator.enabled -}}
{{- else if and (gt $shards 1) (gt (int $operator.replicaCount) 1) -}}
tritonscale: operator.shards is {{ $shards }} and operator.replicaCount is {{ $operator.replicaCount }}: shards (each pod acts on its share) and peered replicas (one pod acts, the others stand by) are not combined; set operator.replicaCount=1 with shards, or operator.shards=1 with peering.
{{- else if and (gt $shards 1) $operator.peering.enabled -}}
tritonscale: operator.shards is {{ $shards }} and operator.peering.enabled is true: each shard runs standalone, and peering would let only one of them act; set operator.peering.enabled=false with shards.
{{- else if and (gt (int $operator.replicaCount) 1) (not $operator.peering.enabled) -}}
tritonscale: operator.replicaCount is {{ $operator.replicaCount }} but operator.peering.enabled is false: several operators would act on the same models at once.
{{- end -}}
{{- end -}}

{{/* The peered operator's rollout: it must be able to finish, and keep an operator active. */}}
{{- define "tritonscale.validateValues.operatorRollout" -}}
{{- $operator := .Values.operator -}}
{{- if and $operator.enabled $operator.peering.enabled (eq (include "tritonscale.operatorShards" .) "1") -}}
{{- $rollout := fromJson (include "tritonscale.operatorRollingUpdate" .) -}}
{{- $replicas := int $operator.replicaCount -}}
{{- $surge := int (include "tritonscale.rolloutPods" (list $rollout.maxSurge $replicas true)) -}}
{{- $unavailable := int (include "tritonscale.rolloutPods" (list $rollout.maxUnavailable $replicas false)) -}}
{{- $lines := list -}}
{{- if and (eq (include "tritonscale.operatorKeptApart" .) "true") (gt $surge 0) -}}
{{- $lines = append $lines (printf "tritonscale: operator.podAntiAffinity is required but operator.rollingUpdate.maxSurge is %v: a surge pod needs a node without an operator pod, and with as many nodes as replicas there is none, so every upgrade would stall; set operator.rollingUpdate.maxSurge=0 (or leave both empty: maxSurge 0, maxUnavailable 1) or operator.podAntiAffinity=preferred." $rollout.maxSurge) -}}
{{- end -}}
{{- if and (eq $surge 0) (eq $unavailable 0) -}}
{{- $lines = append $lines (printf "tritonscale: operator.rollingUpdate.maxSurge (%v) and operator.rollingUpdate.maxUnavailable (%v) both come to 0 pods of %d: a rollout could replace none; let one of them be above 0." $rollout.maxSurge $rollout.maxUnavailable $replicas) -}}
{{- end -}}
{{- if and (gt $replicas 0) (ge $unavailable $replicas) -}}
{{- $lines = append $lines (printf "tritonscale: operator.rollingUpdate.maxUnavailable (%v) lets a rollout take down all %d operator pods; keep it below operator.replicaCount so that one stays active." $rollout.maxUnavailable $replicas) -}}
{{- else if eq (include "tritonscale.operatorPdbEnabled" .) "true" -}}
{{- /* The Deployment controller does not ask the budget; the two must agree by values. */ -}}
{{- $pdb := $operator.pdb -}}
{{- $allowed := -1 -}}
{{- if regexMatch "^[0-9]+$" (toString $pdb.minAvailable) -}}
{{- $allowed = sub $replicas (int $pdb.minAvailable) -}}
{{- else if and (eq (toString $pdb.minAvailable) "") (regexMatch "^[0-9]+$" (toString $pdb.maxUnavailable)) -}}
{{- $allowed = int $pdb.maxUnavailable -}}
{{- end -}}
{{- if and (ge (int $allowed) 0) (gt $unavailable (int $allowed)) -}}
{{- $lines = append $lines (printf "tritonscale: a rollout takes down %d of the %d operator pods at once (operator.rollingUpdate.maxUnavailable %v) but operator.pdb lets a drain take only %d: set operator.pdb.minAvailable to at most %d (or operator.pdb.maxUnavailable to at least %d)." $unavailable $replicas $rollout.maxUnavailable (int $allowed) (sub $replicas $unavailable) $unavailable) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
{{- end -}}

{{/* One model's files for its ConfigMap: JSON {key: {"path": path in the model folder, "content": text}}. Keys flatten "/" to "__" (ConfigMap keys allow no "/"); in GPU mode config.pbtxt's KIND_CPU becomes KIND_GPU, in CPU mode KIND_GPU becomes KIND_CPU. Call with (list . "model"). */}}
{{- define "tritonscale.modelFiles" -}}
{{- $root := index . 0 -}}
{{- $model := index . 1 -}}
{{- $prefix := printf "files/models/%s/" $model -}}
{{- $files := dict -}}
{{- range $path, $_ := $root.Files.Glob (printf "%s**" $prefix) -}}
{{- $rel := trimPrefix $prefix $path -}}
{{- $content := $root.Files.Get $path -}}
{{- if eq $rel "config.pbtxt" -}}
{{- if $root.Values.triton.gpu.enabled -}}
{{- $content = replace "KIND_CPU" "KIND_GPU" $content -}}
{{- else -}}
{{- $content = replace "KIND_GPU" "KIND_CPU" $content -}}
{{- end -}}
{{- end -}}
{{- $_ := set $files (replace "/" "__" $rel) (dict "path" $rel "content" $content) -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* Where the Locust containers may write, their root filesystem being read-only: HOME and
XDG_CACHE_HOME in the `home` emptyDir, TMPDIR (temporary files, reports named under /tmp) in
the `tmp` emptyDir. The image's environment is compiled already, so Python writes no byte code
(a PYTHONPYCACHEPREFIX would make it compile everything again into the emptyDir at each start). */}}
{{- define "tritonscale.locustWritableEnv" -}}
- name: HOME
  value: /home/locust
- name: XDG_CACHE_HOME
  value: /home/locust/.cache
- name: TMPDIR
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end -}}

{{/* The mounts of tritonscale.locustWritableEnv's folders. */}}
{{- define "tritonscale.locustWritableMounts" -}}
- name: home
  mountPath: /home/locust
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "tritonscale.validateValues.locust" -}}
{{- $locust := .Values.locust -}}
{{- if $locust.enabled -}}
{{- $lines := list -}}
{{- if not (.Files.Get (printf "files/loadtests/%s" $locust.locustfile)) -}}
{{- $lines = append $lines (printf "tritonscale: locust.enabled is true but the chart holds no loadtests/%s (files/loadtests links to loadtests/)." $locust.locustfile) -}}
{{- end -}}
{{- if and $locust.headless (eq (toString $locust.runTime) "") -}}
{{- $lines = append $lines "tritonscale: locust.headless is true but locust.runTime is empty: a headless run is a Job that must end; set locust.runTime (e.g. 10m)." -}}
{{- else if and $locust.headless (eq (include "tritonscale.isSet" $locust.activeDeadlineSeconds) "true") -}}
{{- $runSeconds := int (include "tritonscale.locustRunSeconds" .) -}}
{{- if le (int $locust.activeDeadlineSeconds) $runSeconds -}}
{{- $lines = append $lines (printf "tritonscale: locust.activeDeadlineSeconds (%v) is not above locust.runTime (%s, %d s): Kubernetes would stop every run before its end." $locust.activeDeadlineSeconds $locust.runTime $runSeconds) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
{{- end -}}

{{/* Triton's APIs locked behind the repository key: loading code, and the ones that change
the server's state (shared-memory regions, log and trace settings). Inference, health,
metadata, model config and statistics stay open. */}}
{{- define "tritonscale.restrictedApis" -}}
model-repository,shared-memory,logging,trace
{{- end -}}
