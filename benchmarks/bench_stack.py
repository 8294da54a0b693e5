# ruff: noqa: T201
"""The src-method stack N·V·M·U from Zarr: 1 against 2 workers, with and without ``store=``.

The problem (DESIGN.md section 3, issue 5 (b) and (c))::

    N, V, M, U = four random MPOs of 50 sites, physical legs 4 x 4, bonds 4, 4, D_M, 4,
                 complex128, entries (N(0,1) + i N(0,1)) / sqrt(bond * 4)
    y = src_dask.src(N, V, M, U, chi_out=chi_out)

The script

1. checks the disk under ``--workdir`` and generates the four trains into Zarr
   with ``src_dask.save``, one site at a time from Dask's random generator (a
   51 GB train never sits in memory); inputs of the same size and seed already
   there are reused;
2. measures the device's complex128 GEMM rate;
3. optionally (``--quimb``, on by default where the stack and its environments
   fit in memory) times quimb's ``tensor_network_1d_compress(N V M U, method="src")``
   in this process, on the device, as the peer for "ratio to quimb";
4. for 1 and 2 workers (``src_dask.cluster``: one GPU each, or on a single GPU
   two ``dask cuda worker`` processes that share it; CPU ``LocalCluster`` workers
   without a GPU) and without / with a run store: warms the workers up on a tiny
   stack, then times ``src_dask.src`` on the opened trains;
5. reports per run: wall time, FLOPs (DESIGN.md convention), TFLOP/s, fraction
   of the GEMM rate, ratio to quimb, peak host RSS (this process and the
   workers) and device memory, bytes spilled by the workers, and the largest
   core difference from the first run (the sketch depends only on the seed);
6. prints a table and writes JSON after every run.

    python benchmarks/bench_stack.py                           # D_M=1000, chi_out=500
    python benchmarks/bench_stack.py --dm 2000 --chi-out 1000 --modes memory
    python benchmarks/bench_stack.py --quick --workdir /tmp/x  # 8 sites, D_M=16, chi_out=8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    HERE,
    Device,
    PeakMemory,
    add_merge_option,
    best_of,
    cluster_cpu,
    core_difference,
    earlier_record,
    env_bytes,
    gb,
    output_path,
    padded,
    print_header,
    rates,
    rmm_options,
    run_gemm,
    run_record,
    spill_counters,
    spilled_between,
    src_flops,
    task_profile,
    write_json,
)

import src_dask
from src_dask._progress import has_bokeh
from src_dask.problems import stack_mpo

#: The stack's factors, leftmost first: name and bond (None: D_M).
FACTORS = (("N", 4), ("V", 4), ("M", None), ("U", 4))
#: Issue 5's targets on one H200: (D_M, chi_out, seconds at most, fraction of GEMM at least).
TARGETS = ((1000, 500, 22.0, 0.7), (2000, 1000, 175.0, 0.7))
#: Results larger than this are not kept on the client to compare runs' cores.
COMPARE_MAX_BYTES = 8 * 10**9


# -- the inputs -------------------------------------------------------------------
def spec(args: argparse.Namespace) -> dict[str, Any]:
    """What identifies the generated inputs."""
    return {"sites": args.sites, "phys": args.phys, "seed": args.seed, "dtype": "complex128",
            "bonds": {name: bond or args.dm for name, bond in FACTORS}}


def core_shape(j: int, n: int, bond: int, phys: int) -> tuple[int, ...]:
    """quimb's MPO layout: (l, r, u, d), first site (r, u, d), last (l, u, d)."""
    return (*((bond,) if j > 0 else ()), *((bond,) if j < n - 1 else ()), phys, phys)


def site_shapes(sp: dict[str, Any]) -> list[list[tuple[int, ...]]]:
    """Per site, the padded (a, b, u, d) shape of every factor (for FLOPs and sizes)."""
    n, phys = sp["sites"], sp["phys"]
    per_factor = [padded([core_shape(j, n, bond, phys) for j in range(n)], mps=False)
                  for bond in sp["bonds"].values()]
    return [list(site) for site in zip(*per_factor, strict=True)]


def input_bytes(sp: dict[str, Any]) -> int:
    return sum(int(np.prod(t)) * 16 for site in site_shapes(sp) for t in site)


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or would hold it)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def generate_inputs(sp: dict[str, Any], workdir: Path, regenerate: bool) -> dict[str, Any]:
    """The four trains in ``workdir/inputs`` (reused when the spec matches)."""
    inputs = workdir / "inputs"
    marker = inputs / "spec.json"
    need = input_bytes(sp)
    if not regenerate and marker.exists() and json.loads(marker.read_text()) == sp:
        print(f"inputs: reusing {inputs} ({need / 1e9:.2f} GB)")
        return {"reused": True, "bytes": need}
    if inputs.exists():
        shutil.rmtree(inputs)
    free = free_bytes(workdir)
    print(f"inputs: {need / 1e9:.2f} GB to write under {inputs}; {free / 1e9:.1f} GB free")
    if free < 1.02 * need:
        raise SystemExit(f"not enough disk under {workdir}: the inputs need {need / 1e9:.2f} GB, "
                         f"{free / 1e9:.1f} GB are free (use --workdir elsewhere)")
    t0 = time.perf_counter()
    for i, (name, bond) in enumerate(sp["bonds"].items()):
        train = stack_mpo(sp["sites"], bond, sp["phys"], seed=sp["seed"] + i)
        src_dask.save(train, inputs / name, overwrite=True)
    seconds = time.perf_counter() - t0
    marker.write_text(json.dumps(sp))
    print(f"inputs: written in {seconds:.1f} s ({need / seconds / 1e9:.2f} GB/s)")
    return {"reused": False, "bytes": need, "seconds": seconds}


def open_inputs(sp: dict[str, Any], workdir: Path) -> list[src_dask.TensorTrain]:
    return [src_dask.open(workdir / "inputs" / name) for name in sp["bonds"]]


def tiny_stack(phys: int) -> list[src_dask.TensorTrain]:
    """A small in-memory stack of the same depth and legs, to warm workers and quimb up."""
    rng = np.random.default_rng(0)
    trains = []
    for bond in (2, 2, 3, 2):
        cores = []
        for j in range(6):
            shape = core_shape(j, 6, bond, phys)
            cores.append(rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
        trains.append(src_dask.TensorTrain(cores, "mpo"))
    return trains


# -- quimb as the peer ----------------------------------------------------------------
def quimb_stack(trains: list[src_dask.TensorTrain], device: Device):
    """N V M U as one quimb network (four MPO layers) with its arrays on ``device``."""
    import quimb.tensor as qtn

    layers = [device.to_device(t.to_quimb()) for t in trains]
    stack = layers[-1]
    for layer in reversed(layers[:-1]):  # N (V (M U))
        stack = qtn.tensor_network_apply_op_op(layer, stack)
    return stack


def run_quimb(trains, args: argparse.Namespace, device: Device, flops: float,
              gemm: dict[str, Any]) -> dict[str, Any]:
    """quimb's SRC on the whole stack, in this process: a tiny warm-up, then ``--repeats``
    timed runs."""
    import quimb.tensor as qtn

    def compress(stack, chi):
        return qtn.tensor_network_1d_compress(stack, max_bond=chi, method="src", seed=args.seed)

    compress(quimb_stack(tiny_stack(args.phys), device), 4)
    stack = quimb_stack(trains, device)
    device.free_pool()
    with PeakMemory(device) as memory:
        timing, _ = best_of(lambda: compress(stack, args.chi_out), args.repeats,
                            sync=device.sync, warmup=False)
    stack = None
    device.free_pool()
    return {**timing, "flops": flops, **rates(flops, timing["best_s"], gemm),
            "memory": memory.result(), "spilled_bytes": 0,
            "spill_note": "quimb in this process: nothing spills"}


def quimb_fits(sp: dict[str, Any], envs: int, device: Device) -> tuple[bool, str]:
    """Whether quimb's run (inputs and all sketch environments in memory) fits."""
    need = input_bytes(sp) + envs
    if device.is_gpu:
        have, where = 0.7 * device.describe()["memory_bytes"], "70% of device memory"
    else:
        have, where = 0.5 * host_memory(), "half the host memory"
    ok = need <= have
    return ok, f"needs {need / 1e9:.1f} GB; {where} is {have / 1e9:.1f} GB"


# -- clusters -------------------------------------------------------------------------
def host_memory() -> int:
    """Bytes of RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _fraction(limit: str) -> float | None:
    try:
        value = float(limit)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


@contextlib.contextmanager
def shared_gpu_workers(n_workers: int, args: argparse.Namespace):
    """``n_workers`` ``dask cuda worker`` processes sharing the first GPU (LocalCUDACluster,
    hence ``src_dask.cluster``, starts one worker per GPU and cannot do this)."""
    from distributed import Client, LocalCluster

    device_limit = args.device_memory_limit
    if (f := _fraction(device_limit)) is not None:
        device_limit = str(f / n_workers)
    memory_limit = args.memory_limit
    if memory_limit == "auto":
        memory_limit = str(host_memory() // n_workers)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "dask", "cuda", "worker", "--device-memory-limit",
               device_limit, "--memory-limit", memory_limit]
    with contextlib.suppress(ImportError):
        import rmm  # noqa: F401 - as src_dask.cluster: RMM's async allocator when installed

        command.append("--rmm-async")
    procs = []
    with LocalCluster(n_workers=0, dashboard_address=":0") as scheduler:
        try:
            for i in range(n_workers):
                procs.append(subprocess.Popen(
                    [*command, "--local-directory", str(args.workdir / "dask" / f"w{i}"),
                     scheduler.scheduler_address], env=env))
            with Client(scheduler) as client:
                client.wait_for_workers(n_workers, timeout=300)
                yield client
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


@contextlib.contextmanager
def bench_cluster(n_workers: int, device: Device, args: argparse.Namespace):
    """A client of ``n_workers`` workers on ``device``; yields (client, description)."""
    from distributed import Client, LocalCluster

    local_directory = str(args.workdir / "dask")
    if device.is_gpu and n_workers > device.gpus:
        with shared_gpu_workers(n_workers, args) as client:
            yield client, f"{n_workers} dask cuda worker processes sharing one GPU"
        return
    if device.is_gpu:
        options = rmm_options(args.rmm)
        if args.threads_per_worker:
            options["threads_per_worker"] = args.threads_per_worker
        cluster = src_dask.cluster(gpus=n_workers, device_memory_limit=args.device_memory_limit,
                                   memory_limit=args.memory_limit, protocol=args.protocol,
                                   local_directory=local_directory, dashboard_address=":0",
                                   **options)
        what = (f"src_dask.cluster(gpus={n_workers}, protocol={args.protocol!r}, "
                f"rmm={args.rmm!r}, threads_per_worker={args.threads_per_worker or 4}): "
                "LocalCUDACluster")
    elif device.gpus:  # --device cpu on a GPU machine: src_dask.cluster would use the GPUs
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1,
                               memory_limit=args.memory_limit, local_directory=local_directory,
                               dashboard_address=":0")
        what = f"LocalCluster({n_workers} workers x 1 thread)"
    else:
        cluster = src_dask.cluster(n_workers=n_workers, memory_limit=args.memory_limit,
                                   local_directory=local_directory, dashboard_address=":0")
        what = f"src_dask.cluster(n_workers={n_workers}): LocalCluster, 1 thread each"
    with cluster, Client(cluster) as client:
        yield client, what


# -- one configuration ------------------------------------------------------------------
class _KeptInputs(logging.Handler):
    """What src_dask decided about keeping the inputs for pass 2 (from its log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.decision: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "lazy inputs" in message:
            self.decision = message.removeprefix("src: ")

    def __enter__(self) -> _KeptInputs:
        log = logging.getLogger("src_dask")
        self.level_before = log.level
        log.setLevel(logging.INFO)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger("src_dask")
        log.removeHandler(self)
        log.setLevel(self.level_before)


def run_config(trains, n_workers: int, mode: str, args: argparse.Namespace, device: Device,
               flops: float, gemm: dict[str, Any], keep: bool) -> tuple[dict[str, Any], Any]:
    """Start a cluster, warm it up, time ``src_dask.src`` on the stack, read its spilling.

    Returns the JSON entry and, with ``keep``, the result with NumPy cores (else None).
    """
    import dask

    store = args.workdir / f"store_w{n_workers}" if mode == "store" else None

    def remove_store() -> None:
        if store is not None and store.exists():
            shutil.rmtree(store)

    t0 = time.perf_counter()
    with dask.config.set({"src_dask.device": device.name,
                          "src_dask.keep-inputs": {"auto": "auto", "yes": True,
                                                   "no": False}[args.keep_inputs]}), \
            _KeptInputs() as kept, \
            bench_cluster(n_workers, device, args) as (client, what):
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        src_dask.src(*tiny_stack(args.phys), chi_out=4, seed=0, client=client)
        warm = time.perf_counter() - t0

        report = None
        if args.report is not None:  # Dask's performance report of the (last) timed call
            if client.run_on_scheduler(has_bokeh):
                report = str(args.report.with_name(f"{args.report.stem}_w{n_workers}_{mode}.html"))
            else:
                warnings.warn("--report: no bokeh on the scheduler, so no performance report "
                              "(the UCX wheel set leaves bokeh out)", stacklevel=1)

        def run():
            return src_dask.src(*trains, chi_out=args.chi_out, seed=args.seed, chunk=args.chunk,
                                client=client, store=store, performance_report=report)

        from distributed import get_task_stream

        before = spill_counters(client)
        with PeakMemory(device) as memory, get_task_stream(client=client) as stream:
            timing, result = best_of(run, args.repeats, own_cpu=cluster_cpu(client),
                                     setup=remove_store, warmup=args.full_warmup)
        spilled = spilled_between(before, spill_counters(client))
        # where the time went (summed over the timed calls; one by default)
        profile = task_profile(stream.data, busy=memory.busy_between)
        # a stored result's cores are read from the store, which goes next
        result = src_dask.TensorTrain(result.to_numpy(), result.kind) if keep else None
    remove_store()
    calls = len(timing["times_s"]) + ("warmup_s" in timing)
    entry = {"workers": n_workers, "cluster": what, "store": str(store) if store else None,
             "keep_inputs": {"option": args.keep_inputs, "decision": kept.decision},
             **timing, "flops": flops, **rates(flops, timing["best_s"], gemm),
             "memory": memory.result(), "spilled": spilled, "calls": calls, "profile": profile,
             "cluster_startup_s": startup, "tiny_warmup_s": warm}
    return entry, result


# -- report ---------------------------------------------------------------------------
def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 5's targets for this size, per run (GPU records only)."""
    p = record["problem"]
    out = []
    for dm, chi, seconds, fraction in TARGETS:
        if record["device"]["name"] != "gpu" or (p["dm"], p["chi_out"]) != (dm, chi):
            continue
        for key, e in record["runs"].items():
            if "best_s" in e:
                out.append({"run": key, "seconds_max": seconds, "fraction_min": fraction,
                            "seconds": e["best_s"], "fraction_of_gemm": e["fraction_of_gemm"],
                            "met": e["best_s"] <= seconds and e["fraction_of_gemm"] >= fraction})
    return out


def print_table(record: dict[str, Any]) -> None:
    print()
    print(f"{'run':<16}{'best s':>9}{'/quimb':>8}{'GFLOP/s':>10}{'of GEMM':>9}{'host GB':>9}"
          f"{'device GB':>10}{'spilled GB':>11}{'core diff':>11}  cluster")
    for key, e in [("quimb", record["quimb"]), *record["runs"].items()]:
        if "best_s" not in e:
            print(f"{key:<16}{' '.join(f'{k}: {v}' for k, v in e.items())}")
            continue
        mem = e["memory"]
        ratio = e.get("ratio_to_quimb")
        diff = e.get("core_diff_vs_first")
        print(f"{key:<16}{e['best_s']:>9.3f}{'-' if ratio is None else f'{ratio:.3f}':>8}"
              f"{e['tflops'] * 1e3:>10.1f}{e['fraction_of_gemm']:>9.1%}"
              f"{gb(mem['peak_host_rss_bytes']):>9}"
              f"{gb(mem['peak_device_used_bytes'], mem['baseline_device_used_bytes']):>10}"
              f"{gb(e.get('spilled', {}).get('total_bytes')):>11}"
              f"{'-' if diff is None else f'{diff:.1e}':>11}  {e.get('cluster', 'this process')}")
    gemm = record["gemm_complex128"]
    print(f"{record['flops']['total']:.3e} flop; GEMM complex128 {gemm['n']}^3 on the "
          f"{gemm['device'].upper()}: {gemm['tflops']:.3f} TFLOP/s. host GB: peak RSS of this "
          "process and the workers; device GB: peak device-wide use above the baseline")
    for key, e in record["runs"].items():
        prof = e.get("profile")
        if prof:
            busy = ", ".join(f"{step} {v.get('compute_s', 0):.1f}+{v.get('transfer_s', 0):.1f}"
                             f"+{v.get('disk_s', 0):.1f}" for step, v in prof["per_step"].items()
                             if v.get("compute_s", 0) + v.get("transfer_s", 0) > 0.05)
            spans = []
            for p in ("pass1", "pass2"):
                gpu = prof.get(f"{p}_gpu_busy_percent")
                spans.append(f"pass {p[-1]} {prof.get(f'{p}_span_s', 0):.1f} s"
                             + (f" (GPU busy {gpu:.0f} %)" if gpu is not None else ""))
            print(f"{key}: {', '.join(spans)}; task seconds compute+transfer+disk: {busy}")
    for t in record.get("targets", []):
        print(f"target {t['run']}: {t['seconds']:.1f} s (<= {t['seconds_max']}), "
              f"{t['fraction_of_gemm']:.1%} of GEMM (>= {t['fraction_min']:.0%}): "
              f"{'met' if t['met'] else 'NOT met'}")


# -- main ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 8 sites, D_M=16, chi_out=8; no JSON unless --out")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--sites", type=int, default=None, help="default 50; 8 with --quick")
    p.add_argument("--dm", type=int, default=None, help="bond of M (default 1000; 16 --quick)")
    p.add_argument("--chi-out", type=int, default=None, help="default 500; 8 with --quick")
    p.add_argument("--phys", type=int, default=4, help="physical legs (phys x phys)")
    p.add_argument("--seed", type=int, default=0, help="inputs use seed..seed+3; sketch seed")
    p.add_argument("--chunk", type=int, default=None, help="sketch columns per block "
                   "(src_dask's default: one block per worker thread, none over 256 MiB)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--modes", nargs="+", choices=("memory", "store"),
                   default=["memory", "store"],
                   help="memory: environments in the cluster; store: in a run store on disk")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per configuration")
    p.add_argument("--full-warmup", action="store_true",
                   help="an untimed full-size run first (default: only a tiny warm-up stack)")
    p.add_argument("--quimb", choices=("auto", "yes", "no"), default="auto",
                   help="time quimb's src on the stack (auto: where it fits in memory)")
    p.add_argument("--device-memory-limit", default="0.8",
                   help="per GPU worker before spilling to host (src_dask.cluster)")
    p.add_argument("--protocol", choices=("tcp", "ucx"), default="tcp",
                   help="between GPU workers (ucx: NVLink/CUDA IPC, needs distributed-ucxx)")
    p.add_argument("--rmm", choices=("async", "pool"), default="async",
                   help="GPU allocator: RMM's async pool (src_dask.cluster's default) or a "
                        "classic RMM pool (CUDA IPC between GPUs over UCX maps it once)")
    p.add_argument("--threads-per-worker", type=int, default=None,
                   help="threads of each GPU worker (default: src_dask.cluster's, 4)")
    p.add_argument("--keep-inputs", choices=("auto", "yes", "no"), default="auto",
                   help="the Dask config src_dask.keep-inputs: read the Zarr inputs once and "
                        "keep them for pass 2 (yes), read them in each pass (no), or let "
                        "src_dask decide from their size and the worker's memory (auto)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH.html",
                   help="write Dask's performance report of each configuration's timed call "
                        "(PATH_w<workers>_<mode>.html): task stream, transfers, profile")
    p.add_argument("--memory-limit", default="auto", help="host memory per worker before "
                   "spilling to disk")
    p.add_argument("--gemm-n", type=int, default=None,
                   help="GEMM size (default 8192 on a GPU, 2048 on a CPU; a quarter with --quick)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/src_dask_bench"),
                   help="inputs, run stores and worker spill space")
    p.add_argument("--regenerate", action="store_true", help="write the inputs anew")
    p.add_argument("--no-compare", action="store_true",
                   help="do not compare the runs' cores with the first run's")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output, or a directory for it (default benchmarks/results/"
                        "stack_<device>_dm<D>.json; none with --quick)")
    add_merge_option(p, "the other runs (and the quimb timing, if this run has none)")
    args = p.parse_args(argv)
    args.sites = args.sites or (8 if args.quick else 50)
    args.dm = args.dm or (16 if args.quick else 1000)
    args.chi_out = args.chi_out or (8 if args.quick else 500)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Couldn't import `kahypar`")
    device = Device(args.device, cluster=True)
    args.out = output_path(args.out, f"stack_{device.name}_dm{args.dm}.json", args.quick)
    sp = spec(args)
    shapes = site_shapes(sp)
    envs = env_bytes(shapes, args.chi_out, 16)
    flops = src_flops(shapes, args.chi_out)
    result_bytes = args.sites * args.chi_out**2 * args.phys**2 * 16
    record: dict[str, Any] = {
        **run_record("src-method stack N.V.M.U from Zarr", device),
        "problem": {**sp, "dm": args.dm, "chi_out": args.chi_out, "chunk": args.chunk},
        "sizes": {"inputs_bytes": input_bytes(sp), "environments_bytes": envs,
                  "result_bytes_at_most": result_bytes},
        "flops": flops, "repeats": args.repeats, "full_warmup": args.full_warmup, "runs": {},
    }
    earlier = earlier_record(args.merge, args.out)
    record["runs"] = earlier.get("runs", {})
    print_header(record)
    print(f"stack: {args.sites} sites, bonds {list(sp['bonds'].values())}, phys {args.phys}x"
          f"{args.phys}, chi_out {args.chi_out}: {flops['total']:.3e} flop; environments "
          f"{envs / 1e9:.2f} GB (in the cluster without a store, on disk with one)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    record["generation"] = generate_inputs(sp, args.workdir, args.regenerate)
    trains = open_inputs(sp, args.workdir)

    gemm = record["gemm_complex128"] = run_gemm(args.gemm_n, args.quick, device)

    fits, why = quimb_fits(sp, envs, device)
    if args.quimb == "yes" or (args.quimb == "auto" and fits):
        try:
            record["quimb"] = {"date": record["date"],
                               **run_quimb(trains, args, device, flops["total"], gemm)}
            print(f"quimb src on the stack: {record['quimb']['best_s']:.3f} s", flush=True)
        except MemoryError as err:  # CuPy's OutOfMemoryError is one
            device.free_pool()
            record["quimb"] = {"failed": f"{type(err).__name__}: {err}"}
            print(f"quimb src on the stack: {record['quimb']['failed']}")
    elif "best_s" in earlier.get("quimb", {}):
        record["quimb"] = earlier["quimb"]  # --merge: the peer timed by an earlier run
        print(f"quimb src on the stack: {record['quimb']['best_s']:.3f} s "
              f"(from the run of {record['quimb']['date']})")
    else:
        record["quimb"] = {"skipped": f"--quimb {args.quimb}: {why}"}

    def save() -> None:
        record["targets"] = targets(record)
        if args.out is not None:
            write_json(record, args.out)

    compare = not args.no_compare and result_bytes <= COMPARE_MAX_BYTES
    first = None
    for n_workers in args.workers:
        for mode in args.modes:
            key = f"w{n_workers}_{mode}"
            if mode == "store" and free_bytes(args.workdir) < 1.1 * envs:
                record["runs"][key] = {"skipped": f"the run store needs about "
                                       f"{1.1 * envs / 1e9:.1f} GB; "
                                       f"{free_bytes(args.workdir) / 1e9:.1f} GB free"}
                print(f"{key}: skipped, {record['runs'][key]['skipped']}")
                save()
                continue
            entry, result = run_config(trains, n_workers, mode, args, device, flops["total"],
                                       gemm, keep=compare)
            if "best_s" in record["quimb"]:
                entry["ratio_to_quimb"] = entry["best_s"] / record["quimb"]["best_s"]
            if compare:
                first = result if first is None else first
                entry["core_diff_vs_first"] = core_difference(first, result)
            record["runs"][key] = entry
            print(f"{key}: best {entry['best_s']:.3f} s ({entry['cluster']}; started in "
                  f"{entry['cluster_startup_s']:.1f} s, not counted)", flush=True)
            save()
    print_table(record)
    return record


if __name__ == "__main__":
    main()
