{{/* The one image both containers run. */}}
{{- define "macvtap.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The kubelet dir without a trailing slash. */}}
{{- define "macvtap.kubeletDir" -}}
{{ trimSuffix "/" .Values.kubeletDir }}
{{- end -}}

{{/* The namespace of every namespaced object: namespace.name, or the
release's when that is empty. */}}
{{- define "macvtap.namespace" -}}
{{ .Values.namespace.name | default .Release.Namespace }}
{{- end -}}

{{/* The DeviceClass of resource NAME (given as the context): macvtap-NAME
when that is an object name (a DNS subdomain), else NAME lower-cased with
every other character as -, and 8 hex digits of NAME's sha256, so that two
names spelled alike (eth_1, eth-1, ETH-1) get two classes. */}}
{{- define "macvtap.deviceClassName" -}}
{{- $plain := printf "macvtap-%s" . -}}
{{- if regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $plain -}}
{{ $plain }}
{{- else -}}
macvtap-{{ regexReplaceAll "[^a-z0-9-]" (lower .) "-" }}-{{ sha256sum . | trunc 8 }}
{{- end -}}
{{- end -}}

{{/* The daemon's --metrics-addr: ADDRESS:PORT, an IPv6 address in
brackets, as the daemon parses a socket address; off when disabled. */}}
{{- define "macvtap.metricsAddr" -}}
{{- if .Values.metrics.enabled -}}
{{- $a := .Values.metrics.bindAddress -}}
{{- if contains ":" $a -}}
[{{ $a }}]:{{ .Values.metrics.port }}
{{- else -}}
{{ $a }}:{{ .Values.metrics.port }}
{{- end -}}
{{- else -}}
off
{{- end -}}
{{- end -}}

{{/* The daemon's (and the helm test doctor's) discovery settings, as
environment variables so that `kubectl exec ... doctor` sees them too:
MACVTAP_DISCOVERY from discovery.policy, MACVTAP_DISCOVER_INCLUDE from
discovery.include when it names a NIC. */}}
{{- define "macvtap.discoveryEnv" -}}
# Which NICs auto-discovery offers (see the base).
- name: MACVTAP_DISCOVERY
  value: {{ .Values.discovery.policy }}
{{- with .Values.discovery.include }}
- name: MACVTAP_DISCOVER_INCLUDE
  value: {{ join "," . | quote }}
{{- end }}
{{- end -}}

{{/* What values.schema.json cannot say: each refusal names the value and
what to write instead. Included by daemonset.yaml, so every rendering
runs it. */}}
{{- define "macvtap.checks" -}}
{{- with .Values.config }}
{{- if hasKey . "resources" }}
{{- fail "config.resources was renamed macvtapResources (so that it is not confused with daemon.resources, the pod's CPU and memory): set macvtapResources to the same list" }}
{{- end }}
{{- end }}
{{- with .Values.placement }}
{{- range $k, $_ := . }}
{{- fail (printf "placement.%s moved to the top level: set %s instead (nodeSelector, affinity, tolerations and priorityClassName, as most charts name them)" $k $k) }}
{{- end }}
{{- end }}
{{- $ns := include "macvtap.namespace" . }}
{{- if .Values.namespace.create }}
{{- if has $ns (list "default" "kube-system" "kube-public" "kube-node-lease") }}
{{- fail (printf "namespace.create makes the Namespace %s, which every cluster has: the chart never takes over a namespace it did not make (helm uninstall would delete it with all it holds); set namespace.name to a namespace of its own" $ns) }}
{{- end }}
{{- if eq $ns .Release.Namespace }}
{{- fail (printf "namespace.create makes the Namespace %s, but the release lives there, so it exists already or Helm makes it (--create-namespace): set namespace.create=false, or namespace.name to another namespace for our objects" $ns) }}
{{- end }}
{{- with lookup "v1" "Namespace" "" $ns }}
{{- $a := .metadata.annotations | default dict }}
{{- if not (and (eq (index $a "meta.helm.sh/release-name" | default "") $.Release.Name) (eq (index $a "meta.helm.sh/release-namespace" | default "") $.Release.Namespace)) }}
{{- fail (printf "namespace.create makes the Namespace %s, but it exists and is not this release's: the chart never takes over a namespace it did not make (helm uninstall would delete it with all it holds); set namespace.create=false to install into it" $ns) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* A namespace change on upgrade: Helm cannot move a release's
objects; it would make them anew in the new namespace and delete the old
ones: the DaemonSet, which its daemons take for an uninstall (they clean
their nodes as they exit, under the running VMs), or the Namespace the
release made, with all it holds. So this release's DaemonSet found in
another namespace, or its Namespace no longer asked for, is refused. The
lookups find nothing without a cluster (helm template, lint). */}}
{{- range (lookup "apps/v1" "DaemonSet" "" "").items }}
{{- $a := .metadata.annotations | default dict }}
{{- if and (eq .metadata.name "macvtap-cni") (ne .metadata.namespace $ns) (eq (index $a "meta.helm.sh/release-name" | default "") $.Release.Name) (eq (index $a "meta.helm.sh/release-namespace" | default "") $.Release.Namespace) }}
{{- fail (printf "namespace.name: this release's DaemonSet macvtap-cni runs in namespace %s, and these values move it to %s: Helm cannot move a release's objects, it would delete the old DaemonSet, which the daemons take for an uninstall (they clean their nodes under the running VMs); set namespace.name=%s (and namespace.create as before), or, to move it, helm uninstall and install again (README.md, \"Between our versions\")" .metadata.namespace $ns .metadata.namespace) }}
{{- end }}
{{- end }}
{{- if not .Values.namespace.create }}
{{- with lookup "v1" "Namespace" "" $ns }}
{{- $a := .metadata.annotations | default dict }}
{{- if and (eq (index $a "meta.helm.sh/release-name" | default "") $.Release.Name) (eq (index $a "meta.helm.sh/release-namespace" | default "") $.Release.Namespace) }}
{{- fail (printf "namespace.create: this release made the Namespace %s (namespace.create=true), and these values drop it: the upgrade would delete it with the DaemonSet and all it holds; set namespace.create=true (README.md, \"Between our versions\")" $ns) }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
{{- $arg := . }}
{{- range $flag, $value := dict "--kubelet-dir" "kubeletDir" "--metrics-addr" "metrics.enabled, metrics.bindAddress and metrics.port" "--log-format" "none: the chart logs JSON" "--config" "macvtapResources, or your own ConfigMap macvtap-deviceplugin-config" "--owner-daemonset" "none: the DaemonSet's own name" "--uninstall-cni-dir" "cniBinDir" "--front" "front, which also mounts and grants what the front needs" "--cdi-dir" "none: the chart mounts the runtime's /var/run/cdi" "--discovery" "discovery.policy" "--discover-include" "discovery.include" }}
{{- if or (eq $arg $flag) (hasPrefix (printf "%s=" $flag) $arg) }}
{{- fail (printf "extraArgs: %s is set by the chart (value: %s); leave it out of extraArgs" $flag $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- $dra := eq .Values.front "dra" }}
{{- if and $dra (semverCompare "<1.37.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "front=dra needs Kubernetes 1.37 or newer (a DeviceClass's extendedResourceName, KEP-5004, is what lets pods request the resources by name), and the cluster is %s: keep front=device-plugin" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- /* A resource's name is a device attribute's value in DRA mode, which
the API holds to 64 characters (macvtap-link's dra_name_problem). */}}
{{- $prefix := "macvtap.network.kubevirt.io/" }}
{{- $longest := sub 64 (len $prefix) }}
{{- $names := dict }}
{{- $nics := dict }}
{{- range $i, $r := .Values.macvtapResources }}
{{- if and $dra (gt (len $r.name) (int $longest)) }}
{{- fail (printf "macvtapResources: entry %d, %s%s, is %d characters, and with front=dra it is a DRA device attribute's value, which holds at most 64: give the resource a name of at most %d characters to serve it through DRA" $i $prefix $r.name (len (printf "%s%s" $prefix $r.name)) $longest) }}
{{- end }}
{{- if hasKey $names $r.name }}
{{- fail (printf "macvtapResources: entries %v and %d are both named %s; the daemon refuses the whole list" (get $names $r.name) $i $r.name) }}
{{- end }}
{{- $_ := set $names $r.name $i }}
{{- /* An entry with a NIC or node selector: each node checks it against
the others on the NIC it picks (the daemon's core/nic/select.rs). */}}
{{- if not (or $r.nicSelector $r.nodeSelector) }}
{{- $nic := $r.lowerDevice | default $r.name }}
{{- $passthru := eq ($r.mode | default "bridge") "passthru" }}
{{- if hasKey $nics $nic }}
{{- $earlier := get $nics $nic }}
{{- if or $passthru $earlier.passthru }}
{{- fail (printf "macvtapResources: entries %v and %d both use NIC %s and one is in passthru mode: a passthru macvtap must be its NIC's only macvlan/macvtap port; give it a NIC of its own" $earlier.entry $i $nic) }}
{{- end }}
{{- end }}
{{- $_ := set $nics $nic (dict "entry" $i "passthru" $passthru) }}
{{- end }}
{{- end }}
{{- end -}}
