# ruff: noqa: T201
"""The page-locked (pinned) host allocations of a GPU worker, call after call.

The stalls left in a GPU worker's event loop (bench_stack.py's ``stalls_by_call``)
coincide with pinned allocations for the inputs' reads. This tool counts them: on a
``src_dask.cluster(gpus=1)`` worker, CuPy's pinned allocator is wrapped (``cupy.cuda.
set_pinned_memory_allocator``) to count, per call of the D_M=1000 stack (bench_stack's
inputs under ``--workdir``, written when missing), the allocations, those the pool could
not serve from its free blocks (new page-locked memory) and those that took over 10 ms.

    PYTHONPATH=src:benchmarks python benchmarks/tools/pinned_allocs.py --calls 3 --out F.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import src_dask

#: An allocation slower than this counts as slow.
SLOW_S = 0.01


def _wrap_pinned_allocator() -> None:
    """On the worker: count CuPy's pinned allocations (``builtins._pinned_counts``)."""
    import builtins

    import cupy

    pool = cupy.get_default_pinned_memory_pool()
    counts = builtins._pinned_counts = {"calls": 0, "new": 0, "new_bytes": 0, "slow": []}

    def malloc(size: int) -> Any:
        free, t0 = pool.n_free_blocks(), time.perf_counter()
        pointer = pool.malloc(size)
        seconds = time.perf_counter() - t0
        counts["calls"] += 1
        if pool.n_free_blocks() >= free:  # none of its free blocks served it
            counts["new"] += 1
            counts["new_bytes"] += size
        if seconds > SLOW_S:
            counts["slow"].append((round(seconds, 4), size))
        return pointer

    cupy.cuda.set_pinned_memory_allocator(malloc)


def _read_counts() -> dict[str, Any]:
    """On the worker: the counts since the last read, and zero them."""
    import builtins

    c = builtins._pinned_counts
    out = {"allocations": c["calls"], "new": c["new"], "new_bytes": c["new_bytes"],
           "slow": len(c["slow"]), "slow_s": round(sum(s for s, _ in c["slow"]), 3),
           "slowest": sorted(c["slow"], reverse=True)[:5]}
    c.update(calls=0, new=0, new_bytes=0, slow=[])
    return out


def main(argv: list[str] | None = None) -> int:
    from distributed import Client
    from problems import generate_inputs, open_inputs, stack_spec

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dm", type=int, default=1000)
    p.add_argument("--chi-out", type=int, default=500)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sb1000"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    spec = stack_spec(50, args.dm, 4, 0)
    args.workdir.mkdir(parents=True, exist_ok=True)
    generate_inputs(spec, args.workdir, False)
    trains = open_inputs(spec, args.workdir)
    record: dict[str, Any] = {"dm": args.dm, "chi_out": args.chi_out, "calls": []}
    with src_dask.cluster(gpus=1, dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(_wrap_pinned_allocator)
        for _ in range(args.calls):
            t0 = time.perf_counter()
            y = src_dask.src(*trains, chi_out=args.chi_out, seed=0, client=client)
            seconds = time.perf_counter() - t0
            del y
            (counts,) = client.run(_read_counts).values()
            record["calls"].append({"s": round(seconds, 2), **counts})
            print(record["calls"][-1], flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
