#!/usr/bin/env bash
# Two "nodes" on one machine with two GPUs: what src_dask.sbatch does across the
# nodes of a Slurm job, imitated with one `dask cuda worker` per GPU standing for
# a node. A `dask scheduler` writes a scheduler file, the workers find it there,
# `src-dask generate` writes an MPO and an MPS and `src-dask run --scheduler-file`
# compresses their product on those workers. Everything the script started is
# stopped when it ends, however it ends (Ctrl-C too).
#
#   bash examples/slurm/two_nodes_local.sh OUTDIR
#
# Run it where `dask`, `src-dask` and `python` are those of src_dask's environment
# (its virtualenv activated). OUTDIR gets the inputs (in/), the run store
# (run.zarr), the result (y.zarr), the scheduler file and the logs (logs/); the
# script replaces what it wrote there before.
#
# Protocol, as src_dask.cluster() and src_dask.sbatch: UCX with an RMM pool on each
# GPU when distributed_ucxx and rmm import, else TCP (with a warning). Settings, from
# the environment:
#   PROTOCOL               ucx or tcp (default: ucx when it can)
#   GPUS                   the device of each "node" (default "0 1")
#   SITES BOND CHI_OUT     the problem: MPO (bond 4) times MPS (bond BOND) on SITES
#                          sites, compressed to CHI_OUT (default 30, 256, 256)
#   DEVICE_MEMORY_LIMIT    spill to host past this (default 0.7 of the GPU)
#   RMM_POOL_SIZE          UCX: the pool each worker starts with (DEVICE_MEMORY_LIMIT)
#   RMM_MAXIMUM_POOL_SIZE  UCX: what it may grow to (default 0.9)
#   THREADS                threads per worker (default 4)
#   WORKER                 the worker command (default "dask cuda worker"); on a
#                          machine without GPUs "dask worker" checks the flow:
#     WORKER="dask worker" PROTOCOL=tcp SITES=8 BOND=8 CHI_OUT=8 \
#         bash examples/slurm/two_nodes_local.sh /tmp/two-nodes
#   COMMAND                once the workers are up, run this (bash -c, with
#                          SCHEDULER_FILE set) instead of the example problem; the
#                          GPU benchmarks time the src-method stack this way
#                          (benchmarks/gpu_run.sh, part "slurm"):
#     COMMAND='python3 benchmarks/bench_stack.py --modes memory --quimb no \
#         --workers 2 --scheduler-file "$SCHEDULER_FILE" --merge' \
#         bash examples/slurm/two_nodes_local.sh /tmp/two-nodes
#                          Two workers on one GPU (GPUS="0 0") share it: give each
#                          half, DEVICE_MEMORY_LIMIT=0.35 RMM_POOL_SIZE=0.35
#                          RMM_MAXIMUM_POOL_SIZE=0.45.
set -euo pipefail

OUT=${1:?"usage: bash examples/slurm/two_nodes_local.sh OUTDIR"}
GPUS=${GPUS:-0 1}
SITES=${SITES:-30} BOND=${BOND:-256} CHI_OUT=${CHI_OUT:-256}
DEVICE_MEMORY_LIMIT=${DEVICE_MEMORY_LIMIT:-0.7}
RMM_POOL_SIZE=${RMM_POOL_SIZE:-$DEVICE_MEMORY_LIMIT}
RMM_MAXIMUM_POOL_SIZE=${RMM_MAXIMUM_POOL_SIZE:-0.9}
THREADS=${THREADS:-4}
read -r -a WORKER_CMD <<< "${WORKER:-dask cuda worker}"
say() { echo "two_nodes_local.sh: $*" >&2; }

if [ -z "${PROTOCOL:-}" ]; then
    if why=$(python -c "import distributed_ucxx, rmm" 2>&1); then
        PROTOCOL=ucx
    else
        PROTOCOL=tcp
        say "WARNING: distributed_ucxx or rmm does not import (${why##*$'\n'}): the" \
            "workers exchange data over TCP (about 1 GB/s, against 60-190 GB/s over UCX" \
            "with an RMM pool). Install src_dask's 'gpu' extra (distributed-ucxx-cu13," \
            "rmm-cu13), or set PROTOCOL=tcp."
    fi
fi
case $PROTOCOL in
    ucx | tcp) ;;
    *) say "PROTOCOL must be ucx or tcp, not '$PROTOCOL'"; exit 2 ;;
esac

GPU_OPTS=()   # dask cuda worker only; as src_dask.cluster() sets them
if [[ " ${WORKER_CMD[*]} " == *" cuda "* ]]; then
    GPU_OPTS=(--device-memory-limit "$DEVICE_MEMORY_LIMIT")
    if [ "$PROTOCOL" = ucx ]; then
        GPU_OPTS+=(--rmm-pool-size "$RMM_POOL_SIZE" --rmm-maximum-pool-size "$RMM_MAXIMUM_POOL_SIZE")
    else
        GPU_OPTS+=(--rmm-async)
    fi
    # every CuPy allocation through RMM: else CuPy's own pool grows beside RMM's, the
    # device runs out, and UCX moves CuPy's memory by its slow path
    if "${WORKER_CMD[@]}" --help 2>/dev/null | grep -q -- --set-rmm-allocator-for-libs; then
        GPU_OPTS+=(--set-rmm-allocator-for-libs cupy)
    else
        say "WARNING: this dask-cuda has no --set-rmm-allocator-for-libs: CuPy allocates" \
            "beside RMM (install src_dask's 'gpu' extra for dask-cuda 26.10)"
    fi
fi
if [ "$PROTOCOL" = ucx ]; then
    # dask-cuda: scheduler and client make a CUDA context before UCX starts, so UCX
    # finds the GPU transports (dask cuda worker does it itself)
    export DASK_DISTRIBUTED__COMM__UCX__CREATE_CUDA_CONTEXT=True
fi

mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
SCHED=$OUT/scheduler.json
rm -rf "$SCHED" "$OUT/run.zarr" "$OUT/y.zarr"

# Each process started below leads a process group of its own (job control), so
# stopping one stops its children too (a worker's nanny and worker processes).
set -m
PIDS=()   # scheduler and workers
STEP=     # the step being waited for
stop() {
    trap - EXIT INT TERM
    local pid alive
    if [ -n "$STEP" ]; then PIDS+=("$STEP"); fi
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 60); do   # up to 30 s to close
        alive=0
        for pid in ${PIDS[@]+"${PIDS[@]}"}; do
            if kill -0 -- "-$pid" 2>/dev/null; then alive=1; fi
        done
        if [ $alive = 0 ]; then break; fi
        sleep 0.5
    done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM
# A step runs as a job the script waits for: bash runs a trap only once the
# foreground command has returned, but interrupts a wait at once.
step() {
    local rc=0
    "$@" &
    STEP=$!
    wait "$STEP" || rc=$?
    STEP=
    return "$rc"
}

read -r -a DEVICES <<< "$GPUS"
say "protocol $PROTOCOL; scheduler and ${#DEVICES[@]} workers (CUDA_VISIBLE_DEVICES ${GPUS// /, }); logs in $OUT/logs"
CUDA_VISIBLE_DEVICES=${DEVICES[0]} dask scheduler --scheduler-file "$SCHED" \
    --protocol "$PROTOCOL" --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 \
    > "$OUT/logs/scheduler.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 120); do
    if [ -s "$SCHED" ]; then break; fi
    if ! kill -0 "${PIDS[0]}" 2>/dev/null; then break; fi
    sleep 0.5
done
if [ ! -s "$SCHED" ]; then
    say "the scheduler did not start; its log:"; tail -20 "$OUT/logs/scheduler.log" >&2
    exit 1
fi

i=0
for device in "${DEVICES[@]}"; do   # one "node" each
    CUDA_VISIBLE_DEVICES=$device "${WORKER_CMD[@]}" --scheduler-file "$SCHED" \
        --protocol "$PROTOCOL" --host 127.0.0.1 --nthreads "$THREADS" --no-dashboard \
        --name "node$i" --local-directory "$OUT/spill/node$i" \
        ${GPU_OPTS[@]+"${GPU_OPTS[@]}"} > "$OUT/logs/node$i.log" 2>&1 &
    PIDS+=($!)
    i=$((i + 1))
done

if [ -z "${COMMAND:-}" ]; then   # written while the workers start
    step src-dask generate mpo "$OUT/in/mpo" --sites "$SITES" --seed 1 --overwrite
    step src-dask generate mps "$OUT/in/mps" --sites "$SITES" --bond "$BOND" --seed 2 --overwrite
fi

# src-dask run picks the device from the workers it finds: wait for all of them
WAIT_FOR_WORKERS='
import sys

from distributed import Client

with Client(scheduler_file=sys.argv[1], timeout="60s") as client:
    client.wait_for_workers(int(sys.argv[2]), timeout=300)
    print("scheduler", client.scheduler.address, file=sys.stderr)
    for address, info in sorted(client.scheduler_info()["workers"].items(),
                                key=lambda item: str(item[1].get("name"))):
        print(" ", info.get("name"), address, file=sys.stderr)
'
if ! step python -c "$WAIT_FOR_WORKERS" "$SCHED" "${#DEVICES[@]}"; then
    say "the workers did not all start; their logs:"
    tail -n 20 "$OUT"/logs/node*.log >&2
    exit 1
fi

if [ -n "${COMMAND:-}" ]; then
    SCHEDULER_FILE=$SCHED step bash -c "$COMMAND"
    say "done: $COMMAND"
    exit 0
fi
step src-dask run "$OUT/in/mpo" "$OUT/in/mps" --chi-out "$CHI_OUT" --seed 0 \
    --scheduler-file "$SCHED" --store "$OUT/run.zarr" --out "$OUT/y.zarr" \
    --verbose --no-progress
step src-dask info "$OUT/y.zarr"
say "done: result in $OUT/y.zarr"
