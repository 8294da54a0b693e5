# ruff: noqa: T201
"""MPO x MPS by SRC: src_dask against quimb's src, src-oversample and zipup, in one run.

The problem (DESIGN.md section 3, issue 5 (a)), for each chi in a list::

    A   = quimb.tensor.MPO_rand(50, bond_dim=4, phys_dim=2, dtype="complex128")
    psi = quimb.tensor.MPS_rand_state(50, bond_dim=chi, dtype="complex128")
    y   = A psi compressed to chi_out = chi

On a GPU (CuPy importable and a CUDA device visible) every method runs on the
device: quimb's arrays are CuPy arrays, and src_dask gets the same CuPy-backed
objects (Dask's threaded scheduler, ``src_dask.device = "gpu"``). Otherwise
everything runs on the CPU with NumPy. In one process the script

1. measures the device's complex128 GEMM rate (8192^3 on a GPU, 2048^3 on a CPU);
2. for each chi: times ``psi.gate_with_mpo(A, method=m, max_bond=chi)`` for m in
   src, src-oversample, zipup, and ``src_dask.apply(A, psi, chi)`` plain and with
   ``oversample="auto"`` (one warm-up, then the best of ``--repeats``; the device
   is synchronized before each timer stops), in the order quimb src, ours, quimb
   src-oversample, ours oversampled, zipup;
3. reports per run: wall time, FLOPs (DESIGN.md convention; zipup not counted),
   TFLOP/s, fraction of the GEMM rate, ratio to quimb src, peak host RSS and
   device memory, bytes spilled (0: threaded runs do not spill), and the error
   against the exact product ``A psi`` (overlaps, no dense vectors);
4. prints a table, writes JSON (after every chi, so a run cut short keeps what
   it finished) and a PNG of time against chi (when matplotlib is importable).

    python benchmarks/bench_mpo_mps.py                      # chi 200 500 1000 2000
    python benchmarks/bench_mpo_mps.py --chi 1000 2000 --merge --no-zipup
    python benchmarks/bench_mpo_mps.py --quick              # L=12, chi 16 32: smoke test
    python benchmarks/bench_mpo_mps.py --plot-only benchmarks/results/mpo_mps_gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import warnings
from pathlib import Path
from typing import Any

from _common import (
    Device,
    ExactProduct,
    PeakMemory,
    add_merge_option,
    best_of,
    earlier_record,
    gb,
    make_problem,
    mpo_mps_flops,
    output_path,
    print_header,
    rates,
    run_gemm,
    run_record,
    write_json,
)

#: Every method, in the order it runs; quimb's src must come first (ratios refer to it).
# compared pairs back to back (quimb src then ours, then both oversampled), zipup last:
# a ratio then compares two runs made under the same conditions (an earlier order ran
# ours after ~80 s of quimb's zipup and oversampled SVDs)
METHODS = ("quimb_src", "src_dask", "quimb_src_oversample", "src_dask_oversample", "quimb_zipup")
QUIMB_METHOD = {"quimb_src": "src", "quimb_src_oversample": "src-oversample",
                "quimb_zipup": "zipup"}
#: Issue 5's targets for this problem: (device, chi, what, bound).
TARGETS = (("gpu", 1000, "ratio_to_quimb_src", 0.6), ("gpu", 2000, "fraction_of_gemm", 0.6),
           ("cpu", 200, "ratio_to_quimb_src", 0.5))


def sketch_width(method: str, chi: int) -> int | None:
    """Sketch columns of a method's SRC step (None: not an SRC method)."""
    if method in ("quimb_src", "src_dask"):
        return chi
    if method == "quimb_src_oversample":  # quimb's default max_bond_oversample
        return max(round(1.5 * chi), chi + 10)
    if method == "src_dask_oversample":  # oversample="auto"
        return chi + max(math.ceil(chi / 2), 10)
    return None


# -- one run of each method ----------------------------------------------------------
def runner(method: str, A, psi, chi: int, device: Device, seed: int):
    """A no-argument function computing ``A psi`` compressed to ``chi`` by ``method``."""
    if method in QUIMB_METHOD:
        options = {"seed": seed} if method != "quimb_zipup" else {}
        return lambda: psi.gate_with_mpo(A, method=QUIMB_METHOD[method], max_bond=chi,
                                         **options)
    import dask

    import src_dask

    oversample = "auto" if method == "src_dask_oversample" else 0

    def run():
        with dask.config.set({"src_dask.device": device.name}):
            return src_dask.apply(A, psi, chi_out=chi, seed=seed, oversample=oversample)

    return run


def measure(fn, args: argparse.Namespace, device: Device,
            flops: float | None, gemm: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Time ``fn`` (warm-up, best of N) while sampling memory; the run's JSON entry."""
    gc.collect()
    device.free_pool()
    with PeakMemory(device) as memory:
        timing, result = best_of(fn, args.repeats, sync=device.sync, budget_s=args.budget_s)
    entry = {**timing, "flops": flops, **rates(flops, timing["best_s"], gemm),
             "memory": memory.result(), "spilled_bytes": 0,
             "spill_note": "threaded run in one process: nothing spills"}
    return entry, result


def as_quimb(result, device: Device):
    """A result as a quimb MPS on ``device`` (src_dask returns NumPy TensorTrains)."""
    return device.to_device(result.to_quimb()) if hasattr(result, "to_quimb") else result


def methods_for(chi: int, args: argparse.Namespace) -> list[str]:
    """The methods to run at ``chi`` after the skip flags."""
    skip = set()
    if args.no_zipup or (args.slow_max_chi and chi > args.slow_max_chi):
        skip.add("quimb_zipup")
    if args.no_quimb_oversample or (args.slow_max_chi and chi > args.slow_max_chi):
        skip.add("quimb_src_oversample")
    if args.no_oversample:
        skip.add("src_dask_oversample")
    return [m for m in METHODS if m not in skip]


def run_chi(chi: int, args: argparse.Namespace, device: Device,
            gemm: dict[str, Any]) -> dict[str, Any]:
    """Every method at one chi: timings, rates, memory and errors.

    Each result's error is computed right after its timing and the result
    dropped, so that results do not pile up in device memory.
    """
    A, psi = make_problem(args.L, chi, args.mpo_bond, args.seed, device)
    out: dict[str, Any] = {"chi": chi, "gemm_tflops": gemm["tflops"], "runs": {}}
    exact = None
    if args.error_max_chi is None or chi <= args.error_max_chi:
        exact = ExactProduct(A, psi)
        out["exact_norm"] = math.sqrt(exact.norm2)
    for method in methods_for(chi, args):
        s = sketch_width(method, chi)
        flops = mpo_mps_flops(A, psi, sketch=s) if s else None
        entry, result = measure(runner(method, A, psi, chi, device, args.seed), args, device,
                                flops and flops["total"], gemm)
        entry["sketch_width"] = s
        if flops:
            entry["flop_breakdown"] = flops
        if exact is not None:
            entry.update(exact.rel_error(as_quimb(result, device)))
        del result
        out["runs"][method] = entry
        print(f"  chi={chi:<5} {method:<22} best {entry['best_s']:9.3f} s"
              f"{'  (warm-up only)' if entry.get('warmup_only') else ''}", flush=True)
    runs = out["runs"]
    for entry in runs.values():
        entry["ratio_to_quimb_src"] = entry["best_s"] / runs["quimb_src"]["best_s"]
    for method in ("src_dask", "src_dask_oversample"):
        peer = method.replace("src_dask", "quimb_src")
        if exact is not None and method in runs and peer in runs:
            runs[method]["error_ratio_to_quimb"] = (runs[method]["rel_error"]
                                                    / runs[peer]["rel_error"])
    return out


# -- report ---------------------------------------------------------------------------
def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 5's targets that this record's device and chis cover, met or not."""
    out = []
    device = record["device"]["name"]
    for dev, chi, key, bound in TARGETS:
        entry = record["results"].get(str(chi), {}).get("runs", {}).get("src_dask")
        if dev != device or entry is None or entry.get(key) is None:
            continue
        value = entry[key]
        met = value <= bound if key.startswith("ratio") else value >= bound
        out.append({"chi": chi, "what": f"src_dask {key}", "bound": bound, "value": value,
                    "met": met})
    return out


def print_table(record: dict[str, Any]) -> None:
    print()
    print(f"{'chi':>5} {'method':<22}{'best s':>9}{'/quimb src':>11}{'GFLOP/s':>10}"
          f"{'of GEMM':>9}{'rel err':>11}{'host GB':>9}{'device GB':>10}{'pool GB':>9}")
    for chi, res in sorted(record["results"].items(), key=lambda kv: int(kv[0])):
        for method, e in res["runs"].items():
            mem = e["memory"]
            gflops = "-" if e["tflops"] is None else f"{e['tflops'] * 1e3:.1f}"
            frac = "-" if e["fraction_of_gemm"] is None else f"{e['fraction_of_gemm']:.1%}"
            err = f"{e['rel_error']:.4e}" if "rel_error" in e else "-"
            print(f"{chi:>5} {method:<22}{e['best_s']:>9.3f}{e['ratio_to_quimb_src']:>11.3f}"
                  f"{gflops:>10}{frac:>9}{err:>11}{gb(mem['peak_host_rss_bytes']):>9}"
                  f"{gb(mem['peak_device_used_bytes'], mem['baseline_device_used_bytes']):>10}"
                  f"{gb(mem['peak_pool_total_bytes'], mem['baseline_pool_total_bytes']):>9}")
    gemm = record["gemm_complex128"]
    print(f"GEMM complex128 {gemm['n']}^3 on the {gemm['device'].upper()}: "
          f"{gemm['tflops']:.3f} TFLOP/s. host GB: peak RSS; device GB: peak device-wide "
          "use above the baseline; pool GB: CuPy pool high-water above the baseline")
    for t in record["targets"]:
        print(f"target chi={t['chi']}: {t['what']} {t['value']:.3f} vs {t['bound']}: "
              f"{'met' if t['met'] else 'NOT met'}")


def plot(record: dict[str, Any], path: Path) -> None:
    """Time against chi per method (log-log) as a PNG; skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no plot. Make it later with "
              f"--plot-only {path.with_suffix('.json')}")
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    chis = sorted(record["results"], key=int)
    for method in METHODS:
        points = [(int(c), record["results"][c]["runs"][method]["best_s"])
                  for c in chis if method in record["results"][c]["runs"]]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.set(xscale="log", yscale="log", xlabel="chi = chi_out", ylabel="best time (s)",
           title=f"MPO x MPS (L={record['problem']['L']}, complex128), "
                 f"{record['device'].get('gpu', record['cpu_model'])}")
    ax.set_xticks([int(c) for c in chis], chis)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# -- main ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: L=12, chi 16 32, small GEMM; no JSON unless --out")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto: the GPU when CuPy sees one (default)")
    p.add_argument("--L", type=int, default=None, help="sites (default 50; 12 with --quick)")
    p.add_argument("--chi", type=int, nargs="+", default=None,
                   help="MPS bonds = chi_out (default 200 500 1000 2000; 16 32 with --quick)")
    p.add_argument("--mpo-bond", type=int, default=4)
    p.add_argument("--seed", type=int, default=42, help="seed of the random MPO (MPS: seed+1); "
                   "the sketches use seed 42 too")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--budget-s", type=float, default=60.0,
                   help="fewer timed runs of a method when the warm-up shows that --repeats "
                        "would take longer (none: the warm-up is the measurement)")
    p.add_argument("--gemm-n", type=int, default=None,
                   help="GEMM size (default 8192 on a GPU, 2048 on a CPU; a quarter with --quick)")
    p.add_argument("--no-zipup", action="store_true", help="skip quimb's zipup")
    p.add_argument("--no-quimb-oversample", action="store_true",
                   help="skip quimb's src-oversample")
    p.add_argument("--no-oversample", action="store_true",
                   help="skip src_dask with oversample='auto'")
    p.add_argument("--slow-max-chi", type=int, default=None,
                   help="skip quimb's zipup and src-oversample above this chi")
    p.add_argument("--error-max-chi", type=int, default=None,
                   help="compute errors against the exact product only up to this chi")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output, or a directory for it (default benchmarks/results/"
                        "mpo_mps_<device>.json; none with --quick); the PNG goes next to it")
    add_merge_option(p, "the other chis (each with the GEMM rate of its own run)")
    p.add_argument("--plot-only", type=Path, default=None, metavar="JSON",
                   help="only draw the PNG of an existing JSON file")
    args = p.parse_args(argv)
    args.L = args.L or (12 if args.quick else 50)
    args.chi = args.chi or ([16, 32] if args.quick else [200, 500, 1000, 2000])
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Couldn't import `kahypar`")
    if args.plot_only:
        record = json.loads(args.plot_only.read_text())
        plot(record, args.plot_only.with_suffix(".png"))
        return record
    device = Device(args.device)
    args.out = output_path(args.out, f"mpo_mps_{device.name}.json", args.quick)

    record: dict[str, Any] = {
        **run_record("MPO x MPS: src_dask against quimb src, src-oversample, zipup", device),
        "problem": {"L": args.L, "mpo": f"MPO_rand({args.L}, bond_dim={args.mpo_bond}, "
                                        f"phys_dim=2, dtype='complex128', seed={args.seed})",
                    "mps": f"MPS_rand_state({args.L}, bond_dim=chi, dtype='complex128', "
                           f"seed={args.seed + 1})", "chi_out": "chi", "chis": args.chi,
                    "sketch_seed": args.seed},
        "repeats": args.repeats, "budget_s": args.budget_s,
        "notes": ["FLOPs of oversampled runs count the SRC step with its wider sketch, not "
                  "the rounding sweep; zipup's FLOPs are not counted",
                  "src_dask returns NumPy cores (device -> host copy included in its time); "
                  "quimb's result stays on the device"],
        "results": {},
    }
    record["results"] = earlier_record(args.merge, args.out).get("results", {})
    print_header(record)
    gemm = record["gemm_complex128"] = run_gemm(args.gemm_n, args.quick, device)

    for chi in args.chi:
        record["results"][str(chi)] = run_chi(chi, args, device, gemm)
        record["targets"] = targets(record)
        if args.out is not None:
            write_json(record, args.out)
    print_table(record)
    if args.out is not None:
        plot(record, args.out.with_suffix(".png"))
    return record


if __name__ == "__main__":
    main()
