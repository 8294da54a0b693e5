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
import datetime
import json
import os
import platform
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "cpu_mpo_mps_chi200.json"


# -- machine facts -----------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> Any:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not importable"
    return threadpool_info()


def versions() -> dict[str, str]:
    import dask
    import distributed
    import opt_einsum
    import quimb

    import src_dask

    out = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "quimb": quimb.__version__,
        "opt_einsum": opt_einsum.__version__,
        "src_dask": src_dask.__version__,
    }
    try:
        import scipy

        out["scipy"] = scipy.__version__
    except ImportError:
        pass
    return out


def git_state() -> dict[str, Any]:
    """The commit benchmarked and whether src/ differed from it (a dirty tree)."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=HERE.parent, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "src_modified": git("status", "--porcelain", "--", "src").splitlines()}
    except (OSError, subprocess.SubprocessError):
        return {}


def gemm_rate(n: int, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` complex128 ``n x n`` matmul rate, 8 n^3 flop each."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))).astype(np.complex128)
    b = (rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))).astype(np.complex128)
    c = a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = a @ b
        best = min(best, time.perf_counter() - t0)
    del c
    flops = 8.0 * n**3
    return {"n": n, "repeats": repeats, "best_s": best, "gflops": flops / best / 1e9}


# -- the problem -------------------------------------------------------------------
def make_problem(L: int, chi: int, mpo_bond: int, seed: int):
    import quimb.tensor as qtn

    A = qtn.MPO_rand(L, bond_dim=mpo_bond, phys_dim=2, dtype="complex128", seed=seed)
    psi = qtn.MPS_rand_state(L, bond_dim=chi, dtype="complex128", seed=seed + 1)
    return A, psi


def _padded(arrays: list[np.ndarray], mps: bool) -> list[tuple[int, ...]]:
    """Per-site shapes padded to (l, r, u, d) (an MPS gets d = 1), size-1 end bonds."""
    n = len(arrays)
    shapes = []
    for j, a in enumerate(arrays):
        s = list(a.shape)
        if j == 0:
            s.insert(0, 1)
        if j == n - 1:
            s.insert(1, 1)
        if mps:
            s.append(1)
        shapes.append(tuple(s))
    return shapes


def flop_count(A, psi, chi_out: int, sketch: int) -> dict[str, Any]:
    """FLOPs of SRC on ``A psi`` (DESIGN.md: complex multiply-add = 8 flop).

    Per site, opt_einsum's optimal path for the contractions of pass 1 and pass 2
    with the real bond sizes of ``A`` and ``psi`` at that site; ``opt_cost`` counts
    a multiply-add as 2, so flop = opt_cost / 2 * 8. QRs and rounding are not
    counted (they are small: one (R*U) x s QR per site).
    """
    import opt_einsum as oe

    t1 = _padded([t.data for t in A], mps=False)  # (a1, b1, x0, x1)
    t2 = _padded([t.data for t in psi], mps=True)  # (a2, b2, x1, 1)
    n = len(t1)
    s = sketch

    def cost(eq: str, *shapes: tuple[int, ...]) -> int:
        _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
        return int(info.opt_cost)

    pass1 = 0
    for j in range(n - 1):
        a1, b1, x0, x1 = t1[j]
        a2, b2 = t2[j][:2]
        pass1 += cost("sAB,sx,AaXx,Bbx->sab",
                      (s, a1, a2), (s, x0), (a1, b1, x0, x1), (a2, b2, x1))

    # output bonds of pass 2 (right to left): q = min(R * U, s)
    pass2_m = pass2_s = 0
    r = 1
    for j in range(n - 1, 0, -1):
        a1, b1, x0, x1 = t1[j]
        a2, b2 = t2[j][:2]
        m = cost("sAB,AaXx,Bbx,rab->rXs",
                 (s, a1, a2), (a1, b1, x0, x1), (a2, b2, x1), (r, b1, b2))
        q = min(r * x0, s)
        sp = cost("lrX,AaXx,Bbx,rab->lAB",
                  (q, r, x0), (a1, b1, x0, x1), (a2, b2, x1), (r, b1, b2))
        pass2_m += m
        pass2_s += sp
        r = q
    a1, b1, x0, x1 = t1[0]
    a2, b2 = t2[0][:2]
    last = cost("AaXx,Bbx,rab->rX", (a1, b1, x0, x1), (a2, b2, x1), (r, b1, b2))

    def flop(c: int) -> float:
        return c / 2 * 8

    total = flop(pass1 + pass2_m + pass2_s + last)
    return {
        "convention": "complex multiply-add = 8 flop; opt_einsum optimal path per site; "
                      "opt_cost/2 multiply-adds; QR excluded",
        "sketch_width": s,
        "pass1": flop(pass1),
        "pass2_sketch_M": flop(pass2_m),
        "pass2_env_S": flop(pass2_s),
        "site0": flop(last),
        "total": total,
        "mps_bonds": sorted({t2[j][1] for j in range(n - 1)}),
        "mpo_bonds": sorted({t1[j][1] for j in range(n - 1)}),
    }


# -- accuracy without dense vectors -------------------------------------------------
def _overlap(*tns, L: int) -> complex:
    """Full contraction of a ladder of 1D networks, site by site (tags I0, I1, ...)."""
    import quimb.tensor as qtn

    tn = qtn.TensorNetwork([t.copy() for t in tns], virtual=False)  # mangles inner inds
    tags = [f"I{j}" for j in range(L)]
    out = tn.contract_cumulative(tags, optimize="auto")
    return complex(out if not hasattr(out, "data") else out.data)


class ExactProduct:
    """``x = A psi`` kept as the pair (A, psi); norms and overlaps contracted per site."""

    def __init__(self, A, psi):
        self.L = psi.L
        self.A = A  # upper 'k{}', lower 'b{}'
        self.psi_b = psi.reindex_sites("b{}")  # joins A's lower legs
        # <x|x> = <psi|A^H A|psi>: the bra layer's lower legs renamed 'c{}'
        Ah = A.H.reindex({f"b{j}": f"c{j}" for j in range(self.L)})
        psi_c = psi.H.reindex_sites("c{}")
        self.norm2 = _overlap(psi_c, Ah, self.A, self.psi_b, L=self.L).real

    def rel_error(self, y) -> dict[str, float]:
        """``||y - x|| / ||x||`` via ``||y||^2 + ||x||^2 - 2 Re <y|x>``."""
        yx = _overlap(y.H, self.A, self.psi_b, L=self.L)
        yy = _overlap(y.H, y, L=self.L).real
        err2 = yy + self.norm2 - 2 * yx.real
        return {
            "rel_error": float(np.sqrt(max(err2, 0.0) / self.norm2)),
            "norm_ratio": float(np.sqrt(yy / self.norm2)),
        }


def core_difference(y1, y2) -> float:
    """max_j ||y1[j] - y2[j]|| / ||y1[j]|| over the cores of two TensorTrains."""
    worst = 0.0
    for a, b in zip(y1.to_numpy(), y2.to_numpy(), strict=True):
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
    return worst


# -- timing -------------------------------------------------------------------------
def _proc_stat() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = sum(f[:8]) - f[3] - f[4]  # all but idle and iowait (steal included)
    return busy / tick, f[7] / tick


def best_of(fn, repeats: int, own_cpu=time.process_time) -> tuple[dict[str, Any], Any]:
    """One warm-up call, then ``repeats`` timed calls.

    Also records, over each timed call, the CPU time the whole machine spent
    outside this benchmark (``foreign_cpu_s``: busy time in ``/proc/stat`` less
    ``own_cpu()``, which counts the benchmark's own processes) and the time the
    host stole from this VM: both should be ~0 on a quiet machine.
    """
    t0 = time.perf_counter()
    result = fn()
    warm = time.perf_counter() - t0
    times, foreign, steal = [], [], []
    for _ in range(repeats):
        s0, c0 = _proc_stat(), own_cpu()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        s1, c1 = _proc_stat(), own_cpu()
        if s0 is not None and s1 is not None:
            foreign.append(max(0.0, (s1[0] - s0[0]) - (c1 - c0) - (s1[1] - s0[1])))
            steal.append(s1[1] - s0[1])
    out = {"warmup_s": warm, "times_s": times, "best_s": min(times)}
    if foreign:
        out["foreign_cpu_s"] = foreign
        out["steal_s"] = steal
    return out, result


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
        "benchmark": "cpu MPO x MPS, SRC",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        "versions": versions(),
        "git": git_state(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OPENBLAS", "OMP_", "MKL_"))},
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
    flops = flop_count(A, psi, args.chi, sketch=args.chi)
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

            def cluster_cpu() -> float:
                workers = client.run(time.process_time)
                return time.process_time() + sum(workers.values())

            timings["src_dask_cluster"], results["src_dask_cluster"] = best_of(
                run_cluster, args.repeats, own_cpu=cluster_cpu)
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
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
