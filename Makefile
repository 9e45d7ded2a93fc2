# One entry point per thing a person wants to do. Every target installs what it needs first.
UV ?= uv
RUN := $(UV) run --frozen --all-extras

.PHONY: setup tools test test-fast lint format crds demo bench clean

setup:  ## create .venv from uv.lock with both halves and the test tools
	@command -v $(UV) >/dev/null || { echo "uv is required: python3 -m pip install uv" >&2; exit 1; }
	$(UV) sync --frozen --all-extras

tools:  ## build once, then reuse from ~/.cache/rtj: control plane, kwok, helm, MinIO
	hack/cluster/build.sh
	hack/s3/build-minio.sh

test: setup tools  ## the whole suite: unit, multi-process, object store, local cluster
	$(RUN) python -m pytest

test-fast: setup  ## pure unit and single-process tests only
	$(RUN) python -m pytest tests/unit

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: setup
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

demo: setup  ## a training run that is killed and resumes by itself
	$(RUN) python examples/demo_local.py

bench: setup
	$(RUN) python benchmarks/checkpoint.py --json out/bench-checkpoint.json

clean:
	rm -rf .venv out .pytest_cache .ruff_cache
