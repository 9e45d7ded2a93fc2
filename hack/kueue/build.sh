#!/usr/bin/env bash
# Build the Kueue controller (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy, and keep
# the manifests of the same module version next to it: Kueue's CRDs, its webhook
# configurations and the CRD conversion patches (tools/kueue.py installs them).
#
# The version comes from version.env next to this script. The binary and the manifests are
# stored once per version under the cache, like the control plane (hack/cluster/build.sh), and
# reused by later runs: nothing is rebuilt when the cached binary exists and `go version -m`
# says it is that module version.
#
# Usage:
#   hack/kueue/build.sh                 build what is missing, print the version's folder
#   hack/kueue/build.sh --print-dir     only print that folder (builds nothing)
#   hack/kueue/build.sh --check         exit 0 when it is cached, else 1
#
# Environment:
#   RTJ_CACHE_DIR     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rtj)
#   RTJ_BUILD_JOBS    go build -p (default: 2)
#   GO                the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=version.env
source "${here}/version.env"
: "${KUEUE_VERSION:?missing in version.env}"

cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
dir="${cache_dir}/bin/kueue-${KUEUE_VERSION}"   # kueue, config/{crd,webhook}/
jobs="${RTJ_BUILD_JOBS:-2}"
module="sigs.k8s.io/kueue"

log() { printf '[kueue] %s\n' "$*" >&2; }
die() { printf '[kueue] ERROR: %s\n' "$*" >&2; exit 1; }

GO="${GO:-$(command -v go || true)}"
if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

is_cached() {
  [[ -x "${dir}/kueue" && -f "${dir}/config/webhook/manifests.yaml" ]] || return 1
  [[ -f "${dir}/config/crd/bases/kueue.x-k8s.io_workloads.yaml" ]] || return 1
  [[ -n "${GO}" ]] || return 1
  # The module version the binary was built from (its build info), not a stamp file.
  "${GO}" version -m "${dir}/kueue" 2>/dev/null \
    | awk -v m="${module}" -v v="${KUEUE_VERSION}" '$1 == "mod" && $2 == m && $3 == v {f=1} END {exit !f}'
}

case "${1:-}" in
  --print-dir) echo "${dir}"; exit 0 ;;
  --check) is_cached; exit $? ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

[[ -n "${GO}" && -x "${GO}" ]] || die "go not found: install Go >= 1.25 (https://go.dev/dl) or set GO=/path/to/go"
export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=local GOWORK=off GO111MODULE=on
unset GOOS GOARCH 2>/dev/null || true

mkdir -p "${cache_dir}/bin" "${cache_dir}/src"
exec 9>"${cache_dir}/.kueue-build.lock"
if ! flock -n 9; then
  log "another build holds ${cache_dir}/.kueue-build.lock; waiting for it"
  flock 9
fi
if is_cached; then
  log "kueue ${KUEUE_VERSION} ... (cached)"
  echo "${dir}"
  exit 0
fi

start=${SECONDS}
log "kueue ${KUEUE_VERSION}: building ${module}/cmd/kueue with $("${GO}" version), -p ${jobs} ..."
tmp="$(mktemp -d "${cache_dir}/src/kueue-${KUEUE_VERSION}.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
ldflags="-s -w -X ${module}/pkg/version.GitVersion=${KUEUE_VERSION}"
(cd "${tmp}" && GOBIN="${tmp}/bin" "${GO}" install -p "${jobs}" -ldflags "${ldflags}" \
  "${module}/cmd/kueue@${KUEUE_VERSION}") || die "building kueue ${KUEUE_VERSION} failed (see above)"

# The manifests of the same version, from the module the build just downloaded.
src="$(cd "${tmp}" && "${GO}" mod download -json "${module}@${KUEUE_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' | head -n1)"
[[ -d "${src}/config/components" ]] || die "no config/components in the ${module}@${KUEUE_VERSION} module (${src:-no Dir})"
mkdir -p "${tmp}/out/config"
cp -r "${src}/config/components/crd" "${tmp}/out/config/crd"
cp -r "${src}/config/components/webhook" "${tmp}/out/config/webhook"
chmod -R u+w "${tmp}/out"   # the module cache is read-only
mv "${tmp}/bin/kueue" "${tmp}/out/kueue"
rm -rf "${dir}.tmp.$$"
mv "${tmp}/out" "${dir}.tmp.$$"
rm -rf "${dir}"
mv "${dir}.tmp.$$" "${dir}"
is_cached || die "${dir}/kueue does not report module ${module} ${KUEUE_VERSION}"
log "kueue ${KUEUE_VERSION} done in $((SECONDS - start))s"
echo "${dir}"
