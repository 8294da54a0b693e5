#!/usr/bin/env bash
# Issue 5's benchmark set on the GPU machine (run from the repo root). Meant to be
# started detached (setsid ... &) by one device command and followed by the next ones:
# $OUT/progress.txt says which step runs; logs, JSON and PNG go to $OUT.
#
#   PART=mpo    pytest -m gpu, then bench_mpo_mps.py: chi 200 500 1000 with every method,
#               chi 2000 with quimb src and ours (quimb's zipup and src-oversample and our
#               oversampled run take minutes each there). Wheels: device-wheels --quimb.
#   PART=stack  bench_transfer.py (GPU to GPU over tcp and ucx), bench_stack.py: D_M=1000,
#               chi_out=500 on 1 and 2 GPUs (the faster protocol between them), then
#               D_M=2000, chi_out=1000 on one GPU, spilling to host memory; pytest -m gpu.
#               Wheels: device-wheels --ucx. Needs ~60 GB of disk for the D_M=2000 inputs.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/issue5}
mkdir -p "$OUT"
[ -f .whl/install.sh ] && bash .whl/install.sh >"$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
step() { echo "$(date -u +%FT%TZ) $*" >>"$OUT/progress.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
case ${PART:-mpo} in
mpo)
    step tests
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -p no:cacheprovider tests/test_gpu.py \
        >"$OUT/gpu_tests.log" 2>&1
    step "tests: $(tail -1 "$OUT/gpu_tests.log")"
    export CUDA_VISIBLE_DEVICES=0
    python3 benchmarks/bench_mpo_mps.py --chi 200 500 1000 --repeats 3 --budget-s 40 \
        --error-max-chi 500 --out "$OUT" >"$OUT/bench_mpo_mps.log" 2>&1
    step "mpo_mps 200-1000 rc=$?"
    python3 benchmarks/bench_mpo_mps.py --chi 2000 --repeats 3 --no-zipup --no-quimb-oversample \
        --no-oversample --error-max-chi 0 --out "$OUT" --merge >>"$OUT/bench_mpo_mps.log" 2>&1
    step "mpo_mps 2000 rc=$?"
    ;;
stack)
    step transfer
    timeout 180 python3 benchmarks/bench_transfer.py --protocol tcp ucx --rmm async pool --out "$OUT" >"$OUT/bench_transfer.log" 2>&1
    # the faster protocol between the two GPUs serves the 2-worker run
    read -r proto rmm < <(python3 -c "import json,sys; r=[x for x in json.load(open(sys.argv[1]))['runs'] if 'best_GBps' in x]; b=max(r, key=lambda x: x['best_GBps']) if r else {'protocol': 'tcp', 'rmm': 'async'}; print(b['protocol'], b.get('rmm', 'async'))" "$OUT/transfer_gpu.json")
    step "stack dm1000 w1 (2 workers: $proto, rmm $rmm)"
    python3 benchmarks/bench_stack.py --dm 1000 --chi-out 500 --workers 1 --modes memory \
        --quimb no --protocol ucx --workdir /tmp/sb1000 --out "$OUT/stack_gpu_dm1000.json" \
        >"$OUT/bench_stack_dm1000.log" 2>&1
    step "stack dm1000 w1 rc=$?"
    timeout 240 python3 benchmarks/bench_stack.py --dm 1000 --chi-out 500 --workers 2 \
        --modes memory --quimb no --protocol "$proto" --rmm "$rmm" --workdir /tmp/sb1000 \
        --out "$OUT/stack_gpu_dm1000_w2.json" >>"$OUT/bench_stack_dm1000.log" 2>&1
    step "stack dm1000 w2 rc=$?"
    rm -rf /tmp/sb1000
    python3 benchmarks/bench_stack.py --dm 2000 --chi-out 1000 --workers 1 --modes memory \
        --quimb no --no-compare --device-memory-limit 0.5 --workdir /tmp/sb2000 --out "$OUT" \
        >"$OUT/bench_stack_dm2000.log" 2>&1
    step "stack dm2000 rc=$?"
    rm -rf /tmp/sb2000
    step tests
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -p no:cacheprovider tests/test_gpu.py \
        >"$OUT/gpu_tests.log" 2>&1
    step "tests: $(tail -1 "$OUT/gpu_tests.log")"
    ;;
esac
step done
