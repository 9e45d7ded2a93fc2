#!/usr/bin/env bash
# Build the project's images on a machine with no Docker daemon and no registry.
#
#   base      Debian (DEBIAN_RELEASE) made by mmdebstrap from Debian packages, with Debian's
#             python3 (3.11 on bookworm, the Dockerfile's PYTHON_VERSION): stands in for
#             python:3.11-slim-bookworm.
#   uv        an image holding /uv, from the uv wheel of UV_VERSION on PyPI: stands in for
#             ghcr.io/astral-sh/uv.
#   pause     the pod sandbox image: a static Go binary that sleeps until SIGTERM/SIGINT.
#   operator  the Dockerfile's operator target, built by buildah from base + uv.
#   runtime   the Dockerfile's runtime target (torch), likewise.
#
# The Dockerfile is built as it is; only its base images come in as build arguments
# (PYTHON_IMAGE, UV_IMAGE), and UV_NO_CACHE=0 with the machine's uv cache mounted at
# /root/.cache/uv, so torch and its CUDA wheels are read from the cache `uv sync` already
# filled instead of being downloaded again.
#
# Every image is written once as a docker-archive (what `ctr images import` loads) under
# ${RTJ_CACHE_DIR}/images/<name>-<key>.tar, where key hashes the image's inputs (this
# script, the Dockerfile, the build context, the base's key). A second run with the same
# inputs builds nothing. buildah's own layer cache (--layers) keeps the dependency layer
# across source edits.
#
# Usage:
#   hack/images/build.sh [base|uv|pause|operator|runtime|all]...   build, print archive paths
#   hack/images/build.sh --path NAME    print the archive path NAME would have (builds nothing)
#   hack/images/build.sh --ref NAME     print the image reference inside that archive
#   hack/images/build.sh --context-files  print the build context's files (what the keys hash)
#
# Environment:
#   RTJ_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rtj)
#   UV              the uv binary (default: uv on PATH)
#   UV_CACHE_DIR    the uv cache to mount (default: `uv cache dir`)
#   RTJ_IMAGE_TAG   tag of the operator and runtime images (default: dev)
#
# Needs root and Debian's mmdebstrap, buildah and go (for pause); hack/images/deps.sh
# installs the Debian packages.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
image_dir="${cache_dir}/images"
tag="${RTJ_IMAGE_TAG:-dev}"
# `uv run` exports UV (its own path); make's private uv may not be on PATH.
uv_bin="${UV:-$(command -v uv || true)}"

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

# Global ARG defaults of the Dockerfile: one source of truth for the versions.
dockerfile_arg() {
  sed -n "s/^ARG $1=\(.*\)$/\1/p" "${root}/Dockerfile" | head -n1
}
PYTHON_VERSION="$(dockerfile_arg PYTHON_VERSION)"
DEBIAN_RELEASE="$(dockerfile_arg DEBIAN_RELEASE)"
UV_VERSION="$(dockerfile_arg UV_VERSION)"
[[ -n "${PYTHON_VERSION}" && -n "${DEBIAN_RELEASE}" && -n "${UV_VERSION}" ]] \
  || die "Dockerfile lacks ARG PYTHON_VERSION/DEBIAN_RELEASE/UV_VERSION defaults"

# Debian packages of the base: the interpreter and what python:slim also carries.
BASE_PACKAGES="python3,ca-certificates,netbase,tzdata"

sha() { sha256sum | cut -c1-16; }
# A key covers the code that builds the image (its function, as bash prints it), not the
# whole script, so editing one image's recipe rebuilds only that image and those on top.
recipe() { declare -f "$@" | sha; }

# The build context as the Dockerfile sees it (.dockerignore's allow-list and exclusions; the
# delivery tests check that the two lists agree), then hashed by content.
context_files() {
  (
    cd "${root}"
    find pyproject.toml uv.lock README.md operator trainer_runtime examples .dockerignore \
      -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*/.pytest_cache/*' \
      ! -path '*/.ruff_cache/*' ! -path '*.egg-info/*' ! -path 'operator/deploy/*' \
      ! -path 'examples/demo_*.py' -print
  ) | LC_ALL=C sort
}
context_hash() {
  context_files | (cd "${root}" && tr '\n' '\0' | xargs -0 sha256sum) | sha
}

# The Dockerfile lines a target is built from: the global ARGs and the stages it needs
# (FROM <stage>, COPY --from=<stage>), so editing the operator stage leaves the runtime
# image's key alone (it takes minutes and 6 GB to rebuild).
stage_chain() {
  awk -v target="$1" '
    function need(s,   i, n, d) {
      if (s in needed || !(s in text)) return
      needed[s] = 1
      n = split(deps[s], d, " ")
      for (i = 1; i <= n; i++) need(d[i])
    }
    /^[[:space:]]*#/ { next }
    toupper($1) == "FROM" {
      cur = ($3 ~ /^[Aa][Ss]$/) ? $4 : "#" NR
      order[++count] = cur
      deps[cur] = $2
    }
    cur == "" { pre = pre $0 "\n"; next }
    { text[cur] = text[cur] $0 "\n" }
    match($0, /--from=[^ ]+/) { deps[cur] = deps[cur] " " substr($0, RSTART + 7, RLENGTH - 7) }
    END {
      need(target)
      printf "%s", pre
      for (i = 1; i <= count; i++) if (order[i] in needed) printf "%s", text[order[i]]
    }
  ' "${root}/Dockerfile"
}

key_of() {
  case "$1" in
    base) printf '%s %s %s %s\n' "$(recipe build_base)" "${DEBIAN_RELEASE}" "${PYTHON_VERSION}" "${BASE_PACKAGES}" | sha ;;
    uv) printf '%s %s\n' "$(recipe build_uv)" "${UV_VERSION}" | sha ;;
    pause) { recipe build_pause; cat "${here}/pause/main.go"; } | sha ;;
    operator|runtime) printf '%s %s %s %s %s %s\n' "$(recipe build_target)" "$(key_of base)" "$(key_of uv)" "$(context_hash)" "$(stage_chain "$1" | sha)" "$1" | sha ;;
    *) die "unknown image $1 (base|uv|pause|operator|runtime)" ;;
  esac
}

ref_of() {
  case "$1" in
    base) echo "localhost/rtj-python:${PYTHON_VERSION}-${DEBIAN_RELEASE}-$(key_of base)" ;;
    uv) echo "localhost/rtj-uv:${UV_VERSION}" ;;
    pause) echo "localhost/rtj-pause:$(key_of pause)" ;;
    operator) echo "localhost/rtj-operator:${tag}" ;;
    runtime) echo "localhost/rtj-train:${tag}" ;;
  esac
}

archive_of() { echo "${image_dir}/$1-$(key_of "$1").tar"; }

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# Write the archive from buildah's storage (atomically: a killed run leaves no half archive).
export_archive() {
  local name="$1" out="$2" ref
  ref="$(ref_of "${name}")"
  mkdir -p "${image_dir}"
  rm -f "${out}.part"
  buildah push --quiet "${ref}" "docker-archive:${out}.part:${ref}" >/dev/null
  mv "${out}.part" "${out}"
}

# The image must be in buildah's storage (a later build uses it as a base): load it from
# its archive when a previous run built it and the storage was wiped since.
ensure_in_storage() {
  local name="$1"
  have_image "$(ref_of "${name}")" && return 0
  local archive
  archive="$(archive_of "${name}")"
  [[ -f "${archive}" ]] || return 1
  buildah pull --quiet "docker-archive:${archive}" >/dev/null
  have_image "$(ref_of "${name}")"
}

build_base() {
  local work ctr
  work="$(mktemp -d "${image_dir}/.base.XXXXXX")"
  log "base: mmdebstrap ${DEBIAN_RELEASE} minbase + ${BASE_PACKAGES}"
  mmdebstrap --quiet --variant=minbase --include="${BASE_PACKAGES}" \
    --aptopt='Acquire::Retries "3"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "${DEBIAN_RELEASE}" "${work}/rootfs.tar" >&2
  ctr="$(buildah from --quiet scratch)"
  buildah add --quiet "${ctr}" "${work}/rootfs.tar" / >/dev/null
  # What python:slim sets: a UTF-8 locale; Debian's python3 is on the default PATH.
  buildah config --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd '["python3"]' \
    --label "org.opencontainers.image.description=Debian ${DEBIAN_RELEASE} with Debian's python3" \
    "${ctr}"
  buildah commit --quiet --rm "${ctr}" "$(ref_of base)" >/dev/null
  rm -rf "${work}"
}

build_uv() {
  local work ctr
  work="$(mktemp -d "${image_dir}/.uv.XXXXXX")"
  log "uv: wheel uv==${UV_VERSION} from PyPI"
  [[ -n "${uv_bin}" ]] || die "uv is required to fetch the uv wheel (set UV or put uv on PATH)"
  "${uv_bin}" pip install --quiet --no-deps --target "${work}/t" \
    --python-platform x86_64-manylinux_2_17 --python-version "${PYTHON_VERSION}" \
    "uv==${UV_VERSION}" >&2
  [[ -x "${work}/t/bin/uv" ]] || die "the uv wheel holds no bin/uv"
  ctr="$(buildah from --quiet scratch)"
  buildah copy --quiet --chmod 0755 "${ctr}" "${work}/t/bin/uv" /uv >/dev/null
  buildah copy --quiet --chmod 0755 "${ctr}" "${work}/t/bin/uvx" /uvx >/dev/null
  buildah config --entrypoint '["/uv"]' "${ctr}"
  buildah commit --quiet --rm "${ctr}" "$(ref_of uv)" >/dev/null
  rm -rf "${work}"
}

build_pause() {
  local work ctr go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  work="$(mktemp -d "${image_dir}/.pause.XXXXXX")"
  log "pause: static Go binary"
  (cd "${here}/pause" && CGO_ENABLED=0 "${go}" build -trimpath -ldflags '-s -w' \
    -o "${work}/pause" ./main.go) >&2
  ctr="$(buildah from --quiet scratch)"
  buildah copy --quiet --chmod 0755 "${ctr}" "${work}/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "${ctr}"
  buildah commit --quiet --rm "${ctr}" "$(ref_of pause)" >/dev/null
  rm -rf "${work}"
}

build_target() {
  local target="$1" uv_cache
  ensure_in_storage base || build_one base >/dev/null
  ensure_in_storage uv || build_one uv >/dev/null
  uv_cache="${UV_CACHE_DIR:-$("${uv_bin:-uv}" cache dir 2>/dev/null || echo "${HOME}/.cache/uv")}"
  mkdir -p "${uv_cache}"
  # The RUN steps trust what this machine trusts (a TLS-intercepting egress proxy's CA,
  # for one): the machine's CA bundle and a uv.toml that makes uv read it are mounted
  # for the build only; neither ends up in an image.
  local ca_bundle="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" uv_toml
  uv_toml="${image_dir}/.uv-system-certs.toml"
  printf 'system-certs = true\n' >"${uv_toml}"
  log "${target}: buildah bud --target ${target} (uv cache ${uv_cache})"
  local before
  before="$(buildah containers -q | sort)"
  # buildah 1.28 leaves a working container behind for a stage used only by COPY --from;
  # remove what this build left, and the untagged stage images (several GB for runtime).
  local rc=0
  buildah bud --quiet --layers --pull=never --isolation=chroot \
    --target "${target}" \
    --build-arg "PYTHON_IMAGE=$(ref_of base)" \
    --build-arg "UV_IMAGE=$(ref_of uv)" \
    --build-arg UV_NO_CACHE=0 \
    --volume "${uv_cache}:/root/.cache/uv" \
    --volume "${ca_bundle}:/etc/ssl/certs/ca-certificates.crt:ro" \
    --volume "${uv_toml}:/etc/uv/uv.toml:ro" \
    --tag "$(ref_of "${target}")" \
    --file "${root}/Dockerfile" "${root}" >&2 || rc=$?
  cleanup_build "${before//$'\n'/ }"
  return "${rc}"
}

cleanup_build() {
  local before=" $1 " c
  for c in $(buildah containers -q); do
    [[ "${before}" == *" ${c} "* ]] || buildah rm "${c}" >/dev/null 2>&1 || true
  done
  [[ "${RTJ_IMAGES_KEEP_LAYERS:-0}" == 1 ]] || buildah rmi --prune >/dev/null 2>&1 || true
}

build_one() {
  # The key is taken before the build: an input edited while it runs makes the next run
  # build again instead of filing the old result under the new key.
  local name="$1" start=${SECONDS} out
  out="$(archive_of "${name}")"
  if [[ -f "${out}" ]]; then
    echo "${out}"
    return 0
  fi
  case "${name}" in
    base) build_base ;;
    uv) build_uv ;;
    pause) build_pause ;;
    operator|runtime) build_target "${name}" ;;
  esac
  export_archive "${name}" "${out}"
  # The archive is the cache; the copy in buildah's storage only takes disk (6 GB for runtime).
  if [[ "${name}" == operator || "${name}" == runtime ]] && [[ "${RTJ_IMAGES_KEEP_LAYERS:-0}" != 1 ]]; then
    buildah rmi "$(ref_of "${name}")" >/dev/null 2>&1 || true
  fi
  # Older archives of this image (other inputs) go: the runtime's is 6 GB, and every edit of
  # the build context makes a new one.
  find "${image_dir}" -maxdepth 1 -name "${name}-*.tar" ! -path "${out}" -delete
  log "${name}: $(ref_of "${name}") in $((SECONDS - start))s -> ${out}"
  echo "${out}"
}

main() {
  case "${1:-all}" in
    --path) key_of "${2:?--path NAME}" >/dev/null; archive_of "$2"; return ;;
    --ref) key_of "${2:?--ref NAME}" >/dev/null; ref_of "$2"; return ;;
    --context-files) context_files; return ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; return ;;
  esac
  [[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap and buildah write as root)"
  local names=("$@") name
  [[ ${#names[@]} -eq 0 || "${names[0]}" == all ]] && names=(base uv pause operator runtime)
  mkdir -p "${image_dir}"
  for name in "${names[@]}"; do
    key_of "${name}" >/dev/null
    build_one "${name}"
  done
}

main "$@"
