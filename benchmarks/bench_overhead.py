# ruff: noqa: T201
"""Per-call overhead of src_dask: a small MPO·MPS whose GEMMs take next to no time, so
what is measured is Python and scheduling (graph build, tasks, hops between tasks).

    A   = quimb.tensor.MPO_rand(L, bond_dim=4)          # L = 50 by default
    psi = quimb.tensor.MPS_rand_state(L, bond_dim=chi)  # chi = 8 by default
    src_dask.apply(A, psi, chi, seed=0)

on Dask's synchronous and threaded schedulers and with a ``Client`` of an in-process
one-worker ``LocalCluster`` (2 threads), where every dependent task waits for a round
trip through the scheduler. Prints the best and all of ``--repeats`` calls per
scheduler (after one warm-up call) and writes the record
(benchmarks/results/overhead_<device>.json; the device is where src_dask runs NumPy
inputs: the GPU where there is one).

    python benchmarks/bench_overhead.py
    python benchmarks/bench_overhead.py --L 20 --repeats 3 --out /tmp/overhead.json
    python benchmarks/bench_overhead.py --quick   # L=12, 2 repeats
"""

from __future__ import annotations

import warnings
from typing import Any

from device import Device
from harness import Record, output_path, parser, print_table
from problems import mpo_mps, mpo_mps_spec
from timing import best_of, runs_text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="L=12, 2 repeats", repeats=(9, 2), seed=42,
               out="overhead_<device>.json")
    p.sized("--L", type=int, full=50, quick=12, help="sites")
    p.add_argument("--chi", type=int, default=8, help="MPS bond and chi_out (default 8)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="Couldn't import `kahypar`")

    import dask
    from distributed import Client, LocalCluster

    import src_dask

    device = Device()  # NumPy inputs: src_dask runs them on the GPU where there is one
    out = output_path(args.out, f"overhead_{device.name}.json", args.quick)
    record = Record("per-call overhead of src_dask on a small MPO·MPS", device,
                    problem={**mpo_mps_spec(args.L, args.chi, 4, args.seed), "chi": args.chi,
                             "mpo_bond": 4, "dtype": "complex128"})
    print(record.header())
    A, psi = mpo_mps(args.L, args.chi, 4, args.seed)

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
    record["results"] = results
    print_table(["scheduler", "best s", "all calls s"],
                [[name, f"{r['best_s']:.3f}", runs_text(r["times_s"])]
                 for name, r in results.items()],
                [f"one warm-up call, then {args.repeats}; MPO·MPS L={args.L}, chi={args.chi}"],
                align="lrl")
    record.write(out)
    return record


if __name__ == "__main__":
    main()
