#!/usr/bin/env bash
# Install the Debian packages that registry-free images and real nodes need:
# mmdebstrap (the base root filesystem), buildah (builds the Dockerfile), containerd, runc and
# the CNI plugins (the nodes' runtime), iptables and conntrack (kube-proxy).
# Idempotent; installs nothing when every command is present.
set -euo pipefail

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v buildah >/dev/null || need+=(buildah)
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
((${#need[@]})) || exit 0
[[ $(id -u) -eq 0 ]] || { echo "[deps] needs root to install: ${need[*]}" >&2; exit 1; }
echo "[deps] apt-get install ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
