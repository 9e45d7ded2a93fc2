#!/usr/bin/env bash
# The runtime on a machine with a CUDA GPU, in one run: the GPU suite (tests/gpu), the runtime's
# own suites (tests/unit, tests/multiproc) in a process where CUDA is available, and the
# checkpoint-engines benchmark with the state on the GPU (then, if asked, on the CPUs), and the
# async-save stall of GPU state (benchmarks/gpu_staging_stall.py), and, if asked, where a GPU
# load's time goes (benchmarks/load_phases.py: the load against the same load with one reading
# thread instead of two and against the raw read).
#
#   hack/gpu-check.sh [OUT_DIR]        (default out/gpu-check)
#
# Uses $PYTHON (default python3; its path and its torch and xxhash versions are printed first),
# which needs torch, numpy, xxhash, pytest and pytest-timeout:
# the runtime's extra and the test tools, nothing of the operator's. pytest-xdist, when present,
# spreads the runtime suites over the cores. Each step has a time limit (seconds, environment
# variables below) so that one slow step cannot take the others' time; a limit of 0 skips the
# step. A step that fails or times out is reported and the next one still runs. The benchmarks
# run before the runtime suites, whose leftover load would disturb them. Exit status: 0 only if
# every step that ran passed. Every step's log and the benchmarks' JSON land in OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-out/gpu-check}
PYTHON=${PYTHON:-python3}
GPU_TESTS_S=${GPU_TESTS_S:-180}
RUNTIME_TESTS_S=${RUNTIME_TESTS_S:-240}
BENCH_GPU_S=${BENCH_GPU_S:-330}
BENCH_STALL_S=${BENCH_STALL_S:-120}
BENCH_CPU_S=${BENCH_CPU_S:-0}        # the CPU configurations: skipped unless asked
BENCH_PHASES_S=${BENCH_PHASES_S:-0}  # load_phases.py: skipped unless asked
BENCH_CPU_CONFIGS=${BENCH_CPU_CONFIGS:-single,fsdp4,ddp4}
BENCH_PHASES_CONTENDERS=${BENCH_PHASES_CONTENDERS:-load,load-1lane,read-64m}
BENCH_PHASES_ROUNDS=${BENCH_PHASES_ROUNDS:-6}
BENCH_SIZE_MIB=${BENCH_SIZE_MIB:-1024}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
failed=()

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to OUT_DIR/NAME.log
    local name=$1 limit=$2 start rc
    shift 2
    if [ "$limit" -le 0 ]; then
        echo "[gpu-check] $name: skipped (limit 0)"
        return
    fi
    start=$(date +%s)
    echo "[gpu-check] $name: $* (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    rc=$?
    echo "[gpu-check] $name: exit $rc after $(($(date +%s) - start))s"
    tail -n 15 "$OUT_DIR/$name.log"
    [ "$rc" = 0 ] || failed+=("$name(exit $rc)")
}

"$PYTHON" - <<'PY' || { echo "[gpu-check] no usable CUDA device: nothing to check" >&2; exit 2; }
import torch, sys, xxhash
print(f"[gpu-check] python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, "
      f"xxhash {xxhash.VERSION}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      f"{[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
sys.exit(0 if torch.cuda.is_available() else 1)
PY
nproc
parallel=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then
    parallel=(-n "$(( $(nproc) > 8 ? 8 : $(nproc) ))")
fi
# Not the runtime's: the real-node story's verdicts and the operator-rendered pods need the
# operator's packages.
not_runtime=(--ignore tests/unit/test_realnodes_story.py --ignore tests/multiproc/test_torchrun_pods.py)

step gpu-tests "$GPU_TESTS_S" "$PYTHON" -m pytest -p no:cacheprovider -q tests/gpu
step bench-gpu "$BENCH_GPU_S" "$PYTHON" benchmarks/checkpoint_engines.py --device cuda \
    --configs single --rounds 3 --size-mib "$BENCH_SIZE_MIB" \
    --json "$OUT_DIR/engines-gpu.json" --dir /tmp/rtj-bench-gpu
step bench-stall "$BENCH_STALL_S" "$PYTHON" benchmarks/gpu_staging_stall.py --rounds 7 \
    --size-mib "$BENCH_SIZE_MIB" --json "$OUT_DIR/staging-stall.json"
step bench-phases "$BENCH_PHASES_S" "$PYTHON" benchmarks/load_phases.py --device cuda \
    --contenders "$BENCH_PHASES_CONTENDERS" --rounds "$BENCH_PHASES_ROUNDS" \
    --size-mib "$BENCH_SIZE_MIB" --json "$OUT_DIR/load-phases.json" --dir /tmp/rtj-phases
step bench-cpu "$BENCH_CPU_S" "$PYTHON" benchmarks/checkpoint_engines.py \
    --configs "$BENCH_CPU_CONFIGS" --rounds 3 --size-mib "$BENCH_SIZE_MIB" \
    --json "$OUT_DIR/engines-cpu.json" --dir /tmp/rtj-bench-cpu
step runtime-tests "$RUNTIME_TESTS_S" "$PYTHON" -m pytest -p no:cacheprovider -q "${parallel[@]}" \
    tests/unit tests/multiproc "${not_runtime[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "[gpu-check] FAILED: ${failed[*]}"
    exit 1
fi
echo "[gpu-check] every step passed"
