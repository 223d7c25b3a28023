{{/*
Names. Kubernetes names are DNS labels: at most 63 characters, no trailing "-".
*/}}
{{- define "dispatcher.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Release "dispatcher" of chart "dispatcher" is just "dispatcher", not
"dispatcher-dispatcher", so the plain manifests in deploy/kubernetes can use
the same names as a default install.
*/}}
{{- define "dispatcher.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dispatcher.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: immutable on a Deployment, so only name and instance, never
the version.
*/}}
{{- define "dispatcher.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dispatcher.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dispatcher.labels" -}}
helm.sh/chart: {{ include "dispatcher.chart" . }}
{{ include "dispatcher.selectorLabels" . }}
app.kubernetes.io/version: {{ include "dispatcher.imageTag" . | quote }}
app.kubernetes.io/component: dispatcher
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dispatcher.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dispatcher.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dispatcher.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "dispatcher.configMapName" -}}
{{- printf "%s-config" (include "dispatcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Duration -> seconds (a float, as a string), for the Go-style durations the
service accepts: "25s", "1m", "1m30s", "250ms", or a bare number of seconds.
The service also takes ISO-8601 ("PT25S"); the chart refuses it rather than
guess, because terminationGracePeriodSeconds is derived from it.
Call with (dict "value" $v "key" "config.shutdown.grace").
*/}}
{{- define "dispatcher.durationSeconds" -}}
{{- $text := trim (toString .value) }}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?$" $text }}
{{- $text }}
{{- else if regexMatch "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$" $text }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" $text -1 }}
{{- $number := regexFind "^[0-9.]+" . | float64 }}
{{- $unit := regexFind "(ms|s|m|h)$" . }}
{{- $total = addf $total (mulf $number (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- else }}
{{- fail (printf "%s: %q is not a duration this chart understands (use e.g. 25s, 1m, 1m30s or a number of seconds)" .key $text) }}
{{- end }}
{{- end }}

{{/* shutdown.grace in whole seconds, rounded up; the service's default is 25s. */}}
{{- define "dispatcher.graceSeconds" -}}
{{- $shutdown := .Values.config.shutdown | default dict }}
{{- $grace := hasKey $shutdown "grace" | ternary $shutdown.grace "25s" }}
{{- include "dispatcher.durationSeconds" (dict "value" $grace "key" "config.shutdown.grace") | float64 | ceil | int }}
{{- end }}

{{/*
The kubelet sends SIGKILL at terminationGracePeriodSeconds. The service stops
within grace plus about 6 s (closing channels, flushing logs), so 10 s on top
of the grace leaves headroom and in-flight work is never cut short.
*/}}
{{- define "dispatcher.terminationGracePeriodSeconds" -}}
{{- add (include "dispatcher.graceSeconds" . | int) 10 }}
{{- end }}

{{/*
The listener port comes from config.http.listen, so the container port, the
probes, the Service and the scrape annotations can never disagree with the
port the service actually opens.
*/}}
{{- define "dispatcher.listen" -}}
{{- $http := .Values.config.http | default dict }}
{{- toString ($http.listen | default "0.0.0.0:9090") }}
{{- end }}

{{- define "dispatcher.httpPort" -}}
{{- $listen := include "dispatcher.listen" . }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if or (not (regexMatch ":[0-9]+$" $listen)) (eq ($port | int) 0) }}
{{- fail (printf "config.http.listen: %q must be host:port with a fixed port (the probes and Service need it)" $listen) }}
{{- end }}
{{- if regexMatch "^(127\\.|localhost:|\\[::1\\]:)" $listen }}
{{- fail (printf "config.http.listen: %q listens on loopback only; the kubelet's probes and Prometheus could not reach it (use 0.0.0.0:PORT)" $listen) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
The service's config file. broker.url is refused: it holds the password and
must come from brokerSecret (RABBITMQ_URL). So is a dedupe.store URL (null,
the service's default, is harmless): it may hold a password and must come
from dedupeStoreSecret (DEDUPE_STORE_URL). In sidecar mode, bindings without
a subscriber deliver to the subscriber container over loopback.
*/}}
{{- define "dispatcher.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if hasKey ($config.broker | default dict) "url" }}
{{- fail "config.broker.url must not be set: the broker URL carries the password, so it comes only from the Secret named by brokerSecret (as RABBITMQ_URL). Remove config.broker.url and put the URL in that Secret." }}
{{- end }}
{{- $dedupe := $config.dedupe | default dict }}
{{- if and (hasKey $dedupe "store") (not (kindIs "invalid" $dedupe.store)) }}
{{- fail "config.dedupe.store must not be set: the store's URL may carry a password, so it comes only from the Secret named by dedupeStoreSecret (as DEDUPE_STORE_URL). Remove config.dedupe.store and put the URL in that Secret." }}
{{- end }}
{{- if eq .Values.mode "sidecar" }}
{{- $local := printf "http://127.0.0.1:%v%s" .Values.sidecar.subscriber.port .Values.sidecar.subscriber.path }}
{{- range $config.bindings }}
{{- if not .subscriber }}
{{- $_ := set . "subscriber" $local }}
{{- end }}
{{- end }}
{{- end }}
{{- /* In the file's own order (as in config/dispatcher.example.yaml), not
       toYaml's alphabetical one, so the ConfigMap reads like the docs. */}}
{{- $sections := list "broker" "http" "shutdown" "logging" "dedupe" "bindings" }}
{{- range $sections }}
{{- if hasKey $config . }}
{{ dict . (get $config .) | toYaml }}
{{- end }}
{{- end }}
{{- with omit $config "broker" "http" "shutdown" "logging" "dedupe" "bindings" }}
{{ toYaml . }}
{{- end }}
{{- end }}
