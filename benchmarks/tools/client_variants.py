# ruff: noqa: T201
"""Where a Client call's time goes on one GPU worker: the χ=1000 MPO·MPS one-task run
on variants of ``src_dask.cluster(gpus=1)``, against the same call in-process.

bench_mpo_mps.py ``--client`` times the call; this tool asks why it costs more than the
in-process run (issue 29). Inputs persisted on the worker (CuPy), result kept there
(``persist=True``); per variant four calls (the first one warms the worker) and the
one task's compute time from the task stream:

- ``default``: ``src_dask.cluster(gpus=1)`` as it is (RMM's asynchronous allocator);
- ``chunk250``: the same with ``chunk=250``, the blocks a one-task run on a 4-thread GPU
  worker took before it kept one block;
- ``cupy_pool``: CuPy's own memory pool instead of RMM's;
- ``noprofile``: Dask's worker profiler off.

    PYTHONPATH=src:benchmarks python benchmarks/tools/client_variants.py --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import dask

import src_dask

VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # name: (cluster options, Dask config while the cluster starts, call options)
    "default": ({}, {}, {}),
    "chunk250": ({}, {}, {"chunk": 250}),
    "cupy_pool": ({"rmm_allocator_external_lib_list": None}, {}, {}),
    "noprofile": ({}, {"distributed.worker.profile.enabled": False}, {}),
}


def problem(chi: int) -> tuple[src_dask.TensorTrain, src_dask.TensorTrain]:
    """bench_mpo_mps.py's problem (L=50, MPO bond 4, seed 42), as NumPy trains."""
    from problems import mpo_mps

    return tuple(src_dask.TensorTrain(t) for t in mpo_mps(50, chi, 4, 42))


def in_process(a: Any, x: Any, chi: int, calls: int) -> list[float]:
    import cupy

    on = [src_dask.TensorTrain([cupy.asarray(c) for c in t.to_numpy()], t.kind)
          for t in (a, x)]
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        src_dask.apply(*on, chi_out=chi, seed=0)
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return times


def on_cluster(a: Any, x: Any, chi: int, calls: int, options: dict, config: dict,
               call: dict) -> dict[str, Any]:
    import cupy
    import dask.array as da
    from distributed import Client, get_task_stream, wait
    from timing import compute_seconds

    with dask.config.set(config), \
            src_dask.cluster(gpus=1, dashboard_address=None, **options) as cluster, \
            Client(cluster) as client:
        def persisted(t: Any) -> src_dask.TensorTrain:
            cores = [da.from_array(c, chunks=c.shape).map_blocks(
                cupy.asarray, dtype=c.dtype, meta=cupy.empty((0,) * c.ndim, c.dtype))
                for c in t.to_numpy()]
            return src_dask.TensorTrain(client.persist(cores), t.kind)

        ap, xp = persisted(a), persisted(x)
        wait([*ap, *xp])
        times, computing = [], []
        for _ in range(calls):
            with get_task_stream(client=client) as stream:
                t0 = time.perf_counter()
                y = src_dask.apply(ap, xp, chi_out=chi, seed=0, client=client, persist=True,
                                   **call)
                wait(list(y))
                times.append(time.perf_counter() - t0)
            computing.append(compute_seconds(stream.data))
            del y
        affinity = client.run(lambda: len(os.sched_getaffinity(0)))
    return {"times_s": times, "best_s": min(times[1:] or times), "task_compute_s": computing,
            "worker_cpus": list(affinity.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chi", type=int, default=1000)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    a, x = problem(args.chi)
    threads = in_process(a, x, args.chi, args.calls)
    record: dict[str, Any] = {"chi": args.chi, "in_process": {
        "times_s": threads, "best_s": min(threads[1:] or threads)}}
    print(f"{'in-process threads':>20}: best {record['in_process']['best_s']:.3f} s")
    for name in args.variants:
        entry = record[name] = on_cluster(a, x, args.chi, args.calls, *VARIANTS[name])
        entry["ratio_to_in_process"] = entry["best_s"] / record["in_process"]["best_s"]
        print(f"{name:>20}: best {entry['best_s']:.3f} s "
              f"({entry['ratio_to_in_process']:.2f}x), task {min(entry['task_compute_s']):.3f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
