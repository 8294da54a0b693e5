#!/usr/bin/env bash
# The whole GPU check, run from the repo root on the GPU machine (../shared/GPU.md):
# tests marked gpu, then the reference problem on the GPU against the CPU.
# Full logs go to $OUT (default /tmp/gpu-check); a short summary is printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
[ -f .whl/install.sh ] && bash .whl/install.sh >"$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py ${PYTEST_ARGS:-} \
    >"$OUT/gpu_tests.log" 2>&1
tests_rc=$?
python3 benchmarks/gpu_reference.py --chi "${CHI:-1000}" --out "$OUT/gpu_reference.json" \
    >"$OUT/gpu_reference.log" 2>&1
echo "== $(date -u +%FT%TZ) on $(cat "$OUT/device.txt")"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15
tail -12 "$OUT/gpu_reference.log"
exit $tests_rc
