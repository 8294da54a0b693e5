"""Where the time of one GPU run goes: per step (Dask's Profiler) and per function.

    python benchmarks/profile_gpu.py [--chi 1000]
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

import dask
import numpy as np
from dask.diagnostics import Profiler
from dask.utils import key_split
from gpu_reference import random_train

import src_dask


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--chi", type=int, default=1000)
    p.add_argument("--sites", type=int, default=50)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    a = random_train("mpo", args.sites, 4, rng)
    x = random_train("mps", args.sites, args.chi, rng)
    with dask.config.set({"src_dask.device": "gpu"}):
        src_dask.apply(a, x, args.chi, seed=0)
        with Profiler() as prof:
            t0 = time.perf_counter()
            src_dask.apply(a, x, args.chi, seed=0)
            wall = time.perf_counter() - t0
        per = defaultdict(lambda: [0, 0.0])
        for r in prof.results:
            step = key_split(r.key).split("_site")[0]
            what = r.key[1] if isinstance(r.key, tuple) and len(r.key) > 1 else ""
            per[(step, str(what))][0] += 1
            per[(step, str(what))][1] += r.end_time - r.start_time
        print(f"wall {wall:.3f} s; task time by step:")
        for (step, what), (count, total) in sorted(per.items(), key=lambda kv: -kv[1][1]):
            print(f"  {step:12s} {what:10s} {count:5d} tasks {total:8.3f} s")
        pr = cProfile.Profile()
        pr.enable()
        src_dask.apply(a, x, args.chi, seed=0)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
