"""A reference problem on the GPU against the CPU, in one run (DESIGN.md §3).

    python benchmarks/gpu_reference.py [--chi 1000] [--sites 50] [--out result.json]

MPO (bond 4, phys 2) · MPS (bond chi), complex128, chi_out = chi: times
src_dask on the GPU (best of 2 after a warm-up) and on the CPU (once), and
the largest relative difference between the two results, core by core.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import json
import platform
import time

import dask
import numpy as np

import src_dask
from src_dask import TensorTrain


def random_train(kind: str, n: int, bond: int, rng) -> TensorTrain:
    cores = []
    legs = (2,) if kind == "mps" else (2, 2)
    for j in range(n):
        shape = (1 if j == 0 else bond, 1 if j == n - 1 else bond, *legs)
        c = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2 * bond)
        c = c[:, 0] if j == n - 1 else c
        cores.append(c[0] if j == 0 else c)
    return TensorTrain(cores, kind)


def timed(device: str, a, x, chi: int, repeats: int):
    times, y = [], None
    with dask.config.set({"src_dask.device": device}):
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = src_dask.apply(a, x, chi, seed=0)
            times.append(time.perf_counter() - t0)
    return y, times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--chi", type=int, default=1000)
    p.add_argument("--sites", type=int, default=50)
    p.add_argument("--out")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    a = random_train("mpo", args.sites, 4, rng)
    x = random_train("mps", args.sites, args.chi, rng)
    y_gpu, t_gpu = timed("gpu", a, x, args.chi, 3)
    y_cpu, t_cpu = timed("cpu", a, x, args.chi, 1)
    diff = max(float(np.abs(c - c0).max() / np.abs(c0).max())
               for c, c0 in zip(y_gpu, y_cpu, strict=True))
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
              "problem": f"MPO(L={args.sites}, D=4) x MPS(chi={args.chi}), complex128",
              "chi_out": args.chi, "gpu_s": t_gpu, "cpu_s": t_cpu,
              "max_core_rel_diff_gpu_vs_cpu": diff}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
