# ruff: noqa: T201
"""MPO·MPS by SRC for several chi: src_dask against quimb's src, src-oversample and zipup.

The problem of bench_cpu.py (L=50, MPO bond 4, chi_out = chi) for each chi in
``--chi``, on the GPU where CuPy sees one (quimb and src_dask on the same CuPy-backed
networks, Dask's threaded scheduler), else on the CPU. After the GEMM rate, each chi
times, one warm-up then the best of ``--repeats`` (the device synchronized before each
timer stops), quimb src, src_dask, quimb src-oversample, src_dask
``oversample="auto"`` and zipup, in that order (compared pairs back to back;
``--budget-s`` cuts a slow method's repeats); per run the record holds the time, FLOPs
(``src_dask.plan``'s; zipup not counted) and rates, the ratio to quimb src, peak host
and device memory and the error against the exact product. It is written after every
chi (benchmarks/results/mpo_mps_<device>.json), with a PNG of time against chi.

    python benchmarks/bench_mpo_mps.py                      # chi 200 500 1000 2000
    python benchmarks/bench_mpo_mps.py --chi 1000 2000 --merge --no-zipup
    python benchmarks/bench_mpo_mps.py --quick              # L=12, chi 16 32: smoke test
    python benchmarks/bench_mpo_mps.py --chi 1000 --client  # and through a Client

With ``--client`` each chi also runs src_dask through ``src_dask.cluster()`` and a
``Client`` (one worker per GPU; on the CPU ``--workers`` single-threaded ones), after the
threaded run and against it: ``src_dask_client_numpy`` takes NumPy inputs from this
process (they go to the worker with each call, straight where the client reaches it:
``inputs_sent_s`` of the last call, from the result's ``run_info``; ``_kept``: the result
left on the cluster), ``src_dask_client_persisted`` inputs already on
the workers (Dask arrays persisted there, on the device for a GPU; the persisting is
timed apart as ``inputs_to_cluster_s``), ``src_dask_client_persisted_kept`` the same
with the result left there too (``persist=True``: a loop's next call takes it). Issue
29's targets are on ``ratio_to_threads`` of the last and ``ratio_to_threads_less_sent``
of the first (``problems.CLIENT_TARGETS``).
    python benchmarks/bench_mpo_mps.py --plot-only benchmarks/results/mpo_mps_gpu.json
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from pathlib import Path
from typing import Any

import dask
from device import Device, run_gemm
from flops import PLAN_CONVENTION, PLAN_LEGEND, rates
from harness import (
    Config,
    Record,
    cell,
    check_targets,
    earlier_record,
    execute_benchmark,
    gb,
    parser,
    print_table,
    print_targets,
)
from memory import PeakMemory
from methods import MPO_MPS_METHODS, method_flops, mpo_mps_runner
from problems import CLIENT_TARGETS, MPO_MPS_TARGETS, mpo_mps, mpo_mps_spec
from timing import best_of, compute_seconds, runs_text

import src_dask


def parse_args(argv: list[str] | None = None):
    p = parser(__doc__, quick="L=12, chi 16 32, small GEMM, one timed run", device=True,
               repeats=(3, 1), seed=42, gemm=True, out="mpo_mps_<device>.json",
               merge="the other chis (each with the GEMM rate of its own run)")
    p.sized("--L", type=int, full=50, quick=12, help="sites")
    p.sized("--chi", type=int, nargs="+", full=[200, 500, 1000, 2000], quick=[16, 32],
            help="MPS bonds = chi_out")
    p.add_argument("--mpo-bond", type=int, default=4)
    p.add_argument("--budget-s", type=float, default=60.0,
                   help="fewer timed runs of a method when the warm-up shows that --repeats "
                        "would take longer (none: the warm-up is the measurement)")
    p.add_argument("--no-zipup", action="store_true", help="skip quimb's zipup")
    p.add_argument("--no-quimb-oversample", action="store_true",
                   help="skip quimb's src-oversample")
    p.add_argument("--no-oversample", action="store_true",
                   help="skip src_dask with oversample='auto'")
    p.add_argument("--slow-max-chi", type=int, default=None,
                   help="skip quimb's zipup and src-oversample above this chi")
    p.add_argument("--error-max-chi", type=int, default=None,
                   help="compute errors against the exact product only up to this chi")
    p.add_argument("--client", action="store_true",
                   help="also time src_dask through src_dask.cluster() and a Client")
    p.add_argument("--workers", type=int, default=2,
                   help="single-threaded CPU workers of --client's cluster (CPU only)")
    p.add_argument("--plot-only", type=Path, default=None, metavar="JSON",
                   help="only draw the PNG of an existing JSON file")
    return p.parse_args(argv)


def methods_for(chi: int, args) -> list[str]:
    """The methods to run at ``chi`` after the skip flags."""
    slow = bool(args.slow_max_chi and chi > args.slow_max_chi)
    skip = {m for m, off in (("quimb_zipup", args.no_zipup or slow),
                             ("quimb_src_oversample", args.no_quimb_oversample or slow),
                             ("src_dask_oversample", args.no_oversample)) if off}
    return [m for m in MPO_MPS_METHODS if m not in skip]


def measure(fn, args, device: Device, flops: float | None,
            gemm: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Time ``fn`` (warm-up, best of N) while sampling memory; the run's JSON entry."""
    gc.collect()
    device.free_pool()
    with PeakMemory(device) as memory:
        timing, result = best_of(fn, args.repeats, sync=device.sync, budget_s=args.budget_s)
    entry = {**timing, "flops": flops, **rates(flops, timing["best_s"], gemm),
             "memory": memory.result(), "spilled_bytes": 0,
             "spill_note": "threaded run in one process: nothing spills"}
    return entry, result


def client_runs(A, psi, chi: int, args, device: Device, gemm: dict[str, Any], client,
                flops: float) -> dict[str, dict[str, Any]]:
    """src_dask through ``client``: NumPy inputs from this process, then inputs persisted
    on the workers (on the device for a GPU), each timed as :func:`measure` times."""
    import dask.array as da
    from distributed import get_task_stream, wait

    a, x = (src_dask.TensorTrain(t) for t in (A, psi))
    numpy_in = [src_dask.TensorTrain(t.to_numpy(), t.kind) for t in (a, x)]
    entries: dict[str, dict[str, Any]] = {}

    def on_cluster(t):
        cores = [da.from_array(c, chunks=c.shape) for c in t.to_numpy()]
        if device.is_gpu:
            cupy = device.xp
            cores = [c.map_blocks(cupy.asarray, dtype=c.dtype,
                                  meta=cupy.empty((0,) * c.ndim, c.dtype)) for c in cores]
        return src_dask.TensorTrain(client.persist(cores), t.kind)

    t0 = time.perf_counter()
    persisted = [on_cluster(t) for t in numpy_in]
    wait([c for t in persisted for c in t])
    moved = time.perf_counter() - t0
    for name, (a_in, x_in), keep in (("src_dask_client_numpy", numpy_in, False),
                                     ("src_dask_client_numpy_kept", numpy_in, True),
                                     ("src_dask_client_persisted_kept", persisted, True),
                                     ("src_dask_client_persisted", persisted, False)):
        def call(a_in=a_in, x_in=x_in, keep=keep):
            with dask.config.set({"src_dask.device": device.name}):
                y = src_dask.apply(a_in, x_in, chi_out=chi, seed=args.seed, client=client,
                                   persist=keep)
                if keep:  # done on the workers, the cores left there
                    wait([c for c in y])
                return y

        with get_task_stream(client=client) as stream:
            entry, result = measure(call, args, device, flops, gemm)
        entry["spill_note"] = "on the cluster's workers: spilling not counted here"
        # of a call's time, how much its tasks computed (the rest: around them)
        entry["task_compute_s_per_call"] = compute_seconds(stream.data) / (
            len(entry["times_s"]) + ("warmup_s" in entry))
        if result.run_info.sent_s is not None:  # the inputs' transfer, apart (issue 29)
            entry["inputs_sent_bytes"] = result.run_info.sent_bytes
            entry["inputs_sent_s"] = result.run_info.sent_s
        entries[name] = entry
        print(f"  chi={chi:<5} {name:<22} best {entry['best_s']:9.3f} s"
              + (f" (inputs sent in {entry['inputs_sent_s']:.3f} s)"
                 if "inputs_sent_s" in entry else ""), flush=True)
    entries["src_dask_client_persisted"]["inputs_to_cluster_s"] = moved
    entries["src_dask_client_persisted"]["result"] = result
    return entries


def run_chi(chi: int, args, device: Device, gemm: dict[str, Any]) -> dict[str, Any]:
    """Every method at one chi: timings, rates, memory and errors (and, with
    ``--client``, the Client runs of :func:`client_runs` on a cluster started after
    the threaded runs: with a Client alive, src_dask would compute on it).

    Each result's error is computed right after its timing and the result
    dropped, so that results do not pile up in device memory.
    """
    A, psi = mpo_mps(args.L, chi, args.mpo_bond, args.seed, device)
    out: dict[str, Any] = {"chi": chi, "gemm_tflops": gemm["tflops"], "runs": {}}
    # the error against the exact product: src_dask.distance (overlaps, no dense vector)
    exact = args.error_max_chi is None or chi <= args.error_max_chi
    runs = out["runs"]
    for method in methods_for(chi, args):
        flops = method_flops(method, A, psi, chi)
        entry, result = measure(mpo_mps_runner(method, A, psi, chi, device, args.seed), args,
                                device, flops and flops["total"], gemm)
        entry["sketch_width"] = flops and flops["sketch_width"]
        if flops:
            entry["flop_breakdown"] = flops
        if exact:
            entry["rel_error"] = src_dask.distance(result, A, psi)
        del result
        runs[method] = entry
        print(f"  chi={chi:<5} {method:<22} best {entry['best_s']:9.3f} s"
              f"{'  (warm-up only)' if entry.get('warmup_only') else ''}", flush=True)
    if args.client:
        with client_of(args, device) as client:
            more = client_runs(A, psi, chi, args, device, gemm, client,
                               method_flops("src_dask", A, psi, chi)["total"])
        result = more["src_dask_client_persisted"].pop("result")
        if exact:
            more["src_dask_client_persisted"]["rel_error"] = src_dask.distance(result, A, psi)
        del result
        for entry in more.values():
            entry["ratio_to_threads"] = entry["best_s"] / runs["src_dask"]["best_s"]
            if "inputs_sent_s" in entry:  # the call less its inputs' transfer
                entry["ratio_to_threads_less_sent"] = (
                    (entry["best_s"] - entry["inputs_sent_s"]) / runs["src_dask"]["best_s"])
        runs.update(more)
    for entry in runs.values():
        entry["ratio_to_quimb_src"] = entry["best_s"] / runs["quimb_src"]["best_s"]
    for method in ("src_dask", "src_dask_oversample"):
        peer = method.replace("src_dask", "quimb_src")
        if exact and method in runs and peer in runs:
            runs[method]["error_ratio_to_quimb"] = (runs[method]["rel_error"]
                                                    / runs[peer]["rel_error"])
    return out


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets that this record's device and chis cover, on the src_dask run."""
    out = []
    for chi, res in record["results"].items():
        found = MPO_MPS_TARGETS.get((record["device"]["name"], int(chi)), ())
        run = {f"src_dask chi={chi}": res["runs"].get("src_dask", {})}
        out += check_targets(found, run)
        for name, target in CLIENT_TARGETS.get((record["device"]["name"], int(chi)), ()):
            if name in res["runs"]:
                out += check_targets((target,), {f"{name} chi={chi}": res["runs"][name]})
    return out


def report(record: dict[str, Any]) -> None:
    rows = []
    for chi, res in sorted(record["results"].items(), key=lambda kv: int(kv[0])):
        for method, e in res["runs"].items():
            mem = e["memory"]
            rows.append([chi, method, f"{e['best_s']:.3f}", f"{e['ratio_to_quimb_src']:.3f}",
                         cell(e["tflops"] and e["tflops"] * 1e3, ".1f"),
                         cell(e["fraction_of_gemm"], ".1%"), cell(e.get("rel_error"), ".4e"),
                         gb(mem["peak_host_rss_bytes"]),
                         gb(mem["peak_device_used_bytes"], mem["baseline_device_used_bytes"]),
                         gb(mem["peak_pool_total_bytes"], mem["baseline_pool_total_bytes"]),
                         "(warm-up only)" if e.get("warmup_only") else runs_text(e["times_s"])])
    gemm = record["gemm_complex128"]
    print_table(["chi", "method", "best s", "/quimb src", "GFLOP/s", "of GEMM", "rel err",
                 "host GB", "device GB", "pool GB", "runs s"], rows, [
        PLAN_LEGEND,
        f"GEMM complex128 {gemm['n']}^3 on the {gemm['device'].upper()}: "
        f"{gemm['tflops']:.3f} TFLOP/s. host GB: peak RSS; device GB: peak device-wide use "
        "above the baseline; pool GB: CuPy pool high-water above the baseline"],
        align="rlrrrrrrrrl")
    print_targets(record["targets"])


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
    for method in MPO_MPS_METHODS:
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


def run(args, record: Record, device: Device) -> None:
    """The GEMM rate, then every chi (the record written after each), into ``record``."""
    record["results"] = earlier_record(args.merge, record.path).get("results", {})
    gemm = record["gemm_complex128"] = run_gemm(args.gemm_n, args.quick, device)
    for chi in args.chi:
        record["results"][str(chi)] = run_chi(chi, args, device, gemm)
        record["targets"] = targets(record)
        record.save()


@contextlib.contextmanager
def client_of(args, device: Device):
    """A Client of ``src_dask.cluster()``: one worker per GPU, or ``--workers``
    single-threaded CPU workers."""
    from distributed import Client

    options = {"gpus": device.gpus} if device.is_gpu else {"n_workers": args.workers,
                                                             "threads_per_worker": 1}
    with src_dask.cluster(**options) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(cluster.workers), timeout=120)
        yield client


def report_and_plot(record: Record) -> None:
    report(record)
    if record.path is not None:
        plot(record, record.path.with_suffix(".png"))


CONFIG = Config(
    measures="MPO·MPS by SRC: src_dask against quimb src, src-oversample, zipup",
    name=lambda args, device: f"mpo_mps_{device.name}.json",
    device=lambda args: Device(args.device), run=run, report=report_and_plot,
    fields=lambda args: {
        "problem": {**mpo_mps_spec(args.L, "chi", args.mpo_bond, args.seed), "chis": args.chi,
                    "sketch_seed": args.seed},
        "repeats": args.repeats, "budget_s": args.budget_s, "flop_convention": PLAN_CONVENTION,
        "notes": ["FLOPs of oversampled runs count the SRC step with its wider sketch, not "
                  "the rounding sweep; zipup's FLOPs are not counted",
                  "on a GPU both take CuPy inputs and leave their results on the device "
                  "(src_dask: CuPy in, CuPy out without a client)"]})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.plot_only:
        record = json.loads(args.plot_only.read_text())
        plot(record, args.plot_only.with_suffix(".png"))
        return record
    return execute_benchmark(CONFIG, args)


if __name__ == "__main__":
    main()
