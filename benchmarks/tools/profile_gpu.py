# ruff: noqa: T201
"""Where the time of one GPU run of MPO·MPS goes: per step (Dask's Profiler) and per
Python function (cProfile).

The problem of gpu_reference.py (MPO bond 4, MPS bond chi, complex128, chi_out =
chi) with ``src_dask.device = "gpu"``: one warm-up call, one call under Dask's
Profiler (task time per step, printed as a table), one under cProfile (the
functions with the most own time). Prints only.

    python benchmarks/tools/profile_gpu.py [--chi 1000] [--sites 50]
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict

from harness import parser, print_table
from problems import mpo_mps_trains


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__, seed=0)
    p.add_argument("--chi", type=int, default=1000, help="MPS bond and chi_out (default 1000)")
    p.add_argument("--sites", type=int, default=50, help="sites (default 50)")
    p.add_argument("--functions", type=int, default=18,
                   help="functions cProfile lists (default 18)")
    args = p.parse_args(argv)

    import dask
    from dask.diagnostics import Profiler
    from dask.utils import key_split

    import src_dask

    a, x = mpo_mps_trains(args.sites, args.chi, args.seed)
    with dask.config.set({"src_dask.device": "gpu"}):
        src_dask.apply(a, x, args.chi, seed=args.seed)
        with Profiler() as prof:
            t0 = time.perf_counter()
            src_dask.apply(a, x, args.chi, seed=args.seed)
            wall = time.perf_counter() - t0
        per: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
        for r in prof.results:
            step = key_split(r.key).split("_site")[0]
            what = str(r.key[1]) if isinstance(r.key, tuple) and len(r.key) > 1 else ""
            per[(step, what)][0] += 1
            per[(step, what)][1] += r.end_time - r.start_time
        print_table(["step", "part", "tasks", "task s"],
                    [[step, what, count, f"{total:.3f}"] for (step, what), (count, total)
                     in sorted(per.items(), key=lambda kv: -kv[1][1])],
                    [f"one call: {wall:.3f} s wall"], align="llrr")
        pr = cProfile.Profile()
        pr.enable()
        src_dask.apply(a, x, args.chi, seed=args.seed)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(args.functions)


if __name__ == "__main__":
    main()
