#!/usr/bin/env bash
# A local Kubernetes control plane for tests, with fake (kwok) nodes, on 127.0.0.1.
#
# It runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kwok
# controller as plain processes (kwokctl --runtime binary), all from the binaries that
# hack/cluster/build.sh built; nothing is downloaded at run time. Pods scheduled onto
# the kwok nodes go Running by themselves (kwok's default pod stages); no container runs.
#
# Usage:
#   hack/cluster/cluster.sh up [--nodes N]   create (or reuse) the cluster, N kwok nodes (default 3)
#   hack/cluster/cluster.sh env              print the cluster's KUBECONFIG path
#   hack/cluster/cluster.sh status           show the cluster, its components and nodes
#   hack/cluster/cluster.sh down             delete the cluster
#
#   export KUBECONFIG="$(hack/cluster/cluster.sh env)"
#
# Environment:
#   RTJ_CLUSTER_NAME   cluster name (default: rtj-dev)
#   RTJ_CACHE_DIR      cache root shared with build.sh (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rtj)
#   RTJ_APISERVER_BIND_ADDRESS  kube-apiserver --bind-address (default: 127.0.0.1). Real nodes
#                      (hack/cluster/nodes.sh) need 0.0.0.0: their kubelets and pods reach
#                      the API server from other network namespaces.
#   RTJ_HEARTBEAT_FACTOR  kwokctl --heartbeat-factor (default: 1, i.e. upstream timings:
#                      node-monitor-period 5s, node-monitor-grace-period 40s, kwok node
#                      status every 10s; kwokctl's own default 5 makes node loss take 200s)
#   RTJ_KUBE_FEATURE_GATES  feature gates of every component (default:
#                      GenericWorkload=true,GangScheduling=true,WorkloadAwarePreemption=true);
#                      a cluster created with others
#                      is recreated by up
#
# kwok manages only Nodes annotated kwok.x-k8s.io/node=fake; Nodes registered by
# anything else (for example the project's own node agent) are left alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

name="${RTJ_CLUSTER_NAME:-rtj-dev}"
cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
export RTJ_CACHE_DIR="${cache_dir}"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

bin_dir="$("${here}/build.sh" --print-bindir)"
kwokctl="${bin_dir}/kwokctl"
kubectl="${bin_dir}/kubectl"

# kwokctl keeps its clusters (and its own config) under KWOK_WORKDIR; keep ours apart
# from any ~/.kwok the user has.
export KWOK_WORKDIR="${cache_dir}/kwok"
kubeconfig="${KWOK_WORKDIR}/clusters/${name}/kubeconfig.yaml"

# Every binary kwokctl could want is given as a local path, so it never downloads one.
export KWOK_RUNTIME=binary
export KWOK_KUBE_VERSION="${KUBE_VERSION}"
export KWOK_ETCD_VERSION="${ETCD_VERSION#v}"
export KWOK_VERSION="${KWOK_VERSION#v}"
export KWOK_KUBE_APISERVER_BINARY="${bin_dir}/kube-apiserver"
export KWOK_KUBE_CONTROLLER_MANAGER_BINARY="${bin_dir}/kube-controller-manager"
export KWOK_KUBE_SCHEDULER_BINARY="${bin_dir}/kube-scheduler"
export KWOK_KUBECTL_BINARY="${bin_dir}/kubectl"
export KWOK_ETCD_BINARY="${bin_dir}/etcd"
export KWOK_CONTROLLER_BINARY="${bin_dir}/kwok"
export KWOK_QUIET_PULL=true
# No optional component that would need a download (prometheus, jaeger, dashboard,
# metrics-server) is enabled: their ports stay unset and --enable is never passed.
unset KWOK_PROMETHEUS_PORT KWOK_JAEGER_PORT KWOK_DASHBOARD_PORT 2>/dev/null || true

ensure_binaries() {
  if ! "${here}/build.sh" --check; then
    log "binaries missing in ${bin_dir}; building them (the first build takes tens of minutes)"
    "${here}/build.sh" >&2
  fi
}

cluster_exists() {
  # Not a pipe into grep -q: under pipefail an early grep exit fails the pipeline.
  local clusters
  clusters="$("${kwokctl}" get clusters 2>/dev/null || true)"
  grep -qx -- "${name}" <<<"${clusters}"
}

k() { "${kubectl}" --kubeconfig "${kubeconfig}" "$@"; }

wait_apiserver() {
  local deadline=$((SECONDS + ${1:-120}))
  until k get --raw /readyz >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "kube-apiserver of ${name} not ready (see: $0 status; logs under ${KWOK_WORKDIR}/clusters/${name}/logs)"
    sleep 1
  done
}

apiserver_ready_within() {
  local deadline=$((SECONDS + $1))
  until k get --raw /readyz >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 1
  done
}

# Objects a test expects a normal cluster to have before it creates pods.
wait_defaults() {
  local deadline=$((SECONDS + ${1:-120})) restarted=0
  until k -n default get serviceaccount default >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "default ServiceAccount never appeared (kube-controller-manager not running?)"
    # On a loaded machine kube-controller-manager can give up waiting for a healthy
    # apiserver during a fresh cluster's first start and exit; start it once more.
    if ((restarted == 0 && SECONDS + ${1:-120} - deadline > 45)); then
      log "no default ServiceAccount after 45s; starting stopped components again"
      "${kwokctl}" start cluster --name "${name}" >&2 8>&- || true
      restarted=1
    fi
    sleep 1
  done
}

node_manifest() {
  local i="$1"
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-${i}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-${i}
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
spec: {}
status:
  allocatable:
    cpu: "32"
    memory: 256Gi
    ephemeral-storage: 1Ti
    pods: "110"
  capacity:
    cpu: "32"
    memory: 256Gi
    ephemeral-storage: 1Ti
    pods: "110"
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
    kubeProxyVersion: fake
EOF
}

ensure_nodes() {
  local n="$1" i
  for ((i = 0; i < n; i++)); do
    if ! k get node "kwok-node-${i}" >/dev/null 2>&1; then
      node_manifest "${i}" | k create -f - >/dev/null
      log "node kwok-node-${i} created"
    fi
  done
  local deadline=$((SECONDS + 120)) ready
  while :; do
    ready="$(k get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c '^True$' || true)"
    ((ready >= n)) && break
    ((SECONDS < deadline)) || die "only ${ready}/${n} kwok nodes Ready after 120s"
    sleep 1
  done
  log "${ready} kwok node(s) Ready"
}

# One up/down at a time per cluster name. Every kwokctl call that starts processes
# closes fd 8 (8>&-), or the cluster's daemons would inherit the lock and hold it
# forever; the timeout covers clusters started before that was so.
lock_cluster() {
  mkdir -p "${KWOK_WORKDIR}"
  exec 8>"${KWOK_WORKDIR}/.${name}.lock"
  if ! flock -w 120 8; then
    log "warning: ${KWOK_WORKDIR}/.${name}.lock still held after 120s; going on without it"
  fi
}

# Native all-or-nothing scheduling (docs/operator.md): the alpha Workload/PodGroup API
# (scheduling.k8s.io/v1alpha2), the scheduler's gang plugin, and its preemption of a whole
# PodGroup (disruptionMode, priorityClassName). RTJ_KUBE_FEATURE_GATES replaces
# the list (a test cluster that serves the API with the scheduler's plugin off).
kube_feature_gates="${RTJ_KUBE_FEATURE_GATES:-GenericWorkload=true,GangScheduling=true,WorkloadAwarePreemption=true}"
kube_runtime_config="scheduling.k8s.io/v1alpha2=true"
# Admission as hardened clusters (OpenShift among them) run it: setting blockOwnerDeletion on an
# ownerReference needs "update" on the owner's finalizers, so an RBAC set lacking it fails here.
kube_admission_plugins="OwnerReferencesPermissionEnforcement"
# The audit log (logs/audit.log of the cluster) records the requests of the ServiceAccounts of
# namespace rtj-system, where operator/deploy/rbac.yaml puts the operator: tests compare the
# verbs it used with the ones it is granted.
audited_group="system:serviceaccounts:rtj-system"
api_flags_id="gates=${kube_feature_gates};runtime=${kube_runtime_config};admission=${kube_admission_plugins};audit=${audited_group}"

cmd_up() {
  local nodes=3
  while (($#)); do
    case "$1" in
      --nodes) [[ $# -ge 2 ]] || die "--nodes needs a number"; nodes="$2"; shift 2 ;;
      --nodes=*) nodes="${1#--nodes=}"; shift ;;
      *) die "unknown argument to up: $1" ;;
    esac
  done
  [[ "${nodes}" =~ ^[0-9]+$ ]] || die "--nodes must be a number, got '${nodes}'"

  ensure_binaries
  lock_cluster
  local start=${SECONDS}

  # A cluster created with other API flags (an older checkout) is recreated, so the gang
  # scheduling API is there on every cluster this script brings up.
  local marker="${KWOK_WORKDIR}/clusters/${name}/rtj-api-flags"
  if cluster_exists && [[ "$(cat "${marker}" 2>/dev/null)" != "${api_flags_id}" ]]; then
    log "cluster ${name} was created with other API flags; recreating it"
    "${kwokctl}" delete cluster --name "${name}" --kubeconfig "${kubeconfig}" >&2 8>&- || true
  fi

  if cluster_exists; then
    log "cluster ${name} exists; starting it if stopped"
    "${kwokctl}" start cluster --name "${name}" >&2 8>&- || true
    # A stopped cluster keeps the ports it was created with; another cluster created since may
    # hold them now, and then it never starts again ("bind: address already in use" in its
    # logs). Its state is scratch: recreate it on ports free now.
    if ! apiserver_ready_within 90; then
      log "cluster ${name} did not start (logs under ${KWOK_WORKDIR}/clusters/${name}/logs); recreating it"
      "${kwokctl}" delete cluster --name "${name}" --kubeconfig "${kubeconfig}" >&2 8>&- || true
    fi
  fi
  if ! cluster_exists; then
    log "creating cluster ${name} (kubernetes ${KUBE_VERSION}, etcd ${ETCD_VERSION}, kwok ${KWOK_VERSION})"
    # bindAddress is only settable from a config file. The admission plugins are set here too:
    # kwokctl 0.8 indexes --extra-args patches wrongly once a second component has two of them.
    local conf="${KWOK_WORKDIR}/rtj-kwokctl-${name}.yaml"
    # The serving certificate also names the kubernetes Service's address (the first of the
    # service range), so pods on real nodes verify it with their in-cluster config.
    cat >"${conf}" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  bindAddress: 127.0.0.1
  kubeApiserverCertSANs: ["10.0.0.1", "10.96.0.1"]
componentsPatches:
  - name: kube-apiserver
    extraArgs:
      - key: enable-admission-plugins
        value: ${kube_admission_plugins}
EOF
    local audit_policy="${KWOK_WORKDIR}/rtj-audit-policy-${name}.yaml"
    cat >"${audit_policy}" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["${audited_group}"]
  - level: None
EOF
    # kwokctl starts kwok with --manage-all-nodes=true under the binary runtime;
    # narrow it to annotated nodes so real (agent-registered) nodes are left alone.
    "${kwokctl}" --config "${conf}" create cluster \
      --name "${name}" \
      --runtime binary \
      --kubeconfig "" \
      --secure-port=true --kube-authorization=true --kube-admission=true \
      --kube-audit-policy "${audit_policy}" \
      --heartbeat-factor "${RTJ_HEARTBEAT_FACTOR:-1}" \
      --kube-feature-gates "${kube_feature_gates}" \
      --kube-runtime-config "${kube_runtime_config}" \
      --kube-apiserver-binary "${KWOK_KUBE_APISERVER_BINARY}" \
      --kube-controller-manager-binary "${KWOK_KUBE_CONTROLLER_MANAGER_BINARY}" \
      --kube-scheduler-binary "${KWOK_KUBE_SCHEDULER_BINARY}" \
      --etcd-binary "${KWOK_ETCD_BINARY}" \
      --kwok-controller-binary "${KWOK_CONTROLLER_BINARY}" \
      --extra-args "kwok-controller=manage-all-nodes=false" \
      --extra-args "kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" \
      --extra-args "kube-apiserver=bind-address=${RTJ_APISERVER_BIND_ADDRESS:-127.0.0.1}" \
      --quiet-pull \
      --timeout 5m \
      --wait 2m >&2 8>&- || die "kwokctl create cluster failed; logs under ${KWOK_WORKDIR}/clusters/${name}/logs"
    echo "${api_flags_id}" >"${marker}"
  fi

  [[ -f "${kubeconfig}" ]] || die "no kubeconfig at ${kubeconfig}"
  wait_apiserver 120
  wait_defaults 120
  ensure_nodes "${nodes}"
  log "cluster ${name} up in $((SECONDS - start))s; server $(k version -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n1)"
  log "kubectl: ${kubectl}"
  echo "export KUBECONFIG=${kubeconfig}"
}

cmd_env() {
  echo "${kubeconfig}"
}

cmd_status() {
  [[ -x "${kwokctl}" ]] || die "kwokctl not built yet: run ${here}/build.sh"
  if ! cluster_exists; then
    echo "cluster ${name}: absent"
    return 1
  fi
  echo "cluster ${name}: present (KUBECONFIG=${kubeconfig})"
  "${kwokctl}" get components --name "${name}" 2>/dev/null || true
  if k get --raw /readyz >/dev/null 2>&1; then
    echo "apiserver: ready"
    k get nodes -o wide
  else
    echo "apiserver: not ready"
    return 1
  fi
}

cmd_down() {
  [[ -x "${kwokctl}" ]] || die "kwokctl not built yet: run ${here}/build.sh"
  lock_cluster
  if cluster_exists; then
    # --kubeconfig names the file kwokctl removes the cluster's context from; it rejects
    # an empty path, and the cluster's own kubeconfig keeps ~/.kube/config untouched.
    "${kwokctl}" delete cluster --name "${name}" --kubeconfig "${kubeconfig}" >&2 8>&-
    log "cluster ${name} deleted"
  else
    log "cluster ${name} does not exist"
  fi
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  env) cmd_env ;;
  status) cmd_status ;;
  down) cmd_down ;;
  -h|--help|help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown command: $1 (up|down|env|status)" ;;
esac
