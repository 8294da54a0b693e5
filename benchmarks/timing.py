"""Timing: a warm-up then the best of N, with a time budget for slow methods and a
check that the machine was quiet; and where a cluster run's time went."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _proc_stat() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = sum(f[:8]) - f[3] - f[4]  # all but idle and iowait (steal included)
    return busy / tick, f[7] / tick


def best_of(fn: Callable[[], Any], repeats: int, own_cpu: Callable[[], float] = time.process_time,
            *, sync: Callable[[], None] | None = None, setup: Callable[[], None] | None = None,
            warmup: bool = True, budget_s: float | None = None) -> tuple[dict[str, Any], Any]:
    """One warm-up call, then ``repeats`` timed calls; returns (timings, last result).

    ``sync`` runs before each timer stops (a GPU's queued work); ``setup`` runs
    before each call, untimed (e.g. removing a run store). Without ``warmup``
    every call is timed. With ``budget_s``, fewer timed calls are made when the
    warm-up shows that ``repeats`` would take longer than that; if not even one
    fits, the warm-up is the only measurement (``"warmup_only": true``).

    Also records, over each timed call, the CPU time the whole machine spent
    outside this benchmark (``foreign_cpu_s``: busy time in ``/proc/stat`` less
    ``own_cpu()``, which counts the benchmark's own processes) and the time the
    host stole from this VM: both should be ~0 on a quiet machine.
    """
    def call() -> tuple[float, Any]:
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        res = fn()
        if sync is not None:
            sync()
        return time.perf_counter() - t0, res

    out: dict[str, Any] = {}
    result = None
    if warmup:
        out["warmup_s"], result = call()
        if budget_s is not None and out["warmup_s"] * repeats > budget_s:
            repeats = int(budget_s // out["warmup_s"])
            out["repeats_cut_to"] = repeats
    times, foreign, steal = [], [], []
    for _ in range(repeats):
        s0, c0 = _proc_stat(), own_cpu()
        t, result = call()
        times.append(t)
        s1, c1 = _proc_stat(), own_cpu()
        if s0 is not None and s1 is not None:
            foreign.append(max(0.0, (s1[0] - s0[0]) - (c1 - c0) - (s1[1] - s0[1])))
            steal.append(s1[1] - s0[1])
    if not times:
        times = [out["warmup_s"]]
        out["warmup_only"] = True
    out.update(times_s=times, best_s=min(times))
    if foreign:
        out["foreign_cpu_s"] = foreign
        out["steal_s"] = steal
    return out, result


def runs_text(times: list[float]) -> str:
    """A run's timed calls for a table: ``0.12 0.13 0.12``."""
    return " ".join(f"{t:.3f}" for t in times)


def compute_seconds(stream: list[dict[str, Any]]) -> float:
    """Seconds the tasks of distributed's task stream spent computing, summed."""
    return sum(ss["stop"] - ss["start"] for task in stream for ss in task.get("startstops", ())
               if ss.get("action") == "compute")


def task_profile(stream: list[dict[str, Any]],
                 busy: Callable[[float, float], float | None] | None = None) -> dict[str, Any]:
    """Where a cluster run's time went, from distributed's task stream: per step
    (``pass1``, ``pass2.project``, ``pass2.qr``, ...) the tasks' summed compute,
    transfer and disk (spilling) seconds, and the wall span of each pass (with
    ``busy``, e.g. :meth:`memory.PeakMemory.busy_between`, the GPU's mean
    utilisation in it)."""
    from dask.utils import key_split

    steps: dict[str, dict[str, float]] = {}
    spans: dict[str, list[float]] = {}
    for task in stream:
        key = task["key"]
        step = key_split(key).split("_site")[0]
        if step == "pass2" and isinstance(key, tuple) and len(key) > 1:
            step = f"pass2.{key[1]}"
        entry = steps.setdefault(step, {"tasks": 0})
        entry["tasks"] += 1
        for ss in task.get("startstops", ()):
            what = {"compute": "compute_s", "transfer": "transfer_s"}.get(
                ss["action"], "disk_s" if "disk" in ss["action"] else "other_s")
            entry[what] = entry.get(what, 0.0) + ss["stop"] - ss["start"]
            if ss["action"] == "compute" and step.split(".")[0] in ("pass1", "pass2"):
                span = spans.setdefault(step.split(".")[0], [ss["start"], ss["stop"]])
                span[0], span[1] = min(span[0], ss["start"]), max(span[1], ss["stop"])
    per_step = {k: {m: round(v, 4) for m, v in e.items()} for k, e in sorted(steps.items())}
    gpu = {f"{p}_gpu_busy_percent": busy(a, b) for p, (a, b) in spans.items()} if busy else {}
    return {"per_step": per_step,
            **{f"{p}_span_s": round(b - a, 4) for p, (a, b) in spans.items()}, **gpu}


def profile_text(prof: dict[str, Any]) -> str:
    """One line of a :func:`task_profile`: the passes' spans (and GPU busy), and the
    steps' task seconds compute+transfer+disk."""
    busy = ", ".join(f"{step} {v.get('compute_s', 0):.1f}+{v.get('transfer_s', 0):.1f}"
                     f"+{v.get('disk_s', 0):.1f}" for step, v in prof["per_step"].items()
                     if v.get("compute_s", 0) + v.get("transfer_s", 0) > 0.05)
    spans = []
    for p in ("pass1", "pass2"):
        gpu = prof.get(f"{p}_gpu_busy_percent")
        spans.append(f"pass {p[-1]} {prof.get(f'{p}_span_s', 0):.1f} s"
                     + (f" (GPU busy {gpu:.0f} %)" if gpu is not None else ""))
    return f"{', '.join(spans)}; task seconds compute+transfer+disk: {busy}"
