#!/usr/bin/env bash
# Issue 5's benchmark set on the GPU machine (run from the repo root). Meant to be
# started detached (setsid ... &) by one device command and followed by the next ones:
# $OUT/progress.txt says which step runs; logs, JSON and PNG go to $OUT.
#
#   PART=tests  pytest -m gpu (about 2 minutes).
#   PART=mpo    bench_mpo_mps.py: chi 200 500 1000 2000 with every method (at 2000
#               quimb's zipup and src-oversample and our oversampled run take minutes
#               each and run once); about 12 minutes. Needs quimb's wheels.
#   PART=mpo1000 the same at chi=1000 only, quimb src against ours (about 1 minute).
#   PART=overhead bench_overhead.py: a call's cost besides its GEMMs (about 1 minute).
#   PART=stack1 bench_stack.py on 1 GPU: D_M=1000, chi_out=500 (src_dask's defaults, and
#               with the inputs read in each pass), D_M=2000, chi_out=1000 (spilling; too
#               large for quimb on one GPU), then D_M=1000 with quimb's src as the peer.
#               About 10 minutes (quimb's part not yet timed); ~60 GB of disk for the
#               inputs (use nvidia-h200-x2).
#   PART=stackq D_M=1000, chi_out=500 on 1 GPU with quimb's src as the peer, then ours
#               with defaults, in one process (one JSON with both and their ratio).
#   PART=stack2 bench_transfer.py (GPU to GPU: tcp/ucx x RMM async/pool; LINK="tcp async"
#               skips it), then the same two problems on 2 GPUs over the fastest link.
#               Needs the UCX wheels and the inputs stack1 wrote.
#   PART="tests stack1 mpo stack2" is the default. Wheels for all of it:
#               ../shared/tools/device-wheels --ucx --quimb (63 MiB: just fits a run).
# A device command brings everything back in one file (8 files at most come back):
#   tar czf "$OUT/issue5.tgz" -C /tmp/issue5 .
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/issue5}
mkdir -p "$OUT"
[ -f .whl/install.sh ] && bash .whl/install.sh >"$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
step() { echo "$(date -u +%FT%TZ) $*" >>"$OUT/progress.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"

part_tests() {
    step tests
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -p no:cacheprovider tests/test_gpu.py \
        >"$OUT/gpu_tests.log" 2>&1
    step "tests: $(tail -1 "$OUT/gpu_tests.log")"
}

part_mpo() {
    step "mpo_mps 200-1000"
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_mpo_mps.py --chi 200 500 1000 --repeats 3 \
        --budget-s 40 --error-max-chi 500 --out "$OUT" >"$OUT/bench_mpo_mps.log" 2>&1
    step "mpo_mps 200-1000 rc=$?"
    # every method at chi=2000 too: the slow ones (minutes a call) run once (--budget-s)
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_mpo_mps.py --chi 2000 --repeats 3 \
        --budget-s 40 --error-max-chi 0 --out "$OUT" --merge >>"$OUT/bench_mpo_mps.log" 2>&1
    step "mpo_mps 2000 rc=$?"
}

part_overhead() {  # per-call overhead: synchronous, threaded, a Client (about 1 minute)
    step overhead
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_overhead.py \
        --out "$OUT/overhead_gpu.json" >"$OUT/bench_overhead.log" 2>&1
    step "overhead rc=$?"
}

part_mpo1000() {  # chi=1000 only, against quimb src
    step "mpo_mps 1000"
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_mpo_mps.py --chi 1000 --repeats 3 --no-zipup \
        --no-quimb-oversample --no-oversample --error-max-chi 0 --out "$OUT" \
        >"$OUT/bench_mpo_mps.log" 2>&1
    step "mpo_mps 1000 rc=$?"
}

stack() {  # stack NAME DM CHI_OUT [bench_stack options]: one configuration, one JSON
    local name=$1 dm=$2 chi=$3
    shift 3
    step "stack $name"
    timeout 420 python3 benchmarks/bench_stack.py --dm "$dm" --chi-out "$chi" --modes memory \
        --quimb no --workdir "/tmp/sb$dm" --out "$OUT/stack_gpu_$name.json" "$@" \
        >>"$OUT/bench_stack_dm$dm.log" 2>&1
    step "stack $name rc=$?"
}

link() {  # the fastest protocol and RMM allocator between the two GPUs (LINK="tcp async" skips)
    if [ -z "${LINK:-}" ]; then
        step transfer
        timeout 180 python3 benchmarks/bench_transfer.py --protocol tcp ucx --rmm async pool \
            --out "$OUT" >"$OUT/bench_transfer.log" 2>&1
        LINK=$(python3 benchmarks/bench_transfer.py --best "$OUT/transfer_gpu.json")
    fi
    read -r proto rmm <<<"${LINK:-tcp async}"
    step "2-GPU runs: $proto, RMM $rmm"
}

part_stack1() {  # one GPU: the targets, with src_dask's defaults (inputs kept when they fit)
    stack dm1000 1000 500 --workers 1 --report "$OUT/report_dm1000.html"
    stack dm1000_reread 1000 500 --workers 1 --keep-inputs no
    stack dm2000 2000 1000 --workers 1 --no-compare --device-memory-limit 0.5
    part_stackq
}

part_stackq() {  # quimb's src on the same stack (CuPy arrays, in this process), then ours
    stack dm1000_quimb 1000 500 --workers 1 --quimb auto
}

part_stack2() {  # two GPUs on the same problems (inputs from part_stack1 reused)
    local proto rmm
    link
    stack dm1000_w2 1000 500 --workers 2 --protocol "$proto" --rmm "$rmm"
    stack dm2000_w2 2000 1000 --workers 2 --protocol "$proto" --rmm "$rmm" --no-compare
}

# PART is a list run in order, e.g. PART="tests stack1 mpo stack2" (the default)
for part in ${PART:-tests stack1 mpo stack2}; do
    case $part in
    tests | overhead | mpo | mpo1000 | stack1 | stackq | stack2) "part_$part" ;;
    *) echo "PART entries must be tests, overhead, mpo, mpo1000, stack1, stackq or stack2" >&2
       exit 2 ;;
    esac
done
step done
