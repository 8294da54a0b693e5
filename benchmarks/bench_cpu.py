# ruff: noqa: T201
"""MPO·MPS by SRC on the CPU: src_dask (threads, and a 2-worker LocalCluster) against quimb.

The problem (docs/design.md §5): quimb's ``MPO_rand(L, bond_dim=4, phys_dim=2)`` times
``MPS_rand_state(L, bond_dim=chi)``, complex128, compressed to chi_out = chi. The
script measures the complex128 GEMM rate (all BLAS threads, and one: what a
single-threaded worker can reach), counts the FLOPs (``src_dask.plan``'s), times
quimb's ``psi.gate_with_mpo(A, method="src")``, then ``src_dask.apply(A, psi, chi)`` on
Dask's threaded scheduler and through a ``LocalCluster`` of single-threaded worker
processes (one warm-up, then the best of ``--repeats``), checks every result against
the exact product without a dense vector (densely too for L <= 14), and writes
benchmarks/results/cpu_mpo_mps_chi<chi>.json.

    python benchmarks/bench_cpu.py               # the full problem, L=50, chi=200
    python benchmarks/bench_cpu.py --quick       # L=12, chi=32: a smoke test
"""

from __future__ import annotations

import time
from typing import Any

import dask
import numpy as np
from accuracy import core_difference
from bench_overhead import breakdown
from device import Device, gemm_rate, run_gemm
from flops import PLAN_CONVENTION, PLAN_LEGEND, plan_flops, rates
from harness import (
    Config,
    Record,
    check_targets,
    execute_benchmark,
    parser,
    print_table,
    print_targets,
)
from methods import mpo_mps_runner
from problems import MPO_MPS_TARGETS, mpo_mps, mpo_mps_spec
from timing import best_of, runs_text
from tools.provenance import blas_info


def parse_args(argv: list[str] | None = None):
    p = parser(__doc__, quick="L=12, chi=chi_out=32, GEMM n=512, one timed run",
               repeats=(3, 1), seed=42, gemm=True, out="cpu_mpo_mps_chi<chi>.json")
    p.sized("--L", type=int, full=50, quick=12, help="sites")
    p.sized("--chi", type=int, full=200, quick=32, help="MPS bond and chi_out")
    p.add_argument("--mpo-bond", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    p.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster timing")
    return p.parse_args(argv)


def measure_gemm(args, device: Device) -> dict[str, Any]:
    """The GEMM rate on all BLAS threads and, where threadpoolctl is importable, on one."""
    out = {"gemm_complex128": run_gemm(args.gemm_n, args.quick, device)}
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return out
    with threadpool_limits(1):
        out["gemm_complex128_1thread"] = gemm_rate(out["gemm_complex128"]["n"], 3)
    print(f"  ({out['gemm_complex128_1thread']['gflops']:.1f} GFLOP/s on one BLAS thread)")
    return out


def time_methods(A, psi, args, device: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    """quimb's src, src_dask on threads and on a LocalCluster: timings and results."""
    timings: dict[str, Any] = {}
    results: dict[str, Any] = {}
    # threads before the cluster: with a Client alive, src_dask would pick it up
    for key, method in (("quimb_src", "quimb_src"), ("src_dask_threads", "src_dask")):
        timings[key], results[key] = best_of(
            mpo_mps_runner(method, A, psi, args.chi, device, seed=0), args.repeats)
        print(f"{key}: best {timings[key]['best_s']:.3f} s", flush=True)
    if args.no_cluster:
        return timings, results
    from clusters import cluster_cpu
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        startup = time.perf_counter() - t0
        worker_blas = client.run(blas_info)
        worker_env = client.run(_worker_env)
        run = mpo_mps_runner("src_dask", A, psi, args.chi, device, seed=0, client=client)
        timings["src_dask_cluster"], results["src_dask_cluster"] = best_of(
            run, args.repeats, own_cpu=cluster_cpu(client))
        # where a call's time goes: as src_dask runs it, and as a graph of many tasks
        calls = {"as_run": breakdown(A, psi, args.chi, client, threads=args.workers)}
        with dask.config.set({"src_dask.one-task-flops": 0}):
            calls["as_graph"] = breakdown(A, psi, args.chi, client, threads=args.workers)
    timings["src_dask_cluster"].update(
        cluster_startup_s=startup, cluster={"n_workers": args.workers, "threads_per_worker": 1,
                                            "processes": True,
                                            "worker_blas": list(worker_blas.values()),
                                            "worker_env": list(worker_env.values())},
        breakdown=calls)
    for name, b in calls.items():
        print(f"  cluster call {name}: {b['call']:.3f} s, {b['tasks']} tasks, compute "
              f"{b['compute']:.3f} s, idle {b['idle']:.3f} thread-s, "
              f"{sum(b['bytes_between_workers'].values()) / 1e6:.1f} MB between workers")
    print(f"src_dask_cluster: best {timings['src_dask_cluster']['best_s']:.3f} s "
          f"(cluster start {startup:.1f} s, not counted)", flush=True)
    return timings, results


def _worker_env() -> dict[str, str | None]:
    """What a worker process was started with that bears on its arithmetic: its BLAS
    threads, and glibc's malloc thresholds (Dask's nanny sets the trim threshold)."""
    import os

    return {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                           "MKL_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_")}


def errors_of(A, psi, results: dict[str, Any], L: int) -> dict[str, Any]:
    """Every result's error against the exact product (``src_dask.distance``: overlaps,
    no dense vector), and densely for L <= 14."""
    import src_dask

    t0 = time.perf_counter()
    errors: dict[str, Any] = {k: {"rel_error": src_dask.distance(y, A, psi)}
                              for k, y in results.items()}
    if "src_dask_cluster" in results:
        errors["cores_threads_vs_cluster"] = core_difference(
            results["src_dask_threads"], results["src_dask_cluster"])
    if L <= 14:  # small enough for a dense cross-check of the overlap method
        as_mps = {k: r.to_quimb() if hasattr(r, "to_quimb") else r for k, r in results.items()}
        x = A.apply(psi).to_dense().ravel()
        errors["dense_check"] = {k: float(np.linalg.norm(y.to_dense().ravel() - x)
                                          / np.linalg.norm(x)) for k, y in as_mps.items()}
    errors["check_s"] = time.perf_counter() - t0
    return errors


def report(record: Record) -> None:
    errors, gemm = record["errors"], record["gemm_complex128"]
    rows = [[k, f"{t['best_s']:.3f}", f"{t['ratio_to_quimb_src']:.3f}",
             f"{t['tflops'] * 1e3:.1f}", f"{t['fraction_of_gemm']:.1%}",
             f"{errors[k]['rel_error']:.4e}", runs_text(t["times_s"]),
             " ".join(f"{x:.2f}" for x in t.get("foreign_cpu_s", []))]
            for k, t in record["timings"].items()]
    legend = [PLAN_LEGEND, f"GEMM complex128 {gemm['n']}^3: {gemm['gflops']:.1f} GFLOP/s; "
              f"{record['flops']['total']:.3e} flop"]
    if "cores_threads_vs_cluster" in errors:
        legend.append("threads vs cluster, max relative core difference: "
                      f"{errors['cores_threads_vs_cluster']:.2e}")
    print_table(["run", "best s", "/quimb src", "GFLOP/s", "of GEMM", "rel err", "runs s",
                 "foreign cpu s"], rows, legend)
    print_targets(record["targets"])


def run(args, record: Record, device: Device) -> None:
    """GEMM rates, FLOPs, the timings, the errors and the targets, into ``record``."""
    record.update(measure_gemm(args, device))
    gemm = record["gemm_complex128"]
    A, psi = mpo_mps(args.L, args.chi, args.mpo_bond, args.seed)
    flops = record["flops"] = plan_flops(A, psi, chi_out=args.chi)
    print(f"problem: L={args.L}, chi={args.chi}, D={args.mpo_bond}: {flops['total']:.3e} flop")
    timings, results = time_methods(A, psi, args, device)
    for t in timings.values():
        t["ratio_to_quimb_src"] = t["best_s"] / timings["quimb_src"]["best_s"]
        t.update(rates(flops["total"], t["best_s"], gemm))
    record["timings"] = timings
    record["errors"] = errors_of(A, psi, results, args.L)
    ours = {k: t for k, t in timings.items() if k != "quimb_src"}
    record["targets"] = check_targets(MPO_MPS_TARGETS.get(("cpu", args.chi), ()), ours)


CONFIG = Config(
    measures="MPO·MPS by SRC on the CPU: src_dask (threads, LocalCluster) against quimb src",
    name=lambda args, device: f"cpu_mpo_mps_chi{args.chi}.json",
    device=lambda args: Device("cpu"), run=run, report=report,
    fields=lambda args: {"problem": mpo_mps_spec(args.L, args.chi, args.mpo_bond, args.seed),
                         "repeats": args.repeats, "flop_convention": PLAN_CONVENTION})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return execute_benchmark(CONFIG, parse_args(argv))


if __name__ == "__main__":
    main()
