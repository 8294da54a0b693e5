#!/usr/bin/env bash
# The GPU check, run from the repo root on the GPU machine: the tests marked gpu, then
# the benchmarks, then a short table of what ran and the benchmarks' own tables. Logs,
# JSON records and PNGs go to $OUT (default /tmp/gpu-run); $OUT/progress.txt says which
# part runs, so a long run can be started detached (setsid bash benchmarks/gpu_run.sh &)
# and polled. Bring it all back in one file: tar czf /tmp/gpu-run.tgz -C "$OUT" .
#
# PART lists the parts, run in order (default "tests reference"):
#   tests      pytest -m gpu tests/test_gpu.py (about 2 minutes)
#   reference  gpu_reference.py: MPO·MPS at chi=$CHI (default 1000), GPU against CPU
#   mpo        bench_mpo_mps.py: chi 200 500 1000 with every method, then chi 2000 merged
#              into the same record (the slow methods run once there); about 12 minutes
#   mpo1000    bench_mpo_mps.py at chi=1000 only, quimb src against src_dask (1 minute)
#   overhead   bench_overhead.py: what a call costs besides its GEMMs (about 1 minute)
#   stack1     bench_stack.py on 1 GPU: D_M=1000/chi_out=500 (defaults, then the inputs
#              read in each pass), D_M=2000/chi_out=1000 (spills; too large for quimb),
#              then stackq; ~60 GB of disk for the inputs (use nvidia-h200-x2)
#   stackq     bench_stack.py D_M=1000/chi_out=500 on 1 GPU with quimb's src in the same run
#   stack2     tools/bench_transfer.py (LINK="tcp async" skips it), then both stack sizes on 2
#              GPUs over the fastest link; needs the UCX wheels and stack1's inputs
#   kernels    profile_kernels.py: one site's kernels against their FLOP floor
#   x2         the two-GPU comparison (nvidia-h200-x2), most telling first:
#              bench_transfer.py at 1 GiB while both GPUs compute, with Dask's UCX comm
#              waiting for the whole device and for the default stream
#              (transfer_gpu_busy.json); bench_stack.py D_M=1000/chi_out=500 on 1 and 2 GPU
#              workers (UCX, RMM pool) and src-method on $SRCM_DEVICES GPUs (default 2) in
#              one run (stack_gpu_dm1000_x2.json); D_M=2000/chi_out=1000 on 2 workers and
#              src-method, then 1 worker merged into the same record
#              (stack_gpu_dm2000_x2.json); then D_M=1000 on 2 workers again with Dask's UCX
#              comm waiting for the whole device (src_dask config ucx-sync=device;
#              stack_gpu_dm1000_x2_devicesync.json); part slurm into the first record;
#              bench_transfer.py over UCX with an RMM pool, 1 and 4 GiB blocks, warm-up
#              (IPC mapping) apart (transfer_gpu.json), and TCP at 1 GiB for contrast
#              (transfer_gpu_tcp.json). SRCM_DM2000="" skips src-method at D_M=2000 (its
#              time of 2026-12-01 stands). Each stack run is limited to $X2_TIMEOUT s
#              (default 900); ~65 GB of disk for the inputs; about 20 min. Every run's
#              transfers and task timeline go to $OUT/x2_dm1000* and x2_dm2000, and
#              timeline.py's tables to timeline.log
#   slurm      the D_M=1000 stack on 2 GPUs with workers started as under Slurm:
#              examples/slurm/two_nodes_local.sh (scheduler file, one `dask cuda worker`
#              per GPU, UCX with RMM pools) runs bench_stack.py --scheduler-file, whose
#              run w2_memory_schedfile joins stack_gpu_dm1000_x2.json (after x2; on a
#              one-GPU machine the two workers share it); ~3 min
#   standin    two workers sharing one GPU (the one-H200 machine), started as under Slurm
#              with half of its memory each, over UCX: bench_transfer.py at 1 GiB while
#              both compute, then the D_M=1000 stack, each with Dask's UCX comm waiting
#              for the default stream (src_dask's run) and for the whole device (config
#              ucx-sync=device); transfer_standin_<sync>.json, stack_gpu_dm1000_standin_
#              <sync>.json, timelines in standin_<sync>/; ~4 min with the inputs' writing
#   xfer       what holds the transfers up inside a run (nvidia-h200-x2): bench_stack.py
#              D_M=1000/chi_out=500 on 1 and 2 GPU workers (UCX, RMM pool), every transfer
#              and the event loops' stalls (stack_gpu_dm1000_xfer.json, its `transfers`
#              field and table; each transfer in transfers_w2_memory.json); ~2 min
# mpo, mpo1000, stackq and stack1 need quimb, x2, slurm and xfer the UCX wheels, x2 src-method.
# Wheels: bash benchmarks/gpu_wheels.sh --ucx --quimb (x2: --ucx --src-method), carried
# in .whl/ (installed by .whl/install.sh when present).
# Extra options: PYTEST_ARGS, MPO_ARGS, STACK_ARGS (STACK_TIMEOUT: seconds per stack run
# of the other parts, default 420).
set -uo pipefail
parts="tests reference mpo mpo1000 overhead stack1 stackq stack2 kernels x2 slurm standin xfer"
for part in ${PART:-tests reference}; do
    case " $parts " in
    *" $part "*) ;;
    *) echo "PART entries must be among: $parts" >&2; exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
[ -f .whl/install.sh ] && bash .whl/install.sh >"$OUT/install.log" 2>&1
# benchmarks/ on the path: the scripts in benchmarks/tools import its shared modules
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/benchmarks
# the commands the Slurm example calls (`python`, `dask`), where the machine lacks them
mkdir -p "$OUT/bin"
# (scripts, not links: a link to a virtualenv's python runs outside the virtualenv)
command -v python >/dev/null || printf '#!/bin/sh\nexec python3 "$@"\n' >"$OUT/bin/python"
command -v dask >/dev/null || printf '#!/bin/sh\nexec python3 -m dask "$@"\n' >"$OUT/bin/dask"
chmod +x "$OUT/bin/"* 2>/dev/null
export PATH=$PATH:$OUT/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
failed=0

step() { echo "$(date -u +%FT%TZ) $*" >>"$OUT/progress.txt"; }
# run NAME LOG COMMAND...: one step, its rc and seconds in progress.txt and summary.txt
run() {
    local name=$1 log=$2 start=$SECONDS rc
    shift 2
    step "$name"
    "$@" >>"$OUT/$log" 2>&1
    rc=$?
    step "$name rc=$rc"
    [ "$rc" = 0 ] || failed=1
    printf '%-16s %4s %8s  %s\n' "$name" "$rc" "$((SECONDS - start))" "$log" >>"$OUT/summary.txt"
}

part_tests() {  # on the first GPU; then, where there are two, the tests that need both
    run tests gpu_tests.log env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -v \
        -p no:cacheprovider tests/test_gpu.py ${PYTEST_ARGS:-}
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        run "tests 2 GPUs" gpu_tests.log env CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest -m gpu \
            -v -p no:cacheprovider tests/test_gpu.py -k "two_gpus or over_ucx" ${PYTEST_ARGS:-}
    fi
}

part_reference() {
    run reference gpu_reference.log python3 benchmarks/gpu_reference.py --chi "${CHI:-1000}" \
        --out "$OUT/gpu_reference_chi${CHI:-1000}.json"
}

part_mpo() {
    run "mpo 200-1000" bench_mpo_mps.log env CUDA_VISIBLE_DEVICES=0 python3 \
        benchmarks/bench_mpo_mps.py --chi 200 500 1000 --repeats 3 --budget-s 40 \
        --error-max-chi 500 --out "$OUT" ${MPO_ARGS:-}
    # chi=2000 merged into the same record: the slow methods (minutes a call) run once
    run "mpo 2000" bench_mpo_mps.log env CUDA_VISIBLE_DEVICES=0 python3 \
        benchmarks/bench_mpo_mps.py --chi 2000 --repeats 3 --budget-s 40 --error-max-chi 0 \
        --out "$OUT" --merge ${MPO_ARGS:-}
}

part_mpo1000() {
    run "mpo 1000" bench_mpo_mps.log env CUDA_VISIBLE_DEVICES=0 python3 \
        benchmarks/bench_mpo_mps.py --chi 1000 --repeats 3 --no-zipup --no-quimb-oversample \
        --no-oversample --error-max-chi 0 --out "$OUT" ${MPO_ARGS:-}
}

part_overhead() {
    run overhead bench_overhead.log env CUDA_VISIBLE_DEVICES=0 python3 \
        benchmarks/bench_overhead.py --out "$OUT/overhead_gpu.json"
}

part_kernels() {
    run kernels profile_kernels.log env CUDA_VISIBLE_DEVICES=0 python3 \
        benchmarks/tools/profile_kernels.py --out "$OUT/gpu_kernels.json"
}

stack() {  # stack NAME DM CHI_OUT [bench_stack options]: one configuration, one record
    local name=$1 dm=$2 chi=$3
    shift 3
    run "stack $name" "bench_stack_dm$dm.log" timeout "${STACK_TIMEOUT:-420}" \
        python3 benchmarks/bench_stack.py \
        --dm "$dm" --chi-out "$chi" --modes memory --quimb no --workdir "/tmp/sb$dm" \
        --out "$OUT/stack_gpu_$name.json" ${STACK_ARGS:-} "$@"
}

part_stackq() {  # quimb's src on the stack (CuPy arrays, in this process), then ours
    stack dm1000_quimb 1000 500 --workers 1 --quimb auto
}

part_stack1() {  # one GPU, src_dask's defaults (inputs kept when they fit) and variants
    stack dm1000 1000 500 --workers 1 --report "$OUT/report_dm1000.html"
    stack dm1000_reread 1000 500 --workers 1 --keep-inputs no
    stack dm2000 2000 1000 --workers 1 --no-compare
    part_stackq
}

part_stack2() {  # two GPUs over the fastest link (inputs from stack1 reused)
    if [ -z "${LINK:-}" ]; then
        run transfer bench_transfer.log timeout 180 python3 benchmarks/tools/bench_transfer.py \
            --protocol tcp ucx --rmm async pool --out "$OUT"
        LINK=$(python3 benchmarks/tools/bench_transfer.py --best "$OUT/transfer_gpu.json")
    fi
    local proto rmm
    read -r proto rmm <<<"${LINK:-tcp async}"
    step "2-GPU runs: $proto, RMM $rmm"
    stack dm1000_w2 1000 500 --workers 2 --protocol "$proto" --rmm "$rmm"
    stack dm2000_w2 2000 1000 --workers 2 --protocol "$proto" --rmm "$rmm" --no-compare
}

timelines() {  # timelines DIR: pass 2's sites of every run whose tasks DIR holds
    local f
    for f in "$1"/tasks_*.json; do
        [ -f "$f" ] && run "timeline $(basename "$f" .json)" timeline.log \
            python3 benchmarks/tools/timeline.py "$f" --sites 5
    done
}

part_x2() {  # two GPUs: ours on 1 and 2 workers against src-method, then the link
    local STACK_TIMEOUT=${X2_TIMEOUT:-900} link=(--protocol ucx --rmm pool)
    # 1 GiB while both GPUs compute, with the UCX comm's two waits (half a minute)
    run "transfer busy" bench_transfer.log timeout 300 python3 benchmarks/tools/bench_transfer.py \
        --protocol ucx --rmm pool --gib 1 --busy 1 --ucx-sync device stream \
        --out "$OUT/transfer_gpu_busy.json"
    # shellcheck disable=SC2086  # SRCM_DEVICES may list several counts
    stack dm1000_x2 1000 500 --workers 1 2 "${link[@]}" --src-method-devices ${SRCM_DEVICES:-2} \
        --transfer-detail "$OUT/x2_dm1000"
    timelines "$OUT/x2_dm1000"
    # SRCM_DM2000="" leaves src-method out here (3.5 minutes with reading its inputs)
    local srcm2000=${SRCM_DM2000-${SRCM_DEVICES:-2}}
    # shellcheck disable=SC2086
    stack dm2000_x2 2000 1000 --workers 2 "${link[@]}" --no-compare \
        ${srcm2000:+--src-method-devices $srcm2000} --transfer-detail "$OUT/x2_dm2000"
    timelines "$OUT/x2_dm2000"
    # one GPU with src_dask.cluster(gpus=1)'s own allocator (RMM's async): with a classic
    # pool capped at 0.9 of the device, pass 2 ran out of it at site 46 (2026-12-01)
    stack dm2000_x2 2000 1000 --workers 1 --no-compare --merge \
        --transfer-detail "$OUT/x2_dm2000"
    # the same two GPUs with Dask's UCX comm waiting for the whole device before every
    # send and after every receive (its own way; src_dask's config ucx-sync)
    DASK_SRC_DASK__UCX_SYNC=device stack dm1000_x2_devicesync 1000 500 --workers 2 \
        "${link[@]}" --no-compare --transfer-detail "$OUT/x2_dm1000_devicesync"
    timelines "$OUT/x2_dm1000_devicesync"
    part_slurm   # the same 2-GPU run, workers started as under Slurm, into the same record
    run "transfer ucx" bench_transfer.log timeout 300 python3 benchmarks/tools/bench_transfer.py \
        --protocol ucx --rmm pool --gib 1 4 --out "$OUT/transfer_gpu.json"
    run "transfer tcp" bench_transfer.log timeout 180 python3 benchmarks/tools/bench_transfer.py \
        --protocol tcp --rmm pool --gib 1 --repeats 2 --out "$OUT/transfer_gpu_tcp.json"
}

part_slurm() {  # the two-GPU run with workers started as under Slurm
    # examples/slurm/two_nodes_local.sh starts a scheduler and one `dask cuda worker`
    # per GPU from a scheduler file, bench_stack.py --scheduler-file times the D_M=1000
    # stack on them (run w2_memory_schedfile, merged into x2's record). On a one-GPU
    # machine both workers share it, each with half of its memory limits.
    local gpus="0 1" share=()
    if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then
        gpus="0 0"
        share=(DEVICE_MEMORY_LIMIT=0.35 RMM_POOL_SIZE=0.35 RMM_MAXIMUM_POOL_SIZE=0.45)
    fi
    # the workers run the benchmark's own functions too (spill counters, CPU time):
    # benchmarks/ is on the PYTHONPATH they inherit
    run "slurm dm1000" bench_stack_slurm.log env GPUS="$gpus" ${share[@]+"${share[@]}"} \
        PROTOCOL=ucx COMMAND="timeout ${X2_TIMEOUT:-900} python3 benchmarks/bench_stack.py \
            --dm 1000 --chi-out 500 --modes memory --quimb no --workdir /tmp/sb1000 \
            --workers 2 --scheduler-file \"\$SCHEDULER_FILE\" --merge \
            --out $OUT/stack_gpu_dm1000_x2.json --transfer-detail $OUT/slurm_dm1000" \
        bash examples/slurm/two_nodes_local.sh "$OUT/slurm"
    timelines "$OUT/slurm_dm1000"
}

part_standin() {  # two workers on one GPU: the UCX comm's two waits, link and stack
    local sync
    for sync in stream device; do
        # shellcheck disable=SC2016  # $SCHEDULER_FILE is the example's, set for COMMAND
        run "standin $sync" bench_stack_standin.log env GPUS="0 0" DEVICE_MEMORY_LIMIT=0.35 \
            RMM_POOL_SIZE=0.35 RMM_MAXIMUM_POOL_SIZE=0.45 DASK_SRC_DASK__UCX_SYNC=$sync \
            PROTOCOL=ucx COMMAND="timeout 300 \
            python3 benchmarks/tools/bench_transfer.py --scheduler-file \"\$SCHEDULER_FILE\" \
                --gib 1 --busy 1 --ucx-sync $sync --out $OUT/transfer_standin_$sync.json; \
            timeout ${X2_TIMEOUT:-900} python3 benchmarks/bench_stack.py --dm 1000 \
                --chi-out 500 --modes memory --quimb no --workdir /tmp/sb1000 --workers 2 \
                --scheduler-file \"\$SCHEDULER_FILE\" --no-compare \
                --out $OUT/stack_gpu_dm1000_standin_$sync.json \
                --transfer-detail $OUT/standin_$sync" \
            bash examples/slurm/two_nodes_local.sh "$OUT/standin"
        timelines "$OUT/standin_$sync"
    done
}

part_xfer() {  # two GPUs: every transfer of the 2-worker run, and the event loops
    local STACK_TIMEOUT=${X2_TIMEOUT:-900}
    stack dm1000_xfer 1000 500 --workers 1 2 --protocol ucx --rmm pool --transfer-detail "$OUT"
    timelines "$OUT"
}

for part in ${PART:-tests reference}; do
    "part_$part"
done
step done

echo "== $(date -u +%FT%TZ) on $(cat "$OUT/device.txt")"
printf '%-16s %4s %8s  %s\n' part rc seconds log
cat "$OUT/summary.txt"
[ -f "$OUT/gpu_tests.log" ] && grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15
for log in gpu_reference bench_mpo_mps bench_overhead bench_stack_dm1000 bench_stack_dm2000 bench_stack_slurm \
    bench_transfer profile_kernels timeline; do
    [ -f "$OUT/$log.log" ] && { echo "== $log"; tail -20 "$OUT/$log.log"; }
done
exit $failed
