"""The ``src-dask`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np


def _random_train(kind: str, n: int, bond: int, phys: int, rng: np.random.Generator,
                  decay: float) -> list[np.ndarray]:
    """Complex Gaussian cores, bond index i scaled by ``decay**i`` (a compressible product)."""
    cores = []
    legs = (phys,) if kind == "mps" else (phys, phys)
    for j in range(n):
        left = 1 if j == 0 else min(bond, phys ** min(j, n - j))
        right = 1 if j == n - 1 else min(bond, phys ** min(j + 1, n - j - 1))
        shape = (left, right, *legs)
        c = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2 * left)
        c *= (decay ** np.arange(right)).reshape((1, right) + (1,) * len(legs))
        c = c[:, 0] if j == n - 1 else c
        cores.append(c[0] if j == 0 else c)
    return cores


def demo(args: argparse.Namespace) -> int:
    """MPO·MPS on a local cluster; the error against the exact product and the time."""
    from distributed import Client, LocalCluster

    import src_dask
    from src_dask.trains import TensorTrain, exact_product

    rng = np.random.default_rng(args.seed)
    mpo = TensorTrain(_random_train("mpo", args.sites, args.mpo_bond, 2, rng, 0.5))
    mps = TensorTrain(_random_train("mps", args.sites, args.bond, 2, rng, 0.9))
    exact = exact_product(mpo, mps)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        out = sys.stdout
        out.write(f"dashboard: {client.dashboard_link}\n")
        out.write(f"problem:   MPO (bond {args.mpo_bond}) · MPS (bond {args.bond}), "
                  f"{args.sites} sites, complex128; exact product bond "
                  f"{max(exact.bond_dims)}\n")
        for oversample in (0, "auto"):
            t0 = time.perf_counter()
            y = src_dask.apply(mpo, mps, args.chi_out, oversample=oversample, seed=args.seed,
                               client=client)
            dt = time.perf_counter() - t0
            diff = y.norm() ** 2 + exact.norm() ** 2 - 2 * y.vdot(exact).real
            err = np.sqrt(max(diff, 0.0)) / exact.norm()
            out.write(f"chi_out={args.chi_out:<4d} oversample={oversample!s:<5} "
                      f"relative error {err:.3e}   time {dt:6.2f} s\n")
        if args.wait:
            input("press Enter to stop the cluster ")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="src-dask", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run SRC on a built-in MPO·MPS problem on a local cluster")
    p.add_argument("--sites", type=int, default=40)
    p.add_argument("--bond", type=int, default=64, help="MPS bond dimension")
    p.add_argument("--mpo-bond", type=int, default=4)
    p.add_argument("--chi-out", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait", action="store_true", help="keep the dashboard up until Enter")
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
