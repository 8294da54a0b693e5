# ruff: noqa: T201
"""The memory ladder: the stack N·V·M·U on one GPU worker whose RMM pool may grow to
less and less of the device (a smaller GPU simulated on a large one).

Each rung starts ``dask_cuda.LocalCUDACluster(n_workers=1, threads_per_worker=T,
device_memory_limit=L, rmm_pool_size=L, rmm_maximum_pool_size=P,
rmm_allocator_external_lib_list=["cupy"])`` with ``L = limit-fraction x P`` (and,
with ``--host-limit``, ``memory_limit`` per worker), asks ``src_dask.plan`` for the
run's planned peaks, times one ``src_dask.src(*trains, chi_out=..., client=...)``,
and records per rung: time and its ratio to the uncapped rung, share of the
complex128 GEMM rate, the planned device and host peaks against the measured ones
(the device's used memory by NVML; the worker's RSS, polled), the most data the worker
held on the host and on disk (dask-cuda's spilled data, polled), and the largest
core difference from the first rung (the sketch depends only on the seed).

    python benchmarks/bench_memory_ladder.py --dm 1000 --chi-out 500 --caps 0 80 48 24 12
    python benchmarks/bench_memory_ladder.py --dm 1000 --caps 24 --host-limit 8GB
    python benchmarks/bench_memory_ladder.py --quick     # D_M=16 on small caps (a CPU-less check)

A cap of 0 is the uncapped rung (the pool may grow to the whole device).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from accuracy import core_difference
from device import Device, run_gemm
from distributed import get_task_stream
from distributed.diagnostics.plugin import WorkerPlugin
from flops import PLAN_CONVENTION, plan_flops, rates
from harness import Config, Record, execute_benchmark, parser, print_table
from memory import PeakMemory
from problems import generate_inputs, open_inputs, stack_spec, stack_trains, tiny_stack
from timing import task_profile

import src_dask
from src_dask.diagnostics import memory_events

GB = 10**9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, quick="6 sites, D_M=16, chi_out=8, caps 0 and 1 GB", seed=0,
               out="memory_ladder_dm<D_M>.json")
    p.add_argument("--dm", type=int, default=1000)
    p.add_argument("--chi-out", type=int, default=500)
    p.add_argument("--sites", type=int, default=50)
    p.add_argument("--phys", type=int, default=4)
    p.add_argument("--caps", type=float, nargs="+", default=[0, 80, 48, 24, 12],
                   help="RMM maximum pool sizes in GB (0: uncapped)")
    p.add_argument("--limit-fraction", type=float, default=2 / 3,
                   help="dask-cuda's device_memory_limit (and the pool's start) as a share "
                        "of the cap (the issue's ladder: 32 of 48 GB)")
    p.add_argument("--host-limit", default=None, help="memory_limit of the worker (e.g. 8GB)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/src_dask_bench"))
    p.add_argument("--name", default=None, help="record file name (default by D_M)")
    p.add_argument("--tasks", action="store_true",
                   help="record each rung's task stream: compute, transfer and disk seconds "
                        "per step, the spans of the passes, the worker's event-loop warnings")
    args = p.parse_args(argv)
    if args.quick:
        args.sites, args.dm, args.chi_out, args.caps = 6, 16, 8, [0, 1]
    return args


class _WorkerData:
    """The most bytes the worker's stored data held on the device, the host and disk
    (dask-cuda's DeviceHostFile), polled every ``interval`` seconds."""

    def __init__(self, client: Any, interval: float = 0.5):
        self.client, self.interval = client, interval
        self.peak = {"device": 0, "host": 0, "disk": 0, "worker_rss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _held(dask_worker: Any) -> dict[str, int]:
        data = dask_worker.data
        out = {"worker_rss": int(dask_worker.monitor.get_process_memory())}
        for name, buffer in (("device", getattr(data, "device_buffer", None)),
                             ("host", getattr(data, "host_buffer", None))):
            fast = getattr(buffer, "fast", None)
            slow = getattr(buffer, "slow", None)
            if fast is not None:
                out[name] = int(fast.total_weight)
            if name == "host" and slow is not None:
                out["disk"] = int(getattr(slow, "total_weight", 0) or 0)
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for held in self.client.run(self._held).values():
                    for k, v in held.items():
                        self.peak[k] = max(self.peak[k], v)
            except Exception:  # noqa: BLE001 - a busy worker: the next poll
                pass

    def __enter__(self) -> _WorkerData:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


class _Keep(logging.Handler):
    """Keeps the messages of src_dask's loggers and distributed's "unresponsive" ones."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.kept: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.name.startswith("src_dask") or "unresponsive" in msg:
            self.kept.append(msg[:300])


class WorkerWarnings(WorkerPlugin):
    """On the worker: its warnings of distributed's event loop ("Event loop was
    unresponsive", distributed's tick) and of src_dask (out-of-memory halving), kept
    from its registration (:func:`_listen`) by a logging handler this plugin holds;
    src_dask's INFO lines (what it spills, a task rescheduled) also go to the worker's
    stderr, the ladder's log, where they outlast a worker that dies."""

    name = "bench-ladder-warnings"
    idempotent = True
    LOGGERS = ("src_dask", "distributed.core", "distributed.worker")

    def setup(self, worker: Any) -> None:
        self.handler = _Keep()
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self.handler)
        self.stderr = logging.StreamHandler()  # sys.stderr
        self.stderr.setFormatter(logging.Formatter("%(asctime)s worker %(name)s "
                                                   "%(levelname)s %(message)s"))
        lib = logging.getLogger("src_dask")
        self.level = lib.level
        lib.addHandler(self.stderr)
        lib.setLevel(logging.INFO)

    def teardown(self, worker: Any) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self.handler)
        lib = logging.getLogger("src_dask")
        lib.removeHandler(self.stderr)
        lib.setLevel(self.level)

    def read(self) -> list[str]:
        return list(self.handler.kept)


class _RunLog(logging.Handler):
    """The run's own INFO lines on the client's ``src_dask`` logger (its plan as the
    run decided it, which may differ from ``src_dask.plan``'s a moment earlier: the
    workers' memory is measured again), kept while the rung's run lasts."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:2000])

    def __enter__(self) -> _RunLog:
        self.logger = logging.getLogger("src_dask")
        self.level = self.logger.level
        self.logger.addHandler(self)
        if not self.logger.isEnabledFor(logging.INFO):
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


def _listen(client: Any) -> None:
    """Keep the workers' warnings of distributed's event loop and of src_dask."""
    client.register_plugin(WorkerWarnings())


def _loop_warnings(client: Any) -> list[str]:
    """The workers' warnings kept since :func:`_listen`."""
    logs = client.run(lambda dask_worker: dask_worker.plugins[WorkerWarnings.name].read())
    return [msg for lines in logs.values() for msg in lines]


def _memory_events(client: Any) -> dict[str, float]:
    """What running out of memory cost the rung's worker: halved steps, bytes spilled
    for allocations, seconds waited, rows in turn, rescheduled tasks."""
    (events,) = client.run(memory_events).values()
    return events


def _count_allocations() -> bool:
    """On a worker: count the bytes its arrays take through RMM (a statistics adaptor
    over its pool), so the plan's device peak can be told apart from what the pool
    reserves beyond it (growth, fragmentation)."""
    try:
        import rmm.statistics
    except ImportError:
        return False
    rmm.statistics.enable_statistics()
    return True


def _allocated_peak() -> int | None:
    """On a worker: the most bytes its arrays held at once through RMM."""
    import rmm.statistics

    stats = rmm.statistics.get_statistics()
    return None if stats is None else int(stats.peak_bytes)


def rung(trains, cap_gb: float, args, device: Device) -> tuple[dict[str, Any], Any]:
    """One rung: the cluster, the plan, one timed run."""
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    with PeakMemory(device) as idle:  # the device before the cluster (its pool) starts
        pass

    options: dict[str, Any] = {"threads_per_worker": args.threads, "dashboard_address": ":0",
                               "local_directory": str(args.workdir / "workers")}
    if args.host_limit:
        options["memory_limit"] = args.host_limit
    if cap_gb:  # as the ladder: a pool that starts at L and may grow to P
        limit = int(args.limit_fraction * cap_gb * GB)
        options.update(n_workers=1, device_memory_limit=limit, rmm_pool_size=limit,
                       rmm_maximum_pool_size=int(cap_gb * GB),
                       rmm_allocator_external_lib_list=["cupy"])
        start = LocalCUDACluster
    else:  # uncapped: src_dask.cluster's defaults on one GPU
        options.update(gpus=1)
        start = src_dask.cluster
    entry: dict[str, Any] = {"cap_GB": cap_gb or None, "options": {k: str(v) for k, v in
                                                                   options.items()}}
    with start(**options) as cluster, Client(cluster) as client:
        src_dask.src(*tiny_stack(args.phys), chi_out=4, seed=0, client=client)  # warm up
        try:
            plan = src_dask.plan(*trains, chi_out=args.chi_out, seed=0, client=client)
        except MemoryError as err:
            entry["refused"] = str(err)
            print(f"cap {cap_gb} GB: the plan refuses it: {err}")
            return entry, None
        entry["plan"] = {"peak_device": plan.peak_device, "peak_arrays": plan.peak_arrays,
                         "peak_host": plan.peak_host,
                         "device_limit": plan.device_limit, "chunk": plan.chunk,
                         "z_blocks_max": max(plan.z_blocks), "task_bytes": plan.task_bytes,
                         "text": str(plan)}
        print(plan, flush=True)
        if args.tasks:
            _listen(client)
        stream = get_task_stream(client=client) if args.tasks else contextlib.nullcontext()
        counted = cap_gb and all(client.run(_count_allocations).values())
        client.run(memory_events, reset=True)
        with PeakMemory(device) as peak, _WorkerData(client) as held, stream as tasks, \
                _RunLog() as run_log:
            start = time.perf_counter()
            try:
                y = src_dask.src(*trains, chi_out=args.chi_out, seed=0, client=client)
            except Exception as err:  # noqa: BLE001 - a rung that fails is a result
                entry["failed"] = f"{type(err).__name__}: {err}"[:2000]
                print(f"cap {cap_gb} GB: FAILED {entry['failed'][:400]}", flush=True)
                with contextlib.suppress(Exception):  # unless the worker is gone
                    entry["memory_events"] = _memory_events(client)
                if args.tasks:  # the worker's warnings go to the plugin, not to stderr
                    with contextlib.suppress(Exception):
                        entry["worker_warnings"] = _loop_warnings(client)
                        print("\n".join(entry["worker_warnings"]), flush=True)
                return entry, None
            finally:
                entry["run_log"] = run_log.lines
            entry["seconds"] = time.perf_counter() - start
        if args.tasks:
            entry["tasks"] = task_profile(tasks.data)
            entry["tasks"]["event_loop_warnings"] = _loop_warnings(client)
            print(json.dumps(entry["tasks"], indent=1), flush=True)
        entry["memory_events"] = _memory_events(client)
        entry["measured"] = {"peak_device_used": peak.peak.get("device_used"),
                             "device_baseline": idle.baseline.get("device_used"),
                             "peak_host_rss": peak.peak.get("host_rss"),
                             "stored_peak": held.peak}
        arrays = [a for a in client.run(_allocated_peak).values() if a] if counted else []
        if arrays:  # what the arrays took at most, against what the pool reserved
            entry["measured"]["rmm_allocated_peak"] = max(arrays)
            entry["arrays_measured_over_planned"] = max(arrays) / plan.peak_arrays
        if plan.peak_device:
            entry["device_peak_measured_over_planned"] = (
                (peak.peak.get("device_used", 0) - idle.baseline.get("device_used", 0))
                / plan.peak_device)
        # the worker's own RSS (polled), against the plan's per-worker host peak
        entry["host_peak_measured_over_planned"] = held.peak["worker_rss"] / plan.peak_host
    return entry, y


def run(args, record: Record, device: Device) -> None:
    """The inputs, the GEMM rate and every rung (the record written after each)."""
    sp, flops = record["problem"], record["flops"]
    args.workdir.mkdir(parents=True, exist_ok=True)
    record["generation"] = generate_inputs(sp, args.workdir, False)
    trains = open_inputs(sp, args.workdir)
    gemm = record["gemm_complex128"] = run_gemm(None, args.quick, device)
    first = base = None
    for cap in args.caps:
        entry, y = rung(trains, cap, args, device)
        if "seconds" in entry:
            entry.update(**rates(flops["total"], entry["seconds"], gemm))
            if first is None:
                first, base = y, entry["seconds"]
            entry["core_diff_vs_first"] = core_difference(first, y)
            entry["time_over_first"] = entry["seconds"] / base
        record["runs"][f"cap{cap:g}"] = entry
        record.save()


def report(record: Record) -> None:
    rows = []
    for key, e in record["runs"].items():
        plan, m = e.get("plan", {}), e.get("measured", {})
        stored = m.get("stored_peak", {})
        rows.append([key, e.get("seconds", e.get("failed", e.get("refused", ""))[:40]),
                     e.get("time_over_first"), e.get("fraction_of_gemm"),
                     (plan.get("peak_device") or 0) / GB,
                     ((m.get("peak_device_used") or 0) - (m.get("device_baseline") or 0)) / GB,
                     (m.get("rmm_allocated_peak") or 0) / GB,
                     (plan.get("peak_host") or 0) / GB, (m.get("peak_host_rss") or 0) / GB,
                     stored.get("host", 0) / GB, stored.get("disk", 0) / GB,
                     e.get("core_diff_vs_first"), _events_text(e.get("memory_events"))])
    print_table(["rung", "s", "x first", "GEMM share", "plan dev GB", "meas dev GB",
                 "allocated GB", "plan host GB", "meas host GB", "on host GB", "on disk GB",
                 "core diff", "halved/waited s/turns/rescheduled"], rows)


def _events_text(events: dict[str, float] | None) -> str:
    if events is None:
        return "-"
    return (f"{events.get('halved', 0):g}/{events.get('waited_s', 0):.1f}/"
            f"{events.get('turns', 0):g}/{events.get('rescheduled', 0):g}")


def fields(args) -> dict[str, Any]:
    sp = stack_spec(args.sites, args.dm, args.phys, args.seed)
    return {"problem": {**sp, "dm": args.dm, "chi_out": args.chi_out},
            "flops": plan_flops(*stack_trains(sp), chi_out=args.chi_out),
            "flop_convention": PLAN_CONVENTION, "caps_GB": args.caps,
            "limit_fraction": args.limit_fraction, "host_limit": args.host_limit,
            "threads": args.threads, "runs": {}}


CONFIG = Config(
    measures="the memory ladder: the stack on one GPU worker with its RMM pool capped",
    name=lambda args, device: (args.name or f"memory_ladder_dm{args.dm}"
                               + ("_host" if args.host_limit else "")) + ".json",
    device=lambda args: Device("gpu", cluster=True), run=run, report=report, fields=fields)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return execute_benchmark(CONFIG, parse_args(argv))


if __name__ == "__main__":
    main()
