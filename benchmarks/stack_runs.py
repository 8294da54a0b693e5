# ruff: noqa: T201
"""The runs of bench_stack.py: src_dask on a fresh cluster per configuration (workers,
mode), and quimb's src on the whole stack in this process."""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from typing import Any

import clusters
from device import Device
from flops import rates
from harness import captured_log
from memory import PeakMemory
from methods import quimb_stack_fits, run_quimb_stack
from problems import tiny_stack
from timing import best_of, task_profile
from tools.transfers import LOG_CONFIG, TransferWatch, stall_summary, write_detail


def _has_bokeh() -> bool:
    """Whether bokeh (which Dask's performance report needs) imports here."""
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


def _report_path(args, client, n_workers: int, mode: str) -> str | None:
    """Where Dask's performance report of the (last) timed call goes, if anywhere."""
    if args.report is None:
        return None
    if client.run_on_scheduler(_has_bokeh):
        return str(args.report.with_name(f"{args.report.stem}_w{n_workers}_{mode}.html"))
    warnings.warn("--report: no bokeh on the scheduler, so no performance report "
                  "(the UCX wheel set leaves bokeh out)", stacklevel=1)
    return None


def run_config(trains, n_workers: int, mode: str, args, device: Device,
               keep: bool) -> tuple[dict[str, Any], Any]:
    """Start a cluster, warm it up, time ``src_dask.src`` on the stack, read its spilling.

    Returns the JSON entry and, with ``keep``, the result with NumPy cores (else None).
    """
    import dask
    from distributed import get_task_stream

    import src_dask

    store = args.workdir / f"store_w{n_workers}" if mode == "store" else None

    def remove_store() -> None:
        if store is not None and store.exists():
            shutil.rmtree(store)

    keep_inputs = {"auto": "auto", "yes": True, "no": False}[args.keep_inputs]
    t0 = time.perf_counter()
    # LOG_CONFIG: the workers' transfer and transition logs long enough for the watch
    with dask.config.set({"src_dask.device": device.name, "src_dask.keep-inputs": keep_inputs,
                          **LOG_CONFIG}), \
            captured_log("src_dask", logging.INFO) as logged, \
            clusters.bench_cluster(n_workers, device, args, args.workdir) as (client, what):
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        src_dask.src(*tiny_stack(args.phys), chi_out=4, seed=0, client=client)
        warm = time.perf_counter() - t0
        report = _report_path(args, client, n_workers, mode)
        # what the memory plan expects, to set beside what the run measures
        planned = src_dask.plan(*trains, chi_out=args.chi_out, seed=args.seed, chunk=args.chunk,
                                client=client, store=store)

        def run():
            return src_dask.src(*trains, chi_out=args.chi_out, seed=args.seed, chunk=args.chunk,
                                client=client, store=store, performance_report=report)

        # the transfers and event loops of the last call (cleared before each, untimed),
        # and the event loops' stalls of each call: a first call pins host memory that
        # later calls on the same workers reuse (CuPy's pinned pool)
        watch = TransferWatch(client)
        loops: list[dict[str, Any]] = []

        def setup() -> None:
            remove_store()
            if watch.calls:
                loops.append(stall_summary(watch.collect(stream.data)[0]))
            watch.reset()

        before = clusters.spill_counters(client)
        with PeakMemory(device) as memory, get_task_stream(client=client) as stream:
            timing, result = best_of(run, args.repeats, own_cpu=clusters.cluster_cpu(client),
                                     setup=setup, warmup=args.full_warmup)
        spilled = clusters.spilled_between(before, clusters.spill_counters(client))
        transfers, detail = watch.collect(stream.data)
        loops.append(stall_summary(transfers))
        write_detail(getattr(args, "transfer_detail", None), f"w{n_workers}_{mode}", detail,
                     stream.data)
        # where the time went (summed over the timed calls; one by default)
        profile = task_profile(stream.data, busy=memory.busy_between)
        # a stored result's cores are read from the store, which goes next
        result = src_dask.TensorTrain(result.to_numpy(), result.kind) if keep else None
    remove_store()
    # what src_dask decided about keeping the inputs for pass 2 (its log says it)
    decision = next((m.removeprefix("src: ") for m in reversed(logged) if "lazy inputs" in m),
                    None)
    return {"workers": n_workers, "cluster": what, "store": str(store) if store else None,
            "keep_inputs": {"option": args.keep_inputs, "decision": decision}, **timing,
            "plan": {"text": str(planned), "peak_device_bytes": planned.peak_device,
                     "peak_host_bytes": planned.peak_host, "spilled_bytes": planned.spilled,
                     "task_bytes": planned.task_bytes, "chunk": planned.chunk,
                     "z_blocks_max": max(planned.z_blocks), "tasks": planned.tasks},
            "memory": memory.result(), "spilled": spilled,
            "calls": len(timing["times_s"]) + ("warmup_s" in timing), "profile": profile,
            "transfers": transfers, "stalls_by_call": loops,
            "cluster_startup_s": startup, "tiny_warmup_s": warm}, result


def time_quimb(record: dict[str, Any], earlier: dict[str, Any], trains, args, device: Device,
               envs: int, gemm: dict[str, Any]) -> dict[str, Any]:
    """quimb's entry: timed here (``--quimb``), kept from ``--merge``, or why not."""
    fits, why = quimb_stack_fits(record["sizes"]["inputs_bytes"], envs, device,
                                 clusters.host_memory())
    if args.quimb == "yes" or (args.quimb == "auto" and fits):
        try:
            entry = run_quimb_stack(trains, args.chi_out, args.phys, args.seed, args.repeats,
                                    device)
        except MemoryError as err:  # CuPy's OutOfMemoryError is one
            device.free_pool()
            print(f"quimb src on the stack: {type(err).__name__}: {err}")
            return {"failed": f"{type(err).__name__}: {err}"}
        print(f"quimb src on the stack: {entry['best_s']:.3f} s", flush=True)
        total = record["flops"]["total"]
        return {"date": record["date"], **entry, "flops": total,
                **rates(total, entry["best_s"], gemm)}
    if "best_s" in earlier.get("quimb", {}):  # --merge: the peer timed by an earlier run
        print(f"quimb src on the stack: {earlier['quimb']['best_s']:.3f} s "
              f"(from the run of {earlier['quimb']['date']})")
        return earlier["quimb"]
    return {"skipped": f"--quimb {args.quimb}: {why}"}
