#!/usr/bin/env bash
# Build a pinned MinIO server from source through the Go module proxy, once, into the user's
# cache (never into the repo). The objectstore tests and the benchmark prefer this binary over
# moto's in-memory server: it persists to disk (so killing and restarting it keeps the data),
# enforces real SigV4 auth, and is a more faithful S3.
#
# Usage: hack/s3/build-minio.sh            # builds if needed, prints the binary path on stdout
#        hack/s3/build-minio.sh --path     # prints the path only (exit 1 if not built yet)
# Env:   RTJ_MINIO_VERSION  module version to build (default: pinned below)
#        RTJ_BUILD_NICE=1   build at the lowest CPU priority with one package at a time
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# MinIO publishes no semver tags on the module proxy; the pin (a pseudo-version: commit date +
# hash) lives in MINIO_VERSION, which tools/s3server.py reads too.
version="${RTJ_MINIO_VERSION:-$(tr -d '[:space:]' < "${here}/MINIO_VERSION")}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rtj/bin/minio-${version}"
bin="${cache}/minio"

if [[ -x "${bin}" ]]; then
  echo "${bin}"
  exit 0
fi
if [[ "${1:-}" == "--path" ]]; then
  echo "${bin}"
  exit 1
fi

command -v go >/dev/null || { echo "build-minio: go is not installed" >&2; exit 1; }
mkdir -p "${cache}"
tmp="$(mktemp -d "${cache}/.build.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

prefix=()
if [[ "${RTJ_BUILD_NICE:-0}" == "1" ]]; then
  prefix=(nice -n 19)
  export GOFLAGS="${GOFLAGS:-} -p=1"
fi

echo "build-minio: building github.com/minio/minio@${version} (slow the first time)" >&2
# go install with an explicit version ignores any go.mod in the working directory.
GOBIN="${tmp}" CGO_ENABLED=0 "${prefix[@]}" go install "github.com/minio/minio@${version}" >&2
mv "${tmp}/minio" "${bin}"
echo "${bin}"
