#!/usr/bin/env bash
# kiln-cuda on a real GPU, in one run of under 8 minutes (kiln-cuda's issue: "benchmarks/gpu/run.sh"):
#   1. kiln's conformance suite on device cuda (float32, float16, bfloat16, int64, bool),
#   2. kiln vs PyTorch's CUDA build, time ratios and achieved bandwidth (bench_gpu.py), kiln.compile's fused
#      kernels among them.
# Needs a machine with an NVIDIA driver, PyTorch with CUDA, numba-cuda and hatchling installed (nothing is
# downloaded). Results: $OUT/gpu.json (or benchmarks/results/gpu.json) and the logs beside it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
export KILN_CUDA_CACHE="${KILN_CUDA_CACHE:-/tmp/kiln-cuda-cache}" NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-/tmp/numba-cache}"
unset NUMBA_ENABLE_CUDASIM
python3 -m pip install -q --no-deps --no-build-isolation -e packages/kiln -e packages/kiln-testing -e packages/kiln-cuda \
    -e packages/kiln-nn -e packages/kiln-compile 2>&1 | tail -3
python3 -c "import kiln; print(kiln.cuda.get_device_name(), kiln.cuda.get_device_capability())" || exit 1
status=0
timeout 300 python3 -m pytest --import-mode=importlib -q -p no:cacheprovider --kiln-device=cuda \
    --kiln-dtypes=bool,int64,float16,bfloat16,float32 packages/kiln-testing/src/kiln_testing/conformance \
    > "$OUT/conformance.log" 2>&1 || status=1
tail -n 25 "$OUT/conformance.log"
timeout 200 python3 benchmarks/gpu/bench_gpu.py --out "$OUT/gpu.json" 2>&1 | tee "$OUT/bench.log" || status=1
exit $status
