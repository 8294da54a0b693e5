# ruff: noqa: T201
"""The peer project src-method (PyPI ``src-method``, pure Python over NumPy/CuPy) on
bench_stack.py's stack, in this process, on the inputs src_dask reads.

src-method takes each train as a list of per-site arrays in quimb's default layout
(MPO: first ``(r, u, d)``, middle ``(l, r, u, d)``, last ``(l, u, d)``), the factors
leftmost first as src_dask does, and returns the output cores as NumPy arrays in the
same layout, right-canonical (without oversampling). ``Resources(devices=n)`` splits
its sweep over the first ``n`` visible GPUs, one thread per GPU (on the CPU the
devices are simulated: same result, no speed-up).

- :func:`load_host`: the trains src_dask opened from Zarr, read into host memory as
  NumPy cores in that layout (``TensorTrain.to_numpy`` gives quimb's layout). Not
  timed: the issue compares the two "on the same inputs loaded into host memory".
- :func:`run_srcmethod`: a tiny warm-up, then the timed ``src_method.src`` calls on
  ``n`` devices, with peak memory and the pass times src-method logs.
- :func:`compare_results`: src-method's cores against src_dask's (different sketches,
  so only the norm ratio and a loose distance) and against its own run on other
  device counts (the same draws: equal up to rounding).
- :func:`peer_ratios`: the ratios ours / ours and ours / src-method that the targets
  of :data:`problems.STACK_TARGETS` bound.

Nothing here imports src_method at module import: a missing package is a skipped
peer, not a failing benchmark.
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from typing import Any

import numpy as np
from accuracy import core_difference
from device import Device
from harness import captured_log
from memory import PeakMemory
from problems import tiny_stack
from timing import best_of

import src_dask

#: The version whose API this glue follows (``Resources(devices=...)`` is new in 0.5).
SRCMETHOD_VERSION = "0.5.0"
#: The prefix of src-method's entries under a record's ``runs``.
PREFIX = "srcmethod_g"


def run_key(n_devices: int) -> str:
    return f"{PREFIX}{n_devices}"


def is_peer(key: str) -> bool:
    """Whether a run of a record is src-method's (not src_dask's)."""
    return key.startswith(PREFIX)


def import_srcmethod() -> tuple[Any, str | None]:
    """``(src_method, None)``, or ``(None, why)`` when it is missing or too old."""
    try:
        sm = importlib.import_module("src_method")
    except ImportError as err:
        return None, (f"src_method is not importable ({err}); install src-method=="
                      f"{SRCMETHOD_VERSION} (gpu_wheels.sh --src-method on the GPU machine)")
    if not hasattr(sm, "Resources") or "devices" not in getattr(
            sm.Resources, "__dataclass_fields__", {}):
        return None, (f"src_method {getattr(sm, '__version__', '?')} has no "
                      f"Resources(devices=...); needs {SRCMETHOD_VERSION}")
    return sm, None


def load_host(trains) -> tuple[list[list[np.ndarray]], float]:
    """The opened trains as lists of NumPy cores in quimb's layout, and the seconds the
    read took (from Zarr, through Dask's local scheduler: call it with no client)."""
    t0 = time.perf_counter()
    host = [train.to_numpy() for train in trains]
    seconds = time.perf_counter() - t0
    for train, cores in zip(trains, host, strict=True):
        shapes = [tuple(c.shape) for c in train]
        if [c.shape for c in cores] != shapes:
            raise ValueError(f"load_host: read shapes {[c.shape for c in cores]} but the "
                             f"train has {shapes}")
    return host, seconds


#: src-method's debug line of one pass's time (per device when it runs on several).
PASS = re.compile(r"^(?:Device (\d+): )?(Left-to-right|Right-to-left) sweep: ([\d.]+) s")


def sweep_profile(lines: list[str]) -> dict[str, Any]:
    """The pass spans (the slowest device's) of src-method's debug lines of a call, in
    bench_stack's profile keys, with the lines themselves."""
    spans: dict[str, float] = {}
    for line in lines:
        m = PASS.match(line)
        if m:
            key = "pass1_span_s" if m.group(2) == "Left-to-right" else "pass2_span_s"
            spans[key] = max(spans.get(key, 0.0), float(m.group(3)))
    return {"per_step": {}, **spans, "log": list(lines)}


def free_pools(device: Device, n_devices: int) -> None:
    """Return the blocks CuPy's pools cache on the first ``n_devices`` GPUs (src-method
    allocates on each from this process; :meth:`Device.free_pool` frees only the
    current one)."""
    if not device.is_gpu:
        return
    import cupy

    for d in range(n_devices):
        with cupy.cuda.Device(d):
            cupy.cuda.Device(d).synchronize()
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()


def run_srcmethod(sm, host: list[list[np.ndarray]], n_devices: int, args,
                  device: Device) -> tuple[dict[str, Any], list[np.ndarray]]:
    """src-method on ``n_devices`` (GPUs, or simulated devices on the CPU): a warm-up on
    a tiny stack, then ``args.repeats`` timed calls on ``host`` (``--full-warmup``: an
    untimed full-size call first). Returns the entry and the last result's cores."""
    where = "gpu" if device.is_gpu else "cpu"
    resources = sm.Resources(devices=n_devices)

    def call(trains, chi_out: int, seed: int):
        return sm.src(*trains, chi_out=chi_out, oversample=1.0, seed=seed, device=where,
                      resources=resources)

    with captured_log("src_method", logging.DEBUG, propagate=False) as log:
        t0 = time.perf_counter()
        call([t.to_numpy() for t in tiny_stack(args.phys)], 4, 0)
        warm = time.perf_counter() - t0
        free_pools(device, n_devices)
        with PeakMemory(device) as memory:
            timing, result = best_of(lambda: call(host, args.chi_out, args.seed),
                                     args.repeats, sync=device.sync, setup=log.clear,
                                     warmup=args.full_warmup)
        profile = sweep_profile(log)
    free_pools(device, n_devices)
    what = (f"src_method {getattr(sm, '__version__', '?')}.src(device={where!r}, "
            f"Resources(devices={n_devices})) in this process"
            + ("" if device.is_gpu else ": devices simulated on the CPU"))
    return {"peer": "src-method", "devices": n_devices, "cluster": what, **timing,
            "memory": memory.result(),
            "memory_note": "device memory: NVML's reading of the first GPU only (src-method "
                           "uses the first n); host: this process",
            "spill_note": "one process, no Dask spilling: src-method places its "
                          "environments itself (device, host or disk tiers: profile.log's "
                          "plan line)",
            "profile": profile, "tiny_warmup_s": warm,
            "calls": len(timing["times_s"]) + ("warmup_s" in timing)}, result


def compare_results(ours, ours_key: str | None,
                    results: dict[str, list[np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Per src-method run: how its cores compare with src_dask's first run (``ours``, a
    TensorTrain, or None) and with src-method's first run on another device count.

    The sketches differ between the two libraries (their own random streams), so the
    results differ by about the truncation error of the stack: ``rel_distance``
    (``src_dask.distance``, relative to ours) is at most about twice the error of
    either; nothing is asserted. src-method draws the same sketch whatever its device count, so its
    runs should agree core by core to rounding.
    """
    out: dict[str, dict[str, Any]] = {}
    first_key = next(iter(results), None)
    for key, cores in results.items():
        entry: dict[str, Any] = {}
        if ours is not None:
            try:
                entry["vs_src_dask"] = {"run": ours_key, "rel_distance": src_dask.distance(
                    src_dask.TensorTrain(cores, "mpo"), ours)}
            except Exception as err:  # noqa: BLE001 - a comparison never sinks the record
                entry["vs_src_dask"] = {"run": ours_key, "error": repr(err)}
        if key != first_key:
            entry[f"core_diff_vs_{first_key}"] = core_difference(
                _Cores(results[first_key]), _Cores(cores))
        out[key] = entry
    return out


class _Cores(list):
    """A list of cores with the ``to_numpy`` that :func:`accuracy.core_difference` reads."""

    def to_numpy(self) -> list[np.ndarray]:
        return list(self)


def time_peers(trains, args, device: Device, ours=None, ours_key: str | None = None,
               keep: bool = True) -> dict[str, dict[str, Any]]:
    """src-method's entries for ``args.src_method_devices``: timed, or why not.

    The inputs are read into host memory once (``load_s`` in each entry, not timed).
    With ``keep`` the results are compared (:func:`compare_results`) against ``ours``.
    """
    counts = list(dict.fromkeys(args.src_method_devices))
    sm, why = import_srcmethod()
    if sm is None:
        print(f"src-method: skipped, {why}")
        return {run_key(n): {"skipped": why} for n in counts}
    entries: dict[str, dict[str, Any]] = {}
    todo = []
    for n in counts:
        if n < 1:
            entries[run_key(n)] = {"skipped": f"--src-method-devices {n}: not a device count"}
        elif device.is_gpu and n > device.gpus:
            entries[run_key(n)] = {"skipped": f"{n} GPUs asked, {device.gpus} visible"}
        else:
            todo.append(n)
    for key, e in entries.items():
        print(f"{key}: skipped, {e['skipped']}")
    if not todo:
        return entries
    host, load_s = load_host(trains)
    nbytes = sum(c.nbytes for cores in host for c in cores)
    print(f"src-method: inputs read into host memory in {load_s:.1f} s "
          f"({nbytes / 1e9:.2f} GB; not timed)", flush=True)
    results: dict[str, list[np.ndarray]] = {}
    for n in todo:
        key = run_key(n)
        try:
            entry, result = run_srcmethod(sm, host, n, args, device)
        except Exception as err:  # noqa: BLE001 - out of memory, a CUDA error: recorded
            free_pools(device, n)
            entries[key] = {"peer": "src-method", "devices": n,
                            "failed": f"{type(err).__name__}: {err}"}
            print(f"{key}: failed, {entries[key]['failed']}", flush=True)
            continue
        entries[key] = {**entry, "load_s": load_s, "load_bytes": nbytes}
        if keep:
            results[key] = result
        del result
        print(f"{key}: best {entry['best_s']:.3f} s ({entry['cluster']})", flush=True)
    del host
    if keep and results:
        for key, found in compare_results(ours, ours_key, results).items():
            entries[key].update(found)
    return entries


#: The ratio fields peer_ratios writes into runs (removed before each recount).
RATIO_FIELDS = re.compile(r"^ratio_to_(w\d+|srcmethod_g\d+)$")


def peer_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The ratios between runs with a time, written into the runs they judge (so that
    :func:`harness.check_targets` finds them) and returned by name:

    - ``ratio_to_w1`` on ``w<n>_<mode>`` (n > 1): its time over ``w1_<mode>``'s;
    - ``ratio_to_srcmethod_g<n>`` on ``w<n>_<mode>``: its time over src-method's on
      as many GPUs;

    the same on ``w<n>_<mode>_<how>`` (workers started another way, as
    ``_schedfile``), against the same ``w1_<mode>`` and src-method.

    Recomputed from scratch, so runs kept by ``--merge`` count too.
    """
    for entry in runs.values():
        for field in [f for f in entry if RATIO_FIELDS.match(f)]:
            del entry[field]
    timed = {k: e["best_s"] for k, e in runs.items() if "best_s" in e}
    out: dict[str, float] = {}
    for key, best in timed.items():
        m = re.fullmatch(r"w(\d+)_(memory|store)(?:_\w+)?", key)
        if not m:
            continue
        n, mode = int(m.group(1)), m.group(2)
        peers = [(f"w1_{mode}", "ratio_to_w1")] if n > 1 else []
        peers.append((run_key(n), f"ratio_to_{run_key(n)}"))
        for other, field in peers:
            if other in timed:
                runs[key][field] = out[f"{key}/{other}"] = best / timed[other]
    return out
