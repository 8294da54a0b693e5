# ruff: noqa: T201
"""How fast a CuPy block moves between two GPU workers: those of ``src_dask.cluster(gpus=2)``
started here, or those of a running cluster (``--scheduler-file``).

Moves CuPy arrays of each size (``--gib``, default 1 and 4 GiB) from worker 0 to worker
1, for each ``--protocol`` and RMM allocator (``async``: RMM's stream-ordered pool;
``pool``: a classic RMM pool, which dask-cuda's UCX notes recommend because CUDA IPC
maps each allocation once per pair of processes). The first transfer of each size is
reported apart (``warmup_s``): the first on a cluster carries the one-time cost of
mapping the sender's memory in the receiver (``first_on_cluster``; ``mapping_s`` is
its excess over the best timed transfer of that size), and it is not one of the
``--repeats`` timed transfers (``seconds``, ``best_GBps``). Prints a table and writes
the record (benchmarks/results/transfer_gpu.json). This is the rate at which pass 2
on several GPUs moves sums of ``S`` and blocks of ``C_j``. ``--best`` prints the
protocol and allocator of the fastest run of a record (gpu_run.sh's 2-GPU part uses
it).

``--ucx-sync`` measures src_dask's own UCX patch outside a run: what Dask's UCX comm
waits for is switched by ``src_dask.ucx.ucx_waits_for_default_stream`` (a run switches
it itself, from the config ``src_dask.ucx-sync``).

    python benchmarks/tools/bench_transfer.py --protocol tcp ucx --rmm async pool
    python benchmarks/tools/bench_transfer.py --protocol ucx --rmm pool --gib 1 4
    python benchmarks/tools/bench_transfer.py --protocol ucx --rmm pool --gib 1 --busy 1 \
        --ucx-sync device stream   # while both GPUs compute: the comm's two waits
    python benchmarks/tools/bench_transfer.py --scheduler-file sched.json  # workers already up:
        # dask scheduler --protocol ucx --scheduler-file sched.json &
        # dask cuda worker --scheduler-file sched.json --rmm-pool-size 16GB &
    python benchmarks/tools/bench_transfer.py --best benchmarks/results/transfer_gpu.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness import Config, Record, cell, execute_benchmark, parser, print_table


def _make(nbytes: int):
    import cupy

    x = cupy.ones(nbytes // 16, dtype="complex128")
    cupy.cuda.Device().synchronize()
    return x


def _touch(x) -> float:
    """Reads the block's last element on this thread's stream (not waiting for the
    whole device: ``--busy`` keeps it computing)."""
    import cupy

    value = float(x[-1].real.get())
    cupy.cuda.get_current_stream().synchronize()
    return value


#: What ``_busy`` queued, kept alive until the next call (the kernels still use it).
_queued: list = []


def _busy(seconds: float) -> int:
    """Queues about ``seconds`` of complex128 GEMMs on a non-blocking stream of this
    worker's GPU and returns at once, as src_dask's tasks keep a GPU busy while Dask
    moves data; the number of GEMMs queued."""
    import cupy

    _queued.clear()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = cupy.ones((4096, 4096), dtype=cupy.complex128)
        b = a @ a  # cuBLAS's first call sets it up: not timed
        stream.synchronize()
        t0 = time.perf_counter()
        b = a @ a
        stream.synchronize()
        one = max(time.perf_counter() - t0, 1e-4)
        count = max(1, int(seconds / one))
        for _ in range(count):
            b = a @ a
    _queued.extend([stream, a, b])
    return count


def _peer_access() -> dict:
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    return {f"{a}->{b}": bool(cupy.cuda.runtime.deviceCanAccessPeer(a, b))
            for a in range(n) for b in range(n) if a != b}


def transfers(client, sizes: list[int], repeats: int, busy: float = 0.0) -> list[dict]:
    """Per size in ``sizes`` (bytes), from the first worker to the second of ``client``:
    one warm-up transfer, then ``repeats`` timed ones; each block is made anew on the
    sender (``pure=False``), so no transfer finds the block already there. ``busy``:
    both GPUs get that many seconds of GEMMs queued on a stream of their own before
    each transfer."""
    from distributed import wait

    w0, w1 = sorted(client.scheduler_info()["workers"])[:2]
    out = []
    for i, nbytes in enumerate(sizes):
        times, links = [], []
        for r in range(repeats + 1):
            x = client.submit(_make, nbytes + r * 16, workers=[w0], pure=False)
            wait(x)
            if busy:
                client.run(_busy, busy, workers=[w0, w1])
            t0 = time.perf_counter()
            client.submit(_touch, x, workers=[w1], allow_other_workers=False).result()
            times.append(time.perf_counter() - t0)
            links.append(client.run(_link_seconds, x.key, workers=[w1])[w1])
            del x
        warmup, timed = times[0], times[1:]
        entry = {"bytes": nbytes, "gib": nbytes / 2**30, "first_on_cluster": i == 0,
                 "warmup_s": warmup, "warmup_GBps": nbytes / warmup / 1e9,
                 "seconds": timed, "link_warmup_s": links[0], "link_seconds": links[1:]}
        if timed:
            entry.update(best_GBps=nbytes / min(timed) / 1e9,
                         mapping_s=max(0.0, warmup - min(timed)))
        if [t for t in links[1:] if t]:
            entry["link_best_GBps"] = nbytes / min(t for t in links[1:] if t) / 1e9
        out.append(entry)
    return out


def _link_seconds(key, dask_worker=None) -> float | None:
    """How long the receiving worker's fetch of ``key`` took, from its transfer log
    (the dependency's transfer alone: request, data, deserialization; not the
    scheduling of the tasks around it)."""
    for entry in reversed(dask_worker.transfer_incoming_log):
        if key in entry["keys"]:
            return float(entry["duration"])
    return None


def _each_sync(client, protocol: str, sizes: list[int], repeats: int, busy: float,
               syncs: tuple[str, ...]) -> list[dict]:
    """:func:`transfers` once per wait of Dask's UCX comm in ``syncs``: ``device``
    (distributed-ucxx's own, the whole device) or ``stream`` (the default stream, as
    src_dask sets it during a run: ``src_dask.ucx.ucx_waits_for_default_stream``);
    over another protocol once."""
    from src_dask.ucx import ucx_waits_for_default_stream

    out = []
    for sync in syncs if protocol == "ucx" else ("device",):
        with ucx_waits_for_default_stream(client, sync == "stream"):
            out += [{"busy_s": busy, "ucx_sync": sync if protocol == "ucx" else None, **e}
                    for e in transfers(client, sizes, repeats, busy)]
    return out


def measure(protocol: str, rmm: str, sizes: list[int], repeats: int, busy: float = 0.0,
            syncs: tuple[str, ...] = ("device",)) -> list[dict]:
    """:func:`_each_sync` on a fresh ``src_dask.cluster(gpus=2)`` (its start not timed)."""
    from clusters import rmm_options
    from distributed import Client

    import src_dask

    options = rmm_options(rmm)
    with src_dask.cluster(gpus=2, protocol=protocol, dashboard_address=":0",
                          **options) as cluster, Client(cluster) as client:
        what = f"src_dask.cluster(gpus=2, protocol={protocol!r}, {options})"
        return [{"protocol": protocol, "rmm": rmm, "cluster": what, **e}
                for e in _each_sync(client, protocol, sizes, repeats, busy, syncs)]


def measure_external(scheduler_file: Path, sizes: list[int], repeats: int,
                     busy: float = 0.0, syncs: tuple[str, ...] = ("device",)) -> list[dict]:
    """:func:`_each_sync` between the first two workers of a running cluster (two
    workers sharing one GPU stand in for two GPUs on a one-GPU machine)."""
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file)) as client:
        client.wait_for_workers(2, timeout=120)
        protocol = client.scheduler.address.split("://")[0]
        what = f"scheduler file {scheduler_file}: {len(client.scheduler_info()['workers'])} " \
               "workers started outside"
        return [{"protocol": protocol, "rmm": "as started", "cluster": what, **e}
                for e in _each_sync(client, protocol, sizes, repeats, busy, syncs)]


def best(path: Path) -> str:
    """``"PROTOCOL RMM"`` of the fastest run recorded in ``path`` (``tcp async`` if none),
    among the clusters this script started (an outside cluster's allocator is unknown)."""
    try:
        runs = [r for r in json.loads(path.read_text())["runs"]
                if "best_GBps" in r and r.get("rmm") in ("async", "pool")]
    except (OSError, ValueError, KeyError):
        runs = []
    top = max(runs, key=lambda r: r["best_GBps"], default={})
    return f"{top.get('protocol', 'tcp')} {top.get('rmm', 'async')}"


def main(argv: list[str] | None = None) -> Record | None:
    p = parser(__doc__, repeats=3, out="transfer_gpu.json")
    p.add_argument("--best", type=Path, metavar="JSON",
                   help="only print the protocol and allocator of the fastest run in JSON")
    p.add_argument("--protocol", nargs="+", default=["tcp", "ucx"])
    p.add_argument("--rmm", nargs="+", choices=("async", "pool"), default=["async"])
    p.add_argument("--gib", type=float, nargs="+", default=[1.0, 4.0],
                   help="block sizes in GiB, in order (default 1 4)")
    p.add_argument("--busy", type=float, default=0.0, metavar="S",
                   help="before each transfer, queue about S seconds of GEMMs on both GPUs "
                        "(a stream of their own), as a run keeps them computing (default 0)")
    p.add_argument("--ucx-sync", nargs="+", choices=("device", "stream"), default=["device"],
                   help="what Dask's UCX comm waits for before sending and after receiving: "
                        "the whole device (distributed-ucxx's own) and/or the default stream "
                        "(as src_dask sets it during a run); each one measured")
    p.add_argument("--scheduler-file", type=Path, default=None, metavar="PATH",
                   help="measure between the first two workers of the cluster whose "
                        "scheduler wrote PATH (e.g. dask cuda worker processes) instead "
                        "of starting src_dask.cluster(gpus=2); --protocol/--rmm unused")
    args = p.parse_args(argv)
    if args.best:
        print(best(args.best))
        return None
    return execute_benchmark(CONFIG, args)


def run(args, record: Record, device: Any) -> None:
    """Every configuration (protocol, allocator; or the running cluster's workers)."""
    sizes = record["sizes_bytes"]
    configs = ([("scheduler-file", "as started")] if args.scheduler_file else
               [(protocol, rmm) for protocol in args.protocol for rmm in args.rmm])
    for protocol, rmm in configs:
        try:
            if args.scheduler_file:
                record["runs"] += measure_external(args.scheduler_file, sizes, args.repeats,
                                                   args.busy, tuple(args.ucx_sync))
            else:
                record["runs"] += measure(protocol, rmm, sizes, args.repeats, args.busy,
                                          tuple(args.ucx_sync))
        except Exception as e:  # noqa: BLE001 - one failing still reports the others
            record["runs"].append({"protocol": protocol, "rmm": rmm, "error": repr(e)})


def report(record: Record) -> None:
    print_table(["protocol", "rmm", "sync", "busy s", "GiB", "warm-up s", "mapping s",
                 "best GB/s", "link GB/s", "seconds", "error"],
                [[r["protocol"], r["rmm"], r.get("ucx_sync") or "-",
                  cell(r.get("busy_s"), ".1f"), cell(r.get("gib"), ".0f"),
                  cell(r.get("warmup_s"), ".3f"), cell(r.get("mapping_s"), ".3f"),
                  cell(r.get("best_GBps"), ".2f"), cell(r.get("link_best_GBps"), ".2f"),
                  " ".join(f"{t:.3f}" for t in r.get("seconds", [])), r.get("error", "")]
                 for r in record["runs"]],
                ["From worker 0 to worker 1. warm-up: the first transfer of that size "
                 "(the first on a cluster maps the sender's memory once); mapping: its "
                 "excess over the best timed one; best and seconds: the "
                 f"{record['repeats']} timed transfers after it, from submitting the task "
                 "that needs the block to its result on the client; link: the dependency's "
                 "transfer alone, from the receiving worker's transfer log; sync: what "
                 "Dask's UCX comm waits for (device: all kernels of the GPU; stream: its "
                 "default stream); busy: seconds of GEMMs queued on both GPUs before each "
                 f"transfer. Peer access: {record['peer_access']}"], align="lllrrrrrrll")


def _device(args) -> Any:
    from device import Device

    return Device("gpu", cluster=True)


CONFIG = Config(
    measures="CuPy block from one GPU worker to another",
    name=lambda args, device: "transfer_gpu.json", device=_device, run=run, report=report,
    fields=lambda args: {"peer_access": _peer_access(),
                         "sizes_bytes": [int(g * 2**30) for g in args.gib],
                         "repeats": args.repeats, "runs": []})


if __name__ == "__main__":
    main()
