#!/usr/bin/env bash
# Print a command that runs uv, installing uv first when the machine has none.
#
# Every make target needs uv (the lock file is uv's). A fresh machine often has only
# python3, and Debian's python3 refuses `pip install` into the system interpreter
# (PEP 668), so uv goes into a private virtual environment under the cache instead of
# the user's site-packages. Order: uv on PATH, then the cached private copy, then a new
# private copy (python3 -m venv), then pip --user as the last resort.
#
# Environment: RTJ_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/rtj).
set -euo pipefail

log() { printf '[uv] %s\n' "$*" >&2; }

if command -v uv >/dev/null 2>&1; then
  command -v uv
  exit 0
fi

cache_dir="${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/rtj}"
venv="${cache_dir}/uv-venv"
if [[ -x "${venv}/bin/uv" ]]; then
  echo "${venv}/bin/uv"
  exit 0
fi

command -v python3 >/dev/null 2>&1 || { log "FATAL: python3 is required (3.11 or newer)"; exit 1; }
log "uv not found; installing it into ${venv}"
mkdir -p "${cache_dir}"
if python3 -m venv "${venv}" >/dev/null 2>&1 && "${venv}/bin/python" -m pip install --quiet 'uv>=0.4' >&2; then
  echo "${venv}/bin/uv"
  exit 0
fi
rm -rf "${venv}"
log "python3 -m venv is unavailable (Debian: apt-get install python3-venv); trying pip --user"
if python3 -m pip install --quiet --user 'uv>=0.4' >&2 && python3 -m uv --version >/dev/null 2>&1; then
  echo "python3 -m uv"
  exit 0
fi
log "FATAL: cannot install uv: install it (https://docs.astral.sh/uv/) or python3-venv, then retry"
exit 1
