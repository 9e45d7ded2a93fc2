#!/usr/bin/env bash
# Start a local S3 server on 127.0.0.1 by hand (the test suite and the benchmark start their
# own). Prints the environment to export, then serves until Ctrl-C.
#
# Usage: hack/s3/run-server.sh [minio|moto|auto]   (default auto: MinIO if built, else moto)
#        hack/s3/build-minio.sh                     builds MinIO first (once, slow)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
exec "${PYTHON:-python3}" "${repo}/tools/s3server.py" serve "${1:-auto}"
