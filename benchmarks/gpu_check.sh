#!/usr/bin/env bash
# The whole GPU check, run from the repo root on the GPU machine (../shared/GPU.md):
# tests marked gpu, the reference problem on the GPU against the CPU, then (optional)
# the issue-5 benchmarks. Full logs and JSON go to $OUT (default /tmp/gpu-check);
# a short summary is printed last.
#
#   TESTS=0          skip pytest -m gpu            REFERENCE=0   skip gpu_reference.py
#   BENCH=1          run bench_mpo_mps.py and bench_stack.py (quimb needed: device-wheels --quimb)
#   BENCH_MPO_MPS=1 / BENCH_STACK=1                run only one of them
#   MPO_MPS_ARGS=... / STACK_ARGS=...              extra options, e.g. "--chi 2000 --repeats 1"
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
[ -f .whl/install.sh ] && bash .whl/install.sh >"$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
tests_rc=0
if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py ${PYTEST_ARGS:-} \
        >"$OUT/gpu_tests.log" 2>&1
    tests_rc=$?
fi
if [ "${REFERENCE:-1}" = 1 ]; then
    python3 benchmarks/gpu_reference.py --chi "${CHI:-1000}" --out "$OUT/gpu_reference.json" \
        >"$OUT/gpu_reference.log" 2>&1
fi
if [ "${BENCH:-0}" = 1 ] || [ "${BENCH_MPO_MPS:-0}" = 1 ]; then
    python3 benchmarks/bench_mpo_mps.py --out "$OUT" ${MPO_MPS_ARGS:-} \
        >"$OUT/bench_mpo_mps.log" 2>&1
fi
if [ "${BENCH:-0}" = 1 ] || [ "${BENCH_STACK:-0}" = 1 ]; then
    python3 benchmarks/bench_stack.py --out "$OUT" ${STACK_ARGS:-} \
        >"$OUT/bench_stack.log" 2>&1
fi
echo "== $(date -u +%FT%TZ) on $(cat "$OUT/device.txt")"
[ -f "$OUT/gpu_tests.log" ] && grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15
[ -f "$OUT/gpu_reference.log" ] && tail -12 "$OUT/gpu_reference.log"
for log in bench_mpo_mps bench_stack; do
    [ -f "$OUT/$log.log" ] && { echo "== $log"; tail -25 "$OUT/$log.log"; }
done
exit $tests_rc
