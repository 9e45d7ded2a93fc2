#!/usr/bin/env bash
# Real nodes for the local control plane: kubelet + containerd + kube-proxy per node, each node
# in its own network namespace, plus CoreDNS as a Deployment. Pods run as real containers
# (runc) from images imported without a registry (hack/images/build.sh).
#
# Usage (as root; the cluster must be up: hack/cluster/cluster.sh up --nodes 0, started with
# RTJ_APISERVER_BIND_ADDRESS=0.0.0.0 so that nodes and pods can reach the API server):
#   hack/cluster/nodes.sh up [N]               start nodes 1..N (default 2) and CoreDNS
#   hack/cluster/nodes.sh down                 drain and stop every node, delete their Nodes
#   hack/cluster/nodes.sh kill-node I [--keep-images]
#                                              lose node I: SIGKILL everything it runs
#                                              (kubelet, containerd, shims, containers),
#                                              remove its network, delete its Node; with
#                                              --keep-images its image store is parked for
#                                              the next add-node (a machine image with the
#                                              images baked in: no import of GiBs again)
#   hack/cluster/nodes.sh add-node I [KEY=VALUE...]
#                                              start one more node I (a new name) with these
#                                              Node labels, on a parked image store if there
#                                              is one, and wait until it is Ready
#   hack/cluster/nodes.sh import-image TAR [I...]  load a docker-archive into the running
#                                              nodes (or nodes I...); an archive already
#                                              imported into a node is skipped
#   hack/cluster/nodes.sh name I               print node I's Node name (its IP)
#   hack/cluster/nodes.sh status               the nodes' processes and Node objects
#
# Layout of node I of cluster C (slot S = a number 0-59 derived from C, so two clusters on one
# machine get different addresses):
#   network namespace rtj-C-nI; a veth pair: host side 10.99.S.(4I+1)/30, node side
#     10.99.S.(4I+2)/30 (the node's IP and its Node name); pods on bridge cni0 inside the
#     namespace, 10.(128+S).I.0/24, routed from the host through the node's veth.
#   cgroup /rtj-C-nI in every cgroup v1 hierarchy: the kubelet's cgroupRoot; the node's own
#     daemons (and so the containerd shims) live in its "system" child, so killing the
#     cgroup tree kills the whole node.
#   state under ${RTJ_NODES_DIR:-/var/lib/rtj-nodes}/C/nI: containerd root/state/sockets,
#     runc root, kubelet root/certs/pod logs, configs and the daemons' logs; image stores of
#     nodes lost with --keep-images wait under .../C/parked/ for the next add-node.
# The daemons enter only the node's network namespace (nsenter --net), not a mount
# namespace: the kubelet's volume mounts must be visible to containerd.
#
# Environment:
#   RTJ_CLUSTER_NAME   cluster name (default: rtj-dev), as cluster.sh
#   RTJ_CACHE_DIR      cache root shared with build.sh
#   RTJ_NODES_DIR      state root (default: /var/lib/rtj-nodes)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

name="${RTJ_CLUSTER_NAME:-rtj-dev}"
cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
export RTJ_CACHE_DIR="${cache_dir}"
state_root="${RTJ_NODES_DIR:-/var/lib/rtj-nodes}/${name}"
bin_dir="$("${here}/build.sh" --print-bindir)"
kubectl="${bin_dir}/kubectl"
kubeconfig="$("${here}/cluster.sh" env)"
cni_bin="${RTJ_CNI_BIN_DIR:-/usr/lib/cni}"

log() { printf '[nodes] %s\n' "$*" >&2; }
die() { printf '[nodes] ERROR: %s\n' "$*" >&2; exit 1; }
k() { "${kubectl}" --kubeconfig "${kubeconfig}" "$@"; }

slot="$(printf '%s' "${name}" | cksum | awk '{print $1 % 60}')"
pod_cidr_all="10.$((128 + slot)).0.0/16"
cluster_domain="cluster.local"

node_dir() { echo "${state_root}/n$1"; }
netns_of() { echo "rtj-${name}-n$1"; }
veth_of() { echo "rtj${slot}n$1"; }
host_ip() { echo "10.99.${slot}.$((4 * $1 + 1))"; }
node_ip() { echo "10.99.${slot}.$((4 * $1 + 2))"; }
pod_cidr() { echo "10.$((128 + slot)).$1.0/24"; }
cgroup_of() { echo "rtj-${name}-n$1"; }
# Every cgroup v1 hierarchy (cgroup2's unified mount holds no controllers here).
hierarchies() { findmnt -rn -t cgroup -o TARGET; }

node_indexes() {
  local d
  for d in "${state_root}"/n*; do
    [[ -d "${d}" ]] && echo "${d##*/n}"
  done | sort -n
}

# ---------------------------------------------------------------------------------------
# Preconditions
# ---------------------------------------------------------------------------------------

require_tools() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, cgroups, mounts)"
  local t
  for t in containerd containerd-shim-runc-v2 runc ctr ip iptables nsenter findmnt; do
    command -v "${t}" >/dev/null || die "${t} not found (apt-get install containerd runc iptables iproute2 util-linux)"
  done
  [[ -x "${cni_bin}/bridge" && -x "${cni_bin}/host-local" && -x "${cni_bin}/loopback" ]] \
    || die "CNI plugins missing in ${cni_bin} (apt-get install containernetworking-plugins)"
  for t in kubelet kube-proxy kubectl; do
    [[ -x "${bin_dir}/${t}" ]] || die "${bin_dir}/${t} missing: run hack/cluster/build.sh"
  done
  [[ -f "${kubeconfig}" ]] || die "cluster ${name} is not up (no ${kubeconfig}): run hack/cluster/cluster.sh up --nodes 0"
}

# The API server's port and an address of this machine it answers on from another network
# namespace. cluster.sh binds it to 127.0.0.1 unless RTJ_APISERVER_BIND_ADDRESS=0.0.0.0.
apiserver_port() {
  k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's|.*:||'
}

service_ip_of_kubernetes() { k get svc kubernetes -n default -o jsonpath='{.spec.clusterIP}'; }

dns_ip() {
  local ip
  ip="$(service_ip_of_kubernetes)"
  echo "${ip%.*}.10"
}

# From inside node I's network namespace, through its veth, as the kubelet will connect.
check_apiserver_reachable() {
  local i="$1" port addr
  port="$(apiserver_port)"
  addr="$(host_ip "${i}")"
  if ! ip netns exec "$(netns_of "${i}")" timeout 3 bash -c "exec 3<>/dev/tcp/${addr}/${port}" 2>/dev/null; then
    destroy_node "${i}"
    die "the API server does not answer on ${addr}:${port} from node ${i}; start the cluster with RTJ_APISERVER_BIND_ADDRESS=0.0.0.0 hack/cluster/cluster.sh up --nodes 0"
  fi
}

# ---------------------------------------------------------------------------------------
# One node
# ---------------------------------------------------------------------------------------

setup_network() {
  local i="$1" ns veth
  ns="$(netns_of "${i}")"
  veth="$(veth_of "${i}")"
  sysctl -qw net.ipv4.ip_forward=1
  ip netns add "${ns}"
  ip link add "${veth}" type veth peer name eth0 netns "${ns}"
  ip addr add "$(host_ip "${i}")/30" dev "${veth}"
  ip link set "${veth}" up
  # Machines whose FORWARD policy drops (Docker hosts, for one) still forward node traffic.
  iptables -I FORWARD -i "${veth}" -j ACCEPT
  iptables -I FORWARD -o "${veth}" -j ACCEPT
  ip route replace "$(pod_cidr "${i}")" via "$(node_ip "${i}")" dev "${veth}"
  ip -n "${ns}" link set lo up
  ip -n "${ns}" addr add "$(node_ip "${i}")/30" dev eth0
  ip -n "${ns}" link set eth0 up
  ip -n "${ns}" route add default via "$(host_ip "${i}")"
  ip netns exec "${ns}" sysctl -qw net.ipv4.ip_forward=1
  # Bridged pod-to-pod traffic must pass iptables for Service DNAT replies (kube-proxy).
  if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    ip netns exec "${ns}" sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
  fi
}

setup_cgroups() {
  local cg h
  cg="$(cgroup_of "$1")"
  while read -r h; do
    mkdir -p "${h}/${cg}/system"
    if [[ -f "${h}/cpuset.cpus" ]]; then
      local d
      for d in "${h}/${cg}" "${h}/${cg}/system"; do
        cat "${h}/cpuset.cpus" >"${d}/cpuset.cpus"
        cat "${h}/cpuset.mems" >"${d}/cpuset.mems"
      done
    fi
  done < <(hierarchies)
}

write_configs() {
  local i="$1" d pause_ref
  d="$(node_dir "${i}")"
  pause_ref="$("${root}/hack/images/build.sh" --ref pause)"
  mkdir -p "${d}"/{containerd,runc,cni/conf,root,certs,podlogs,logs}
  cat >"${d}/containerd.toml" <<EOF
version = 2
root = "${d}/containerd/root"
state = "${d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "${d}/containerd/containerd.sock"
[ttrpc]
  address = "${d}/containerd/containerd.sock.ttrpc"
[debug]
  address = "${d}/containerd/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "${d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${pause_ref}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # runc cannot lower oom_score_adj on machines without CAP_SYS_RESOURCE; the kubelet asks
  # for -998 for the sandbox. This clamps the request to the current value instead.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${cni_bin}"
    conf_dir = "${d}/cni/conf"
EOF
  cat >"${d}/cni/conf/10-rtj.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rtj",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(pod_cidr "${i}")"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${d}/cni/ipam"
      }
    }
  ]
}
EOF
  # The cluster's kubeconfig, pointed at this machine's address on the node's veth. The
  # certificate names 127.0.0.1, so that is the name the client verifies.
  k config view --raw --flatten --minify \
    | sed -e "s|server: https://[^:]*:|server: https://$(host_ip "${i}"):|" \
          -e "/server: https/a\\    tls-server-name: 127.0.0.1" >"${d}/kubeconfig"
  printf 'nameserver 127.0.0.1\noptions ndots:1\n' >"${d}/resolv.conf"
  cat >"${d}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$(cgroup_of "${i}")
# This machine mounts cgroup v1 only; kubelet 1.36 still honours this switch (with a warning).
failCgroupV1: false
failSwapOn: false
address: $(node_ip "${i}")
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://${d}/containerd/containerd.sock
imageServiceEndpoint: unix://${d}/containerd/containerd.sock
podLogsDir: ${d}/podlogs
clusterDNS: [$(dns_ip)]
clusterDomain: ${cluster_domain}
resolvConf: ${d}/resolv.conf
# Nodes share the machine's disk; eviction and image garbage collection start only when it
# is nearly full (images cannot be pulled again: they come from archives).
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusReportFrequency: 10s
EOF
  cat >"${d}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${d}/kubeconfig
hostnameOverride: $(node_ip "${i}")
clusterCIDR: ${pod_cidr_all}
mode: iptables
iptables:
  masqueradeAll: true
  minSyncPeriod: 0s
  syncPeriod: 30s
# A network namespace cannot raise the machine's conntrack limits: leave them as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
}

# Start a daemon of node I: in the node's "system" cgroup (every hierarchy) and its network
# namespace, detached, logging to logs/NAME.log, pid in NAME.pid.
start_daemon() {
  local i="$1" what="$2" d cg procs=""
  shift 2
  d="$(node_dir "${i}")"
  cg="$(cgroup_of "${i}")"
  while read -r h; do procs+="${h}/${cg}/system/cgroup.procs "; done < <(hierarchies)
  RTJ_CG_PROCS="${procs}" RTJ_NETNS="/run/netns/$(netns_of "${i}")" setsid bash -c '
    for f in ${RTJ_CG_PROCS}; do echo $$ >"${f}"; done
    exec nsenter --net="${RTJ_NETNS}" "$@"
  ' _ "$@" </dev/null >"${d}/logs/${what}.log" 2>&1 &
  echo $! >"${d}/${what}.pid"
}

wait_for() {
  local what="$1" seconds="$2"
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
  echo "${what}" >/dev/null
}

ctr_of() { ctr --address "$(node_dir "$1")/containerd/containerd.sock" -n k8s.io "${@:2}"; }

# Archives are named by the hash of their inputs, so one imported before is the same image:
# skip it (the runtime image takes minutes to import) while the node still has every image
# the import created (the kubelet deletes unused images when the disk fills up).
import_into() {
  local i="$1" tar="$2" mark out have ref missing=0
  [[ -f "${tar}" ]] || die "no image archive ${tar}"
  mark="$(node_dir "${i}")/imported/$(basename "${tar}")"
  if [[ -s "${mark}" ]]; then
    have="$(ctr_of "${i}" images ls -q)"
    while read -r ref; do
      grep -qxF -- "${ref}" <<<"${have}" || missing=1
    done <"${mark}"
    ((missing)) || return 0
  fi
  out="$(ctr_of "${i}" images import "${tar}")" || die "node ${i}: import of ${tar} failed"
  mkdir -p "${mark%/*}"
  # ctr prints "unpacking <ref> (sha256:...)...done" per image.
  sed -n 's/^unpacking \([^ ]*\) .*/\1/p' <<<"${out}" >"${mark}"
}

parked_dir() { echo "${state_root}/parked"; }

# A node lost with --keep-images leaves its containerd root (content and unpacked snapshots)
# and its import marks here; the containers it ran are records of a node that is gone, which
# the next node's kubelet removes as containers of pods it does not know.
park_store() {
  local i="$1" d dest
  d="$(node_dir "${i}")"
  [[ -d "${d}/containerd/root" ]] || return 0
  dest="$(parked_dir)/n${i}-$(date +%s%N)"
  mkdir -p "${dest}"
  mv "${d}/containerd/root" "${dest}/root"
  [[ -d "${d}/imported" ]] && mv "${d}/imported" "${dest}/imported"
  log "node ${i}: image store parked"
}

# Take the oldest parked store, if any, as node I's containerd root.
adopt_store() {
  local i="$1" d store
  d="$(node_dir "${i}")"
  [[ -d "$(parked_dir)" ]] || return 0
  store="$(find "$(parked_dir)" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | head -n1)"
  [[ -n "${store}" ]] || return 0
  mv "${store}/root" "${d}/containerd/root"
  [[ -d "${store}/imported" ]] && mv "${store}/imported" "${d}/imported"
  rm -rf "${store}"
  log "node ${i}: started on the parked image store ${store##*/}"
}

start_node() {
  local i="$1" labels="rtj.dev/node-kind=real" d start=${SECONDS}
  [[ -n "${2:-}" ]] && labels+=",$2"
  d="$(node_dir "${i}")"
  [[ -e "/run/netns/$(netns_of "${i}")" ]] && die "node ${i} of ${name} exists already (run down first)"
  setup_network "${i}"
  check_apiserver_reachable "${i}"
  setup_cgroups "${i}"
  write_configs "${i}"
  adopt_store "${i}"
  start_daemon "${i}" containerd containerd --config "${d}/containerd.toml"
  wait_for containerd 30 ctr_of "${i}" version || die "containerd of node ${i} did not start: $(tail -5 "${d}/logs/containerd.log")"
  import_into "${i}" "$("${root}/hack/images/build.sh" pause)"
  import_into "${i}" "$(coredns_archive)"
  start_daemon "${i}" kubelet "${bin_dir}/kubelet" \
    --config="${d}/kubelet.yaml" --kubeconfig="${d}/kubeconfig" \
    --root-dir="${d}/root" --cert-dir="${d}/certs" \
    --hostname-override="$(node_ip "${i}")" --node-ip="$(node_ip "${i}")" \
    --containerd="${d}/containerd/containerd.sock" \
    --node-labels="${labels}"
  start_daemon "${i}" kube-proxy "${bin_dir}/kube-proxy" --config="${d}/kube-proxy.yaml"
  log "node ${i}: $(node_ip "${i}") started in $((SECONDS - start))s"
}

# ---------------------------------------------------------------------------------------
# Stopping
# ---------------------------------------------------------------------------------------

stop_pidfile() {
  local f="$1" signal="${2:-TERM}" pid
  [[ -f "${f}" ]] || return 0
  pid="$(cat "${f}")"
  kill "-${signal}" "${pid}" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "${pid}" 2>/dev/null || true
  rm -f "${f}"
}

# SIGKILL every process in the node's cgroup tree until none is left.
kill_cgroup_tree() {
  local cg h pids
  cg="$(cgroup_of "$1")"
  h="$(hierarchies | grep -m1 '/pids$' || hierarchies | head -n1)"
  [[ -d "${h}/${cg}" ]] || return 0
  for _ in $(seq 50); do
    pids="$(find "${h}/${cg}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)"
    [[ -z "${pids}" ]] && return 0
    # shellcheck disable=SC2086
    kill -KILL ${pids} 2>/dev/null || true
    sleep 0.1
  done
  log "warning: processes left in cgroup ${cg}: ${pids}"
}

remove_cgroups() {
  local cg h
  cg="$(cgroup_of "$1")"
  while read -r h; do
    [[ -d "${h}/${cg}" ]] || continue
    find "${h}/${cg}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done < <(hierarchies)
}

unmount_under() {
  local d="$1" m
  # Deepest first; the kubelet bind-mounts its root dir onto itself.
  while read -r m; do
    umount -l "${m}" 2>/dev/null || true
  done < <(findmnt -rn -o TARGET | grep -F "${d}/" | sort -r; findmnt -rn -o TARGET | grep -Fx "${d}/root")
}

remove_network() {
  local i="$1" veth
  veth="$(veth_of "${i}")"
  while iptables -D FORWARD -i "${veth}" -j ACCEPT 2>/dev/null; do :; done
  while iptables -D FORWARD -o "${veth}" -j ACCEPT 2>/dev/null; do :; done
  ip route del "$(pod_cidr "${i}")" 2>/dev/null || true
  ip link del "$(veth_of "${i}")" 2>/dev/null || true
  ip netns del "$(netns_of "${i}")" 2>/dev/null || true
}

# Everything of node I goes, abruptly (no pod gets a grace period); its image store is parked
# when KEEP_IMAGES is 1.
destroy_node() {
  local i="$1" keep="${2:-0}" d
  d="$(node_dir "${i}")"
  kill_cgroup_tree "${i}"
  rm -f "${d}"/*.pid
  unmount_under "${d}"
  ((keep)) && park_store "${i}"
  remove_network "${i}"
  remove_cgroups "${i}"
  rm -rf "${d}" 2>/dev/null || { sleep 1; unmount_under "${d}"; rm -rf "${d}"; } \
    || log "warning: could not remove all of ${d}"
}

cmd_kill_node() {
  local i="${1:?kill-node needs a node number}" keep=0
  case "${2:-}" in
    "") ;;
    --keep-images) keep=1 ;;
    *) die "kill-node: unknown option '$2' (expected --keep-images)" ;;
  esac
  [[ -d "$(node_dir "${i}")" ]] || die "node ${i} of ${name} is not running"
  destroy_node "${i}" "${keep}"
  k delete node "$(node_ip "${i}")" --wait=false --ignore-not-found >/dev/null
  log "node ${i} ($(node_ip "${i}")) lost: processes killed, network removed, Node deleted"
}

cmd_down() {
  local i nodes start=${SECONDS}
  nodes="$(node_indexes)"
  [[ -n "${nodes}" ]] || { log "no nodes of ${name}"; return 0; }
  # 1. Pods go while their kubelets still run, so they get their grace period. The nodes are
  # cordoned first, or controllers would place replacement pods on them again.
  if [[ -f "${kubeconfig}" ]] && k get --raw /readyz >/dev/null 2>&1; then
    for i in ${nodes}; do
      k cordon "$(node_ip "${i}")" >/dev/null 2>&1 || true
    done
    for i in ${nodes}; do
      k delete pods --all-namespaces --field-selector "spec.nodeName=$(node_ip "${i}")" \
        --wait=false >/dev/null 2>&1 || true
    done
    local deadline=$((SECONDS + 60))
    for i in ${nodes}; do
      while k get pods -A --field-selector "spec.nodeName=$(node_ip "${i}")" -o name 2>/dev/null | grep -q .; do
        ((SECONDS < deadline)) || {
          log "warning: pods left on node ${i} after 60s: $(k get pods -A --field-selector "spec.nodeName=$(node_ip "${i}")" -o name 2>/dev/null | tr '\n' ' ')"
          break
        }
        sleep 0.5
      done
    done
    log "pods deleted at $((SECONDS - start))s"
  fi
  for i in ${nodes}; do
    local d
    d="$(node_dir "${i}")"
    # 2. kubelet and kube-proxy; 3. leftover tasks and containers; 4. containerd (its shims
    # would outlive it otherwise); then whatever is left in the node's cgroup tree.
    stop_pidfile "${d}/kubelet.pid"
    stop_pidfile "${d}/kube-proxy.pid"
    if ctr_of "${i}" version >/dev/null 2>&1; then
      local c
      for c in $(ctr_of "${i}" tasks ls -q 2>/dev/null); do ctr_of "${i}" tasks kill -s SIGKILL "${c}" >/dev/null 2>&1 || true; done
      sleep 0.3
      for c in $(ctr_of "${i}" tasks ls -q 2>/dev/null); do ctr_of "${i}" tasks delete -f "${c}" >/dev/null 2>&1 || true; done
      for c in $(ctr_of "${i}" containers ls -q 2>/dev/null); do ctr_of "${i}" containers delete "${c}" >/dev/null 2>&1 || true; done
    fi
    stop_pidfile "${d}/containerd.pid"
    log "node ${i}: daemons stopped at $((SECONDS - start))s"
    destroy_node "${i}"
    if [[ -f "${kubeconfig}" ]]; then
      k delete node "$(node_ip "${i}")" --wait=false --ignore-not-found >/dev/null 2>&1 || true
    fi
    log "node ${i} stopped at $((SECONDS - start))s"
  done
  rm -rf "$(parked_dir)"
  rmdir "${state_root}" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------
# CoreDNS
# ---------------------------------------------------------------------------------------

coredns_archive() { "${here}/build-coredns.sh" --archive; }

deploy_coredns() {
  local ref
  ref="$("${here}/build-coredns.sh" --ref)"
  sed -e "s|@IMAGE@|${ref}|" -e "s|@DNS_IP@|$(dns_ip)|" -e "s|@DOMAIN@|${cluster_domain}|" \
    "${here}/coredns.yaml" | k apply -f - >/dev/null
}

# ---------------------------------------------------------------------------------------

cmd_up() {
  local n="${1:-2}" i start=${SECONDS}
  [[ "${n}" =~ ^[0-9]+$ && "${n}" -ge 1 && "${n}" -le 60 ]] || die "up needs a node count 1-60, got '${n}'"
  require_tools
  "${root}/hack/images/build.sh" pause >/dev/null
  "${here}/build-coredns.sh" >/dev/null
  mkdir -p "${state_root}"
  for i in $(seq 1 "${n}"); do
    start_node "${i}"
  done
  deploy_coredns
  for i in $(seq 1 "${n}"); do wait_ready "${i}"; done
  k -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null \
    || die "CoreDNS not ready after 120s"
  log "${n} node(s) Ready and CoreDNS up in $((SECONDS - start))s"
}

wait_ready() {
  local i="$1" ip
  ip="$(node_ip "${i}")"
  wait_for node 60 bash -c "'${kubectl}' --kubeconfig '${kubeconfig}' get node '${ip}' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" \
    || die "node ${i} (${ip}) not Ready after 60s; see $(node_dir "${i}")/logs/kubelet.log"
}

cmd_add_node() {
  local i="${1:?add-node needs a node number}" label labels=""
  [[ "${i}" =~ ^[0-9]+$ && "${i}" -ge 1 && "${i}" -le 60 ]] || die "add-node needs a node number 1-60, got '${i}'"
  shift
  for label in "$@"; do
    [[ "${label}" =~ ^[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*$ ]] || die "add-node: a label is KEY=VALUE, got '${label}'"
    labels+="${labels:+,}${label}"
  done
  require_tools
  mkdir -p "${state_root}"
  start_node "${i}" "${labels}"
  wait_ready "${i}"
}

cmd_import_image() {
  local tar="${1:?import-image needs a docker-archive path}" i nodes
  shift
  nodes="${*:-$(node_indexes)}"
  [[ -n "${nodes}" ]] || die "no nodes of ${name} running"
  for i in ${nodes}; do import_into "${i}" "${tar}"; done
}

cmd_status() {
  local i d
  for i in $(node_indexes); do
    d="$(node_dir "${i}")"
    printf 'node %s %s:' "${i}" "$(node_ip "${i}")"
    for f in "${d}"/*.pid; do
      [[ -f "${f}" ]] || continue
      local w
      w="$(basename "${f}" .pid)"
      if kill -0 "$(cat "${f}")" 2>/dev/null; then printf ' %s=up' "${w}"; else printf ' %s=down' "${w}"; fi
    done
    echo
  done
  k get nodes -l rtj.dev/node-kind=real -o wide 2>/dev/null || true
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  kill-node) shift; cmd_kill_node "$@" ;;
  add-node) shift; cmd_add_node "$@" ;;
  import-image) shift; cmd_import_image "$@" ;;
  name) node_ip "${2:?name needs a node number}" ;;
  status) cmd_status ;;
  -h|--help|help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown command: $1 (up|down|kill-node|add-node|import-image|name|status)" ;;
esac
