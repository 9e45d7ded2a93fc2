# One entry point per thing a person wants to do. Every target installs what it needs first.
# uv runs everything; hack/bootstrap-uv.sh installs a private copy when the machine has none.
UV ?= $(shell hack/bootstrap-uv.sh)
# The scripts make runs (hack/images/build.sh) use it too, also when uv is not on PATH.
export UV
RUN := $(UV) run --frozen --all-extras

.PHONY: setup tools kueue images realnode-images test test-fast test-realnodes test-gpu lint format crds demo demo-local bench clean

setup:  ## create .venv from uv.lock with both halves and the test tools
	@test -n "$(UV)" || { echo "uv is required and could not be installed (see above)" >&2; exit 1; }
	$(UV) sync --frozen --all-extras

tools:  ## build once, then reuse from ~/.cache/rtj: control plane, kwok, helm, MinIO, Kueue
	hack/cluster/build.sh
	hack/s3/build-minio.sh
	$(MAKE) --no-print-directory kueue

kueue:  ## Kueue's controller and manifests (hack/kueue), built once per version, for tests/cluster/test_kueue.py
	hack/kueue/build.sh

# The Go builds are CPU-bound, the image builds mostly disk-bound: side by side, a cold machine
# is ready sooner than with one after the other.
test: setup  ## the whole suite: unit, multi-process, object store, local cluster, real nodes
	$(MAKE) --no-print-directory -j2 tools realnode-images
	$(RUN) python -m pytest

# The real-node tests need root; without it they are skipped (CI=true fails them instead).
realnode-images:
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory images; \
	else echo "[test] not root: the real-node tests (tests/realnodes) will be skipped" >&2; fi

images: setup  ## the operator and runtime images, built by buildah without a registry (root)
	hack/images/deps.sh
	hack/images/build.sh pause operator runtime
	hack/cluster/build-coredns.sh

test-realnodes: setup tools images  ## only the real-node suite: real kubelets + containerd run the images (root)
	$(RUN) python -m pytest tests/realnodes

test-gpu: setup  ## on a machine with a CUDA GPU: GPU suite, runtime suites, engines benchmark and staging stall on the GPU
	PYTHON=.venv/bin/python hack/gpu-check.sh out/gpu-check

test-fast: setup  ## pure unit and single-process tests only
	$(RUN) python -m pytest tests/unit

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: setup
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

SCENARIO ?= reclaim
NODES ?= simulated
demo: setup tools  ## local cluster + operator: a node is lost, the job resumes (SCENARIO=reclaim|notice|elastic|kueue, NODES=simulated|real)
	@if [ "$(NODES)" = real ]; then $(MAKE) --no-print-directory images; fi
	$(RUN) python examples/demo_cluster.py --scenario $(SCENARIO) --nodes $(NODES)

demo-local: setup  ## no cluster: a 2-rank run is SIGTERMed and SIGKILLed and still ends bitwise equal
	$(RUN) python examples/demo_local.py

crds: setup  ## regenerate the CRDs, RBAC and reference page from the pydantic models, and the chart's copies
	$(RUN) python -m rtj_operator.api.crdgen
	$(RUN) python -m tests.delivery.chart_sync

bench: setup  ## checkpoint benchmarks of record, 1 GiB state (as root, on a quiet machine)
	$(RUN) python benchmarks/checkpoint.py --json out/bench-checkpoint.json
	$(RUN) python benchmarks/checkpoint_engines.py --json out/bench-checkpoint-engines.json

clean:
	rm -rf .venv out .pytest_cache .ruff_cache
