#!/usr/bin/env bash
# Build CoreDNS from the Go module proxy and wrap it in an image archive for real nodes.
#
# The upstream image lives in a registry these machines cannot pull from; the module builds
# with `go install` (its go.mod has no replace directives). The binary is stored once per
# version under the cache, like build.sh's, and the image (the static binary alone, in a
# scratch image) as a docker-archive that `ctr images import` loads.
#
# Usage:
#   hack/cluster/build-coredns.sh             build what is missing, print the archive path
#   hack/cluster/build-coredns.sh --archive   print the archive path (builds nothing)
#   hack/cluster/build-coredns.sh --ref       print the image reference
#   hack/cluster/build-coredns.sh --check     exit 0 when the archive is cached
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"
: "${COREDNS_VERSION:?missing in versions.env}"

cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
bin="${cache_dir}/bin/coredns-${COREDNS_VERSION}/coredns"
archive="${cache_dir}/images/coredns-${COREDNS_VERSION}.tar"
ref="localhost/rtj-coredns:${COREDNS_VERSION}"
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

log() { printf '[coredns] %s\n' "$*" >&2; }
die() { printf '[coredns] ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  --archive) echo "${archive}"; exit 0 ;;
  --ref) echo "${ref}"; exit 0 ;;
  --check) [[ -f "${archive}" ]]; exit ;;
  "") ;;
  *) die "unknown argument $1" ;;
esac

if [[ -f "${archive}" ]]; then
  echo "${archive}"
  exit 0
fi

if ! { [[ -x "${bin}" ]] && "${bin}" -version 2>/dev/null | grep -q "${COREDNS_VERSION#v}"; }; then
  start=${SECONDS}
  log "building coredns ${COREDNS_VERSION} (go install from the module proxy)"
  out="$(mktemp -d "${cache_dir}/.coredns.XXXXXX")"
  GOBIN="${out}" CGO_ENABLED=0 "${go}" install -p "${RTJ_BUILD_JOBS:-2}" -trimpath \
    -ldflags '-s -w' "github.com/coredns/coredns@${COREDNS_VERSION}" >&2
  mkdir -p "$(dirname "${bin}")"
  mv "${out}/coredns" "${bin}"
  rmdir "${out}"
  log "coredns built in $((SECONDS - start))s"
fi

command -v buildah >/dev/null || die "buildah not found (apt-get install buildah)"
ctr="$(buildah from --quiet scratch)"
buildah copy --quiet --chmod 0755 "${ctr}" "${bin}" /coredns >/dev/null
buildah config --entrypoint '["/coredns"]' "${ctr}"
buildah commit --quiet --rm "${ctr}" "${ref}" >/dev/null
mkdir -p "$(dirname "${archive}")"
rm -f "${archive}.part"
buildah push --quiet "${ref}" "docker-archive:${archive}.part:${ref}" >/dev/null
mv "${archive}.part" "${archive}"
echo "${archive}"
