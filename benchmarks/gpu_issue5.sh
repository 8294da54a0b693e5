#!/usr/bin/env bash
# Issue 5's benchmark set on the GPU machine (run from the repo root). Meant to be
# started detached (setsid ... &) by one device command and followed by the next ones:
# $OUT/progress.txt says which step runs; logs, JSON and PNG go to $OUT.
#
#   PART=mpo    pytest -m gpu, then bench_mpo_mps.py: chi 200 500 1000 with every method,
#               chi 2000 with quimb src and ours (quimb's zipup and src-oversample and our
#               oversampled run take minutes each there). Wheels: device-wheels --quimb.
#   PART=stack  bench_transfer.py (GPU to GPU: tcp/ucx x RMM async/pool), bench_stack.py:
#               D_M=1000, chi_out=500 on 1 GPU (plain, 8 threads, inputs kept for pass 2)
#               and 2 GPUs (the fastest link), then D_M=2000, chi_out=1000 on 1 GPU
#               (spilling to host memory) and 2 GPUs; pytest -m gpu. About 15 minutes:
#               poll $OUT/progress.txt from the following device commands.
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
    timeout 180 python3 benchmarks/bench_transfer.py --protocol tcp ucx --rmm async pool \
        --out "$OUT" >"$OUT/bench_transfer.log" 2>&1
    # the fastest protocol and allocator between the two GPUs serve the 2-GPU runs
    read -r proto rmm < <(python3 benchmarks/bench_transfer.py --best "$OUT/transfer_gpu.json")
    two="--workers 2 --protocol $proto --rmm $rmm"
    stack() {  # stack NAME DM CHI_OUT [bench_stack options]: one configuration, one JSON
        local name=$1 dm=$2 chi=$3
        shift 3
        step "stack $name"
        timeout 420 python3 benchmarks/bench_stack.py --dm "$dm" --chi-out "$chi" --modes memory \
            --quimb no --workdir "/tmp/sb$dm" --out "$OUT/stack_gpu_$name.json" "$@" \
            >>"$OUT/bench_stack_dm$dm.log" 2>&1
        step "stack $name rc=$?"
    }
    stack dm1000 1000 500 --workers 1
    stack dm1000_threads8 1000 500 --workers 1 --threads-per-worker 8
    stack dm1000_keep 1000 500 --workers 1 --keep-inputs
    stack dm1000_w2 1000 500 $two
    rm -rf /tmp/sb1000
    stack dm2000 2000 1000 --workers 1 --no-compare --device-memory-limit 0.5
    stack dm2000_w2 2000 1000 $two --no-compare
    rm -rf /tmp/sb2000
    step tests
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -p no:cacheprovider tests/test_gpu.py \
        >"$OUT/gpu_tests.log" 2>&1
    step "tests: $(tail -1 "$OUT/gpu_tests.log")"
    ;;
esac
step done
