#!/usr/bin/env bash
# Build the local test control plane from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes),
#   etcd (go.etcd.io/etcd/server/v3), kwok + kwokctl (sigs.k8s.io/kwok), helm (helm.sh/helm/v3).
#
# Versions come from versions.env next to this script. Every binary is stored once per
# version under the cache and reused by later runs; nothing is rebuilt when the cached
# binary exists and answers --version.
#
# Usage:
#   hack/cluster/build.sh                 build what is missing, print the bin folder
#   hack/cluster/build.sh --print-bindir  only print the bin folder (builds nothing)
#   hack/cluster/build.sh --check         exit 0 when every binary is cached, else 1
#
# Environment:
#   RTJ_CACHE_DIR     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rtj)
#   RTJ_BUILD_JOBS    go build -p (default: 2)
#   GO                the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

: "${KUBE_VERSION:?missing in versions.env}" "${ETCD_VERSION:?missing in versions.env}"
: "${KWOK_VERSION:?missing in versions.env}" "${HELM_VERSION:?missing in versions.env}"

cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
store_dir="${cache_dir}/bin"                 # <name>-<version>/<name>
src_dir="${cache_dir}/src"                   # wrapper modules
bin_dir="${store_dir}/set-kube${KUBE_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-helm${HELM_VERSION}"
jobs="${RTJ_BUILD_JOBS:-2}"

# name|version for every binary, in build order (kubernetes first: it is the one most
# likely to break, so a failure surfaces early).
kube_names=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
all_names=("${kube_names[@]}" etcd kwok kwokctl helm)

log() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

version_of() {
  case "$1" in
    kube-*|kubectl|kubelet) echo "${KUBE_VERSION}" ;;
    etcd) echo "${ETCD_VERSION}" ;;
    kwok|kwokctl) echo "${KWOK_VERSION}" ;;
    helm) echo "${HELM_VERSION}" ;;
    *) die "unknown binary $1" ;;
  esac
}

stored_path() { echo "${store_dir}/$1-$(version_of "$1")/$1"; }

# The command that proves a binary runs; its output must mention the version.
version_cmd() {
  case "$1" in
    kubectl) echo "version --client" ;;
    helm) echo "version --short" ;;
    *) echo "--version" ;;
  esac
}

is_cached() {
  local name="$1" path out
  path="$(stored_path "${name}")"
  [[ -x "${path}" ]] || return 1
  # shellcheck disable=SC2046
  out="$("${path}" $(version_cmd "${name}") 2>&1)" || return 1
  [[ "${out}" == *"$(version_of "${name}" | sed 's/^v//')"* ]]
}

link_bindir() {
  mkdir -p "${bin_dir}"
  local name
  for name in "${all_names[@]}"; do
    ln -sfn "$(stored_path "${name}")" "${bin_dir}/${name}"
  done
}

case "${1:-}" in
  --print-bindir) echo "${bin_dir}"; exit 0 ;;
  --check)
    for name in "${all_names[@]}"; do is_cached "${name}" || exit 1; done
    link_bindir; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

# ---------------------------------------------------------------------------
# Go toolchain
GO="${GO:-$(command -v go || true)}"
if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi
[[ -n "${GO}" && -x "${GO}" ]] || die "go not found: install Go >= 1.26 (https://go.dev/dl) or set GO=/path/to/go"
export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=local GOWORK=off GO111MODULE=on
unset GOOS GOARCH 2>/dev/null || true
log "using $("${GO}" version) (${GO}), -p ${jobs}"

mkdir -p "${store_dir}" "${src_dir}"
exec 9>"${cache_dir}/.build.lock"
if ! flock -n 9; then
  log "another build holds ${cache_dir}/.build.lock; waiting for it"
  flock 9
fi

total_start=${SECONDS}

# install_from <tmpdir> <name>...: move freshly built binaries into the store.
install_from() {
  local tmp="$1" name dest; shift
  for name in "$@"; do
    [[ -x "${tmp}/${name}" ]] || die "build produced no ${name} in ${tmp}"
    dest="$(stored_path "${name}")"
    mkdir -p "$(dirname "${dest}")"
    mv -f "${tmp}/${name}" "${dest}.tmp.$$"
    mv -f "${dest}.tmp.$$" "${dest}"
    is_cached "${name}" || die "${dest} does not report version $(version_of "${name}")"
  done
}

# missing <name>...: print the names that are not cached yet (logging the cached ones).
missing() {
  local name
  for name in "$@"; do
    if is_cached "${name}"; then
      log "${name} $(version_of "${name}") ... (cached)"
    else
      echo "${name}"
    fi
  done
}

# module_info <module@version>: proxy metadata as JSON (Time, GoMod, GoVersion).
module_info() { "${GO}" list -m -json "$1"; }

json_field() { sed -n "s/^[[:space:]]*\"$1\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" | head -n1; }

# ---------------------------------------------------------------------------
build_kube() {
  local todo; mapfile -t todo < <(missing "${kube_names[@]}")
  [[ ${#todo[@]} -gt 0 ]] || return 0
  local start=${SECONDS} ver="${KUBE_VERSION}"
  local staging_ver="v0.${ver#v1.}"
  local major minor; major="${ver#v}"; major="${major%%.*}"; minor="${ver#v*.}"; minor="${minor%%.*}"
  log "kubernetes ${ver}: ${todo[*]} (staging modules at ${staging_ver}) ..."

  local mod="${src_dir}/kubernetes-${ver}"
  mkdir -p "${mod}"
  if [[ ! -f "${mod}/.ready" ]]; then
    local info gomod time
    rm -f "${mod}/go.mod" "${mod}/go.sum"
    info="$(cd "${mod}" && module_info "k8s.io/kubernetes@${ver}")" || die "cannot download k8s.io/kubernetes@${ver}"
    gomod="$(json_field GoMod <<<"${info}")"
    [[ -f "${gomod}" ]] || die "no go.mod for k8s.io/kubernetes@${ver}"
    # k8s.io/kubernetes requires its staging modules at v0.0.0 and points them at
    # ./staging with replace lines that only work inside its own repository. As a
    # dependency we must replace every required staging module by its published tag.
    local goline; goline="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${gomod}")"
    {
      echo "// Generated by hack/cluster/build.sh; wrapper to build k8s.io/kubernetes ${ver}."
      echo "module rtj.local/cluster/kubernetes"
      echo
      echo "go ${goline:-1.26.0}"
      echo
      echo "require k8s.io/kubernetes ${ver}"
      echo
      echo "replace ("
      awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "${gomod}" | sort -u | while read -r m; do
        if grep -Eq "^[[:space:]]*(require[[:space:]]+)?${m//./\\.}[[:space:]]+v0\.0\.0([[:space:]]|$)" "${gomod}"; then
          printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_ver}"
        fi
      done
      echo ")"
    } >"${mod}/go.mod"
    rm -f "${mod}/go.sum"
    time="$(json_field Time <<<"${info}")"
    echo "${time:-1970-01-01T00:00:00Z}" >"${mod}/.build-date"
    local pkgs=() n
    for n in "${kube_names[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${n}@${ver}"); done
    (cd "${mod}" && "${GO}" get "${pkgs[@]}") || die "go get of k8s.io/kubernetes commands failed (see above)"
    touch "${mod}/.ready"
  fi

  local date pkgs=() n ldflags=(-s -w)
  date="$(cat "${mod}/.build-date")"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=(-X "${p}.gitVersion=${ver}" -X "${p}.gitMajor=${major}" -X "${p}.gitMinor=${minor}"
              -X "${p}.gitTreeState=clean" -X "${p}.buildDate=${date}")
  done
  for n in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${n}"); done
  local tmp; tmp="$(mktemp -d "${mod}/out.XXXXXX")"
  (cd "${mod}" && "${GO}" build -p "${jobs}" -ldflags "${ldflags[*]}" -o "${tmp}/" "${pkgs[@]}") \
    || die "building kubernetes ${ver} failed (see above)"
  install_from "${tmp}" "${todo[@]}"
  rm -rf "${tmp}"
  log "kubernetes ${ver}: ${todo[*]} done in $((SECONDS - start))s"
}

build_etcd() {
  local todo; mapfile -t todo < <(missing etcd)
  [[ ${#todo[@]} -gt 0 ]] || return 0
  local start=${SECONDS} ver="${ETCD_VERSION}"
  log "etcd ${ver} ..."
  local mod="${src_dir}/etcd-${ver}"
  mkdir -p "${mod}"
  if [[ ! -f "${mod}/.ready" ]]; then
    cat >"${mod}/go.mod" <<EOF
// Generated by hack/cluster/build.sh; wrapper to build etcd ${ver}.
module rtj.local/cluster/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ver}
EOF
    cat >"${mod}/main.go" <<'EOF'
// Command etcd runs the etcd server from go.etcd.io/etcd/server/v3 (what the
// upstream etcd binary's main does, without its etcdutl/etcdctl extras).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    rm -f "${mod}/go.sum"
    (cd "${mod}" && "${GO}" mod tidy) || die "go mod tidy for etcd ${ver} failed"
    touch "${mod}/.ready"
  fi
  local tmp; tmp="$(mktemp -d "${mod}/out.XXXXXX")"
  (cd "${mod}" && "${GO}" build -p "${jobs}" -ldflags "-s -w" -o "${tmp}/etcd" .) \
    || die "building etcd ${ver} failed (see above)"
  install_from "${tmp}" etcd
  rm -rf "${tmp}"
  log "etcd ${ver} done in $((SECONDS - start))s"
}

build_kwok() {
  local todo; mapfile -t todo < <(missing kwok kwokctl)
  [[ ${#todo[@]} -gt 0 ]] || return 0
  local start=${SECONDS} ver="${KWOK_VERSION}" tmp pkgs=() n
  log "kwok ${ver}: ${todo[*]} ..."
  tmp="$(mktemp -d "${src_dir}/kwok-${ver}.XXXXXX")"
  for n in "${todo[@]}"; do pkgs+=("sigs.k8s.io/kwok/cmd/${n}@${ver}"); done
  # kwokctl's default Kubernetes version follows the control plane we build.
  local ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${ver#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}"
  (cd "${tmp}" && GOBIN="${tmp}" "${GO}" install -p "${jobs}" -ldflags "${ldflags}" "${pkgs[@]}") \
    || die "building kwok ${ver} failed (see above)"
  install_from "${tmp}" "${todo[@]}"
  rm -rf "${tmp}"
  log "kwok ${ver}: ${todo[*]} done in $((SECONDS - start))s"
}

build_helm() {
  local todo; mapfile -t todo < <(missing helm)
  [[ ${#todo[@]} -gt 0 ]] || return 0
  local start=${SECONDS} ver="${HELM_VERSION}" tmp info gomod cg kmaj kmin
  log "helm ${ver} ..."
  tmp="$(mktemp -d "${src_dir}/helm-${ver}.XXXXXX")"
  info="$(cd "${tmp}" && module_info "helm.sh/helm/v3@${ver}")" || die "cannot download helm.sh/helm/v3@${ver}"
  gomod="$(json_field GoMod <<<"${info}")"
  # helm's Makefile derives the default Kubernetes capabilities from its client-go.
  cg="$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "${gomod}")"
  cg="${cg#v0.}"; kmaj=1; kmin="${cg%%.*}"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${ver}"
  ldflags+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  if [[ -n "${kmin}" ]]; then
    for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ldflags+=" -X ${p}.k8sVersionMajor=${kmaj} -X ${p}.k8sVersionMinor=${kmin}"
    done
  fi
  (cd "${tmp}" && GOBIN="${tmp}" "${GO}" install -p "${jobs}" -ldflags "${ldflags}" "helm.sh/helm/v3/cmd/helm@${ver}") \
    || die "building helm ${ver} failed (see above)"
  install_from "${tmp}" helm
  rm -rf "${tmp}"
  log "helm ${ver} done in $((SECONDS - start))s"
}

build_kube
build_etcd
build_kwok
build_helm
link_bindir

log "all binaries ready in $((SECONDS - total_start))s"
log "bin folder:"
echo "${bin_dir}"
