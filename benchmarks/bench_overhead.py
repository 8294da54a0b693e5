# ruff: noqa: T201
"""Per-call overhead of src_dask: a small MPO·MPS whose GEMMs take next to no time, so
what is measured is Python and scheduling (graph build, tasks, hops between tasks).

    A   = quimb.tensor.MPO_rand(L, bond_dim=4)       # L = 50 by default
    psi = quimb.tensor.MPS_rand_state(L, bond_dim=chi)  # chi = 8 by default
    src_dask.apply(A, psi, chi, seed=0)

on Dask's synchronous and threaded schedulers and with a ``Client`` of an in-process
one-worker ``LocalCluster`` (2 threads), where every dependent task waits for a round
trip through the scheduler. Prints the best and all of ``--repeats`` calls per
scheduler (after one warm-up call), and writes JSON with ``--out``.

    python benchmarks/bench_overhead.py
    python benchmarks/bench_overhead.py --L 20 --repeats 3 --out /tmp/overhead.json
    python benchmarks/bench_overhead.py --quick   # L=12, 2 repeats
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dask
from _common import Device, best_of, run_record

import src_dask


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--L", type=int, default=50)
    p.add_argument("--chi", type=int, default=8)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="L=12, 2 repeats: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.L, args.repeats = 12, 2

    import quimb.tensor as qtn
    from distributed import Client, LocalCluster

    A = qtn.MPO_rand(args.L, bond_dim=4, phys_dim=2, dtype="complex128", seed=42)
    psi = qtn.MPS_rand_state(args.L, bond_dim=args.chi, dtype="complex128", seed=43)

    def call(client=None):
        return lambda: src_dask.apply(A, psi, args.chi, seed=0, client=client)

    results = {}
    for scheduler in ("sync", "threads"):
        with dask.config.set(scheduler=scheduler):
            results[scheduler] = best_of(call(), args.repeats)[0]
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        results["client_inprocess_1x2"] = best_of(call(client), args.repeats)[0]

    for name, r in results.items():
        print(f"{name:24s} best {r['best_s']:.3f} s   all " +
              " ".join(f"{t:.3f}" for t in r["times_s"]))
    # NumPy inputs: src_dask runs them on the GPU where there is one (its default)
    record = {**run_record("src_dask per-call overhead, MPO·MPS", Device()),
              "problem": {"L": args.L, "chi": args.chi, "mpo_bond": 4, "dtype": "complex128"},
              "results": results}
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
