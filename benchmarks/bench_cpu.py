# ruff: noqa: T201
"""CPU benchmark: random MPO x random MPS compressed by SRC, src_dask against quimb.

The problem (DESIGN.md section 3)::

    A   = quimb.tensor.MPO_rand(L, bond_dim=4, phys_dim=2, dtype="complex128")
    psi = quimb.tensor.MPS_rand_state(L, bond_dim=chi, dtype="complex128")
    y   = A psi compressed to chi_out = chi

In one process this script

1. measures the machine's complex128 GEMM rate (numpy matmul, best of a few);
2. counts the problem's FLOPs (DESIGN.md convention: complex multiply-add =
   8 flop, opt_einsum's optimal path per site contraction, summed over sites);
3. times quimb's ``psi.gate_with_mpo(A, method="src", max_bond=chi_out)``;
4. times ``src_dask.apply(A, psi, chi_out, seed=0)`` on Dask's local threaded
   scheduler, then on a ``distributed.LocalCluster`` of 2 single-threaded
   worker processes (``client=``);
5. checks every result against the exact product ``A psi`` without forming a
   dense vector (overlaps contracted site by site with quimb);
6. prints a table and writes a JSON record.

Each timing is one warm-up run then the best of ``--repeats`` runs.

    python benchmarks/bench_cpu.py               # the full problem, L=50, chi=200
    python benchmarks/bench_cpu.py --quick       # L=12, chi=32: a smoke test
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    Device,
    ExactProduct,
    best_of,
    blas_info,
    cluster_cpu,
    core_difference,
    gemm_rate,
    make_problem,
    mpo_mps_flops,
    run_record,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "cpu_mpo_mps_chi200.json"


# -- main ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: L=12, chi=chi_out=32, GEMM n=512, no JSON unless --out")
    p.add_argument("--L", type=int, default=None, help="sites (default 50; 12 with --quick)")
    p.add_argument("--chi", type=int, default=None,
                   help="MPS bond and chi_out (default 200; 32 with --quick)")
    p.add_argument("--mpo-bond", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--seed", type=int, default=42, help="seed of the random MPO (MPS: seed+1)")
    p.add_argument("--gemm-n", type=int, default=None, help="GEMM size (default 2048)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    p.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster timing")
    p.add_argument("--out", type=Path, default=None,
                   help=f"JSON output (default {DEFAULT_OUT.relative_to(HERE.parent)}; "
                        "none with --quick)")
    args = p.parse_args(argv)
    args.L = args.L or (12 if args.quick else 50)
    args.chi = args.chi or (32 if args.quick else 200)
    args.gemm_n = args.gemm_n or (512 if args.quick else 2048)
    if args.out is None and not args.quick:
        args.out = DEFAULT_OUT
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Couldn't import `kahypar`")

    import src_dask

    record: dict[str, Any] = {
        **run_record("cpu MPO x MPS, SRC", Device("cpu")),
        "blas": blas_info(),
        "problem": {
            "mpo": f"MPO_rand({args.L}, bond_dim={args.mpo_bond}, phys_dim=2, "
                   f"dtype='complex128', seed={args.seed})",
            "mps": f"MPS_rand_state({args.L}, bond_dim={args.chi}, dtype='complex128', "
                   f"seed={args.seed + 1})",
            "chi_out": args.chi,
        },
        "repeats": args.repeats,
    }

    print(f"# {record['cpu_model']}, {record['nproc']} cores, {record['date']}")
    gemm = gemm_rate(args.gemm_n, repeats=5)
    record["gemm_complex128"] = gemm
    msg = f"complex128 GEMM {gemm['n']}^3: {gemm['gflops']:.1f} GFLOP/s"
    try:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            gemm1 = gemm_rate(args.gemm_n, repeats=3)
        record["gemm_complex128_1thread"] = gemm1
        msg += f" ({gemm1['gflops']:.1f} on one BLAS thread)"
    except ImportError:
        pass
    print(msg)

    A, psi = make_problem(args.L, args.chi, args.mpo_bond, args.seed)
    flops = mpo_mps_flops(A, psi, sketch=args.chi)
    record["flops"] = flops
    print(f"problem: L={args.L}, chi={args.chi}, D={args.mpo_bond}, "
          f"chi_out={args.chi}: {flops['total']:.3e} flop")

    timings: dict[str, Any] = {}
    results: dict[str, Any] = {}

    def run_quimb():
        return psi.gate_with_mpo(A, method="src", max_bond=args.chi, seed=0)

    timings["quimb_src"], results["quimb_src"] = best_of(run_quimb, args.repeats)
    print(f"quimb src:            best {timings['quimb_src']['best_s']:.3f} s")

    # threads first: with a Client alive, src_dask would pick it up by default
    def run_threads():
        return src_dask.apply(A, psi, chi_out=args.chi, seed=0)

    timings["src_dask_threads"], results["src_dask_threads"] = best_of(run_threads, args.repeats)
    print(f"src_dask threads:     best {timings['src_dask_threads']['best_s']:.3f} s")

    if not args.no_cluster:
        from distributed import Client, LocalCluster

        t0 = time.perf_counter()
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            startup = time.perf_counter() - t0
            worker_blas = client.run(blas_info)

            def run_cluster():
                return src_dask.apply(A, psi, chi_out=args.chi, seed=0, client=client)

            timings["src_dask_cluster"], results["src_dask_cluster"] = best_of(
                run_cluster, args.repeats, own_cpu=cluster_cpu(client))
        timings["src_dask_cluster"]["cluster_startup_s"] = startup
        record["cluster"] = {"n_workers": args.workers, "threads_per_worker": 1,
                             "processes": True, "worker_blas": list(worker_blas.values())}
        print(f"src_dask {args.workers}-worker cluster: "
              f"best {timings['src_dask_cluster']['best_s']:.3f} s "
              f"(cluster start {startup:.1f} s, not counted)")
    record["timings"] = timings

    tq = timings["quimb_src"]["best_s"]
    ratios = {f"{k}/quimb": timings[k]["best_s"] / tq for k in timings if k != "quimb_src"}
    record["ratios"] = ratios
    record["target"] = {"ratio_max": 0.5,
                        "met": {k: v <= 0.5 for k, v in ratios.items()}}
    rates = {}
    for k, t in timings.items():
        g = flops["total"] / t["best_s"] / 1e9
        rates[k] = {"gflops": g, "fraction_of_gemm": g / gemm["gflops"]}
    record["rates"] = rates

    # accuracy against the exact product
    t0 = time.perf_counter()
    exact = ExactProduct(A, psi)
    errors = {"exact_norm": float(np.sqrt(exact.norm2))}
    errors["quimb_src"] = exact.rel_error(results["quimb_src"])
    for k in ("src_dask_threads", "src_dask_cluster"):
        if k in results:
            errors[k] = exact.rel_error(results[k].to_quimb())
    if "src_dask_cluster" in results:
        errors["cores_threads_vs_cluster"] = core_difference(
            results["src_dask_threads"], results["src_dask_cluster"])
    if args.L <= 14:  # small enough for a dense cross-check of the overlap method
        x = A.apply(psi).to_dense().ravel()
        errors["dense_check"] = {
            k: float(np.linalg.norm(
                (results[k] if k == "quimb_src" else results[k].to_quimb()).to_dense().ravel()
                - x) / np.linalg.norm(x))
            for k in results
        }
    errors["check_s"] = time.perf_counter() - t0
    record["errors"] = errors

    # table
    print()
    print(f"{'run':<24}{'best s':>9}{'/quimb':>9}{'GFLOP/s':>10}{'of GEMM':>9}"
          f"{'rel err':>11}{'all runs s':>24}{'foreign cpu s':>24}")
    for k, t in timings.items():
        r = ratios.get(f"{k}/quimb", 1.0)
        print(f"{k:<24}{t['best_s']:>9.3f}{r:>9.3f}{rates[k]['gflops']:>10.1f}"
              f"{rates[k]['fraction_of_gemm']:>9.1%}{errors[k]['rel_error']:>11.4e}"
              f"{' '.join(f'{x:.2f}' for x in t['times_s']):>24}"
              f"{' '.join(f'{x:.2f}' for x in t.get('foreign_cpu_s', [])):>24}")
    print(f"GEMM {gemm['gflops']:.1f} GFLOP/s; {flops['total']:.3e} flop; target "
          f"ours <= 0.5x quimb: " + ", ".join(
              f"{k.split('/')[0]} {'met' if v else 'NOT met'}"
              for k, v in record["target"]["met"].items()))
    if "cores_threads_vs_cluster" in errors:
        print(f"threads vs cluster, max relative core difference: "
              f"{errors['cores_threads_vs_cluster']:.2e}")

    if args.out is not None:
        write_json(record, args.out)
    return record


if __name__ == "__main__":
    main()
