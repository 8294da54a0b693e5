# ruff: noqa: T201
"""Helpers shared by the benchmark scripts (bench_cpu.py, bench_mpo_mps.py, bench_stack.py).

- machine facts: CPU model, BLAS, versions, git state, GPU name;
- the device a benchmark runs on (CuPy GPU when importable and a device is
  visible, else NumPy CPU) and how to synchronize it;
- the complex128 GEMM rate of that device;
- FLOP counts of SRC in DESIGN.md section 3's convention, for any stack;
- errors against the exact product ``A psi`` without dense vectors (quimb);
- timing (a warm-up, then the best of N; a time budget for slow methods);
- peak host RSS and device memory sampled in a thread, and Dask workers'
  spill counters.

Nothing here starts a cluster; the scripts do that under ``__main__``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


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
    """Versions of Python and of every package a benchmark may use (those importable)."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("dask", "distributed", "quimb", "opt_einsum", "src_dask", "scipy", "zarr",
                 "cupy", "dask_cuda", "rmm"):
        try:
            module = __import__(name)
        except Exception:  # noqa: BLE001 - absent or broken: not recorded
            continue
        out[name] = getattr(module, "__version__", "?")
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


def run_record(benchmark: str, device: Device) -> dict[str, Any]:
    """The header every JSON record starts with: what, when, where, with what."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        "device": device.describe(),
        "versions": versions(),
        "git": git_state(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OPENBLAS", "OMP_", "MKL_", "CUDA_VISIBLE", "DASK_"))},
    }


def output_path(out: Path | None, name: str, quick: bool) -> Path | None:
    """Where a benchmark writes its JSON: ``--out`` (a directory: ``name`` in it), else
    ``benchmarks/results/name``; nothing for a ``--quick`` run without ``--out``."""
    if out is None:
        return None if quick else RESULTS / name
    return out / name if out.is_dir() else out


def add_merge_option(parser, what: str) -> None:
    parser.add_argument("--merge", nargs="?", const="", default=None, metavar="JSON",
                        help=f"keep {what} of an earlier record: JSON, or the --out file")


def earlier_record(merge: str | None, out: Path | None) -> dict[str, Any]:
    """The record ``--merge`` names (``{}`` without ``--merge`` or where there is none)."""
    if merge is None:
        return {}
    path = Path(merge) if merge else out
    return json.loads(path.read_text()) if path is not None and path.exists() else {}


def print_header(record: dict[str, Any]) -> None:
    """The first line of a run's output: when and on what."""
    where = record["device"].get("gpu", record["cpu_model"])
    print(f"# {record['date']} on the {record['device']['name'].upper()}: {where}")


def write_json(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}")


# -- the device --------------------------------------------------------------------
def gpu_count() -> int:
    """CUDA devices CuPy sees in this process (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: all mean 0
        return 0


class Device:
    """Where a benchmark runs: ``"gpu"`` (CuPy arrays) or ``"cpu"`` (NumPy arrays).

    ``"auto"`` means the GPU when CuPy sees one (and, with ``cluster``, dask_cuda
    is importable too: the GPU cluster needs it).
    """

    def __init__(self, want: str = "auto", cluster: bool = False):
        import importlib.util

        if want not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device: expected auto, cpu or gpu, got {want!r}")
        gpus = gpu_count()
        missing = ("CuPy is not importable or sees no CUDA device" if not gpus else
                   "dask_cuda is not importable" if cluster
                   and importlib.util.find_spec("dask_cuda") is None else None)
        if want == "gpu" and missing:
            raise RuntimeError(f"--device gpu: {missing}")
        self.name = "gpu" if want != "cpu" and not missing else "cpu"
        self.gpus = gpus  # visible GPUs, even when the benchmark runs on the CPU

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    @property
    def xp(self):
        if self.is_gpu:
            import cupy

            return cupy
        return np

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        if self.is_gpu:
            import cupy

            cupy.cuda.Device().synchronize()

    def to_device(self, tn):
        """A quimb tensor network with its arrays on this device (a copy)."""
        tn = tn.copy()
        if self.is_gpu:
            import cupy

            tn.apply_to_arrays(cupy.asarray)
        return tn

    def free_pool(self) -> None:
        """Return CuPy's cached blocks to the driver, so a run's peak starts from zero."""
        if self.is_gpu:
            import cupy

            self.sync()
            cupy.get_default_memory_pool().free_all_blocks()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.is_gpu:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(0)
            name = props["name"]
            out.update(gpu_count=self.gpus,
                       gpu=name.decode(errors="replace") if isinstance(name, bytes) else name,
                       memory_bytes=int(props["totalGlobalMem"]),
                       cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                       cuda_driver=cupy.cuda.runtime.driverGetVersion())
        return out


def gemm_rate(n: int, repeats: int, device: Device | None = None) -> dict[str, Any]:
    """Best-of-``repeats`` complex128 ``n x n`` matmul rate on ``device``, 8 n^3 flop each."""
    device = device or Device("cpu")
    xp = device.xp
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    b = xp.asarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    c = a @ b  # warm-up
    device.sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = a @ b
        device.sync()
        best = min(best, time.perf_counter() - t0)
    del a, b, c
    device.free_pool()
    flops = 8.0 * n**3
    return {"n": n, "repeats": repeats, "best_s": best, "gflops": flops / best / 1e9,
            "tflops": flops / best / 1e12, "device": device.name}


def run_gemm(n: int | None, quick: bool, device: Device) -> dict[str, Any]:
    """The GEMM rate a run's fractions refer to, printed: ``n`` x ``n`` (default 8192
    on a GPU, 2048 on a CPU; a quarter of that with ``quick``), best of 5."""
    if n is None:
        n = (8192 if device.is_gpu else 2048) // (4 if quick else 1)
    gemm = gemm_rate(n, repeats=5, device=device)
    device.free_pool()  # the matrices' 3 GiB would otherwise stay cached beside the workers
    print(f"complex128 GEMM {n}^3: {gemm['tflops']:.3f} TFLOP/s", flush=True)
    return gemm


def gb(x: float | None, base: float | None = None) -> str:
    """``x - base`` bytes in GB for a table (``-`` when unknown)."""
    return "-" if x is None else f"{(x - (base or 0)) / 1e9:.2f}"


def rates(flops: float | None, seconds: float, gemm: dict[str, Any]) -> dict[str, Any]:
    """Achieved TFLOP/s and the fraction of the GEMM rate measured in the same run."""
    if not flops:
        return {"tflops": None, "fraction_of_gemm": None}
    tflops = flops / seconds / 1e12
    return {"tflops": tflops, "fraction_of_gemm": tflops / gemm["tflops"]}


# -- the MPO x MPS problem (DESIGN.md section 3) -------------------------------------
def make_problem(L: int, chi: int, mpo_bond: int, seed: int, device: Device | None = None):
    """quimb's random MPO (bond ``mpo_bond``, phys 2) and MPS (bond ``chi``), complex128.

    With a GPU ``device`` both come back with CuPy arrays, and the MPS is
    normalized there (``MPS_rand_state`` normalizes by ``<psi|psi>``, an O(L chi^3)
    contraction that takes minutes on a few CPU cores at chi = 2000).
    """
    import quimb.tensor as qtn

    A = qtn.MPO_rand(L, bond_dim=mpo_bond, phys_dim=2, dtype="complex128", seed=seed)
    if device is None or not device.is_gpu:
        psi = qtn.MPS_rand_state(L, bond_dim=chi, dtype="complex128", seed=seed + 1)
        return A, psi
    psi = qtn.MPS_rand_state(L, bond_dim=chi, dtype="complex128", seed=seed + 1,
                             normalize=False)
    A, psi = device.to_device(A), device.to_device(psi)
    psi.normalize()
    return A, psi


# -- FLOP counts -------------------------------------------------------------------
def padded(shapes: Sequence[tuple[int, ...]], mps: bool) -> list[tuple[int, ...]]:
    """Per-site core shapes in quimb's layouts padded to (l, r, u, d): size-1 end bonds,
    and d = 1 for an MPS."""
    n = len(shapes)
    out = []
    for j, shape in enumerate(shapes):
        s = [int(x) for x in shape]
        if j == 0:
            s.insert(0, 1)
        if j == n - 1:
            s.insert(1, 1)
        if mps:
            s.append(1)
        out.append(tuple(s))
    return out


@functools.cache
def _equations(k: int) -> dict[str, str]:
    """The einsum equations of SRC for a ket stack of depth ``k`` (DESIGN.md section 1).

    Core ``T_i[a_i, b_i, x_{i-1}, x_i]``, sketch environment ``C[s, a..]``,
    Gaussian ``Omega[s, x_0, x_k]``, right environment ``S[r, b..]``, output core
    ``eta[l, r, x_0, x_k]``.
    """
    from opt_einsum import get_symbol

    sym = iter(get_symbol(i) for i in range(3 * k + 4))
    s, r, lft = next(sym), next(sym), next(sym)
    a = "".join(next(sym) for _ in range(k))
    b = "".join(next(sym) for _ in range(k))
    x = "".join(next(sym) for _ in range(k + 1))
    cores = ",".join(a[i] + b[i] + x[i] + x[i + 1] for i in range(k))
    x0k = x[0] + x[k]
    return {
        "pass1": f"{s}{a},{s}{x0k},{cores}->{s}{b}",
        "pass2_sketch_M": f"{s}{a},{cores},{r}{b}->{r}{x0k}{s}",
        "pass2_env_S": f"{lft}{r}{x0k},{cores},{r}{b}->{lft}{a}",
        "site0": f"{cores},{r}{b}->{r}{x0k}",
    }


@functools.cache
def _cost(eq: str, shapes: tuple[tuple[int, ...], ...]) -> int:
    """opt_einsum's optimal-path cost (a multiply-add counts 2)."""
    import opt_einsum as oe

    _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
    return int(info.opt_cost)


def src_flops(sites: Sequence[Sequence[tuple[int, int, int, int]]], sketch: int) -> dict[str, Any]:
    """FLOPs of SRC on a ket stack (DESIGN.md: complex multiply-add = 8 flop).

    ``sites[j]`` holds the padded ``(a, b, up, down)`` shape of every factor at
    site ``j``, leftmost factor first. Per site, opt_einsum's optimal path for
    pass 1 (``C_j -> C_{j+1}``), pass 2's sketch ``M`` and environment update
    ``S'`` (counted separately), and the first site's core, with the real bond
    sizes at that site; ``opt_cost`` counts a multiply-add as 2, so flop =
    opt_cost / 2 * 8. Pass 2's output bond is ``q = min(r * up * down, s)``. QRs
    and the rounding of oversampled runs are not counted.
    """
    n, k = len(sites), len(sites[0])
    eq = _equations(k)
    s = sketch
    up, down = (lambda j: sites[j][0][2]), (lambda j: sites[j][-1][3])
    cost = {key: 0 for key in eq}
    for j in range(n - 1):
        cost["pass1"] += _cost(eq["pass1"], ((s, *(t[0] for t in sites[j])),
                                             (s, up(j), down(j)), *sites[j]))
    r = 1
    for j in range(n - 1, 0, -1):
        env_s = (r, *(t[1] for t in sites[j]))
        cost["pass2_sketch_M"] += _cost(eq["pass2_sketch_M"],
                                        ((s, *(t[0] for t in sites[j])), *sites[j], env_s))
        q = min(r * up(j) * down(j), s)
        cost["pass2_env_S"] += _cost(eq["pass2_env_S"],
                                     ((q, r, up(j), down(j)), *sites[j], env_s))
        r = q
    cost["site0"] = _cost(eq["site0"], (*sites[0], (r, *(t[1] for t in sites[0]))))
    flops = {key: c / 2 * 8 for key, c in cost.items()}
    return {
        "convention": "complex multiply-add = 8 flop; opt_einsum optimal path per site; "
                      "opt_cost/2 multiply-adds; QR excluded",
        "sketch_width": s,
        **flops,
        "total": sum(flops.values()),
    }


def mpo_mps_flops(A, psi, sketch: int) -> dict[str, Any]:
    """:func:`src_flops` of quimb's ``A psi`` (MPO then MPS), with their real bonds."""
    t1 = padded([t.shape for t in A], mps=False)
    t2 = padded([t.shape for t in psi], mps=True)
    out = src_flops(list(zip(t1, t2, strict=True)), sketch)
    out["mps_bonds"] = sorted({t[1] for t in t2[:-1]})
    out["mpo_bonds"] = sorted({t[1] for t in t1[:-1]})
    return out


def env_bytes(sites: Sequence[Sequence[tuple[int, ...]]], sketch: int, itemsize: int) -> int:
    """Bytes of all sketch environments ``C_1 .. C_{n-1}`` (``s * prod(a_i)`` each)."""
    return sum(sketch * int(np.prod([t[0] for t in sites[j]])) for j in range(1, len(sites))
               ) * itemsize


# -- accuracy without dense vectors -------------------------------------------------
def _overlap(*tns, L: int) -> complex:
    """Full contraction of a ladder of 1D networks, site by site (tags I0, I1, ...)."""
    import quimb.tensor as qtn

    tn = qtn.TensorNetwork([t.copy() for t in tns], virtual=False)  # mangles inner inds
    tags = [f"I{j}" for j in range(L)]
    out = tn.contract_cumulative(tags, optimize="auto")
    if isinstance(out, qtn.Tensor):
        out = out.data
    return complex(out.item() if hasattr(out, "item") else out)


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


def task_profile(stream: list[dict[str, Any]],
                 busy: Callable[[float, float], float | None] | None = None) -> dict[str, Any]:
    """Where a cluster run's time went, from distributed's task stream: per step
    (``pass1``, ``pass2.project``, ``pass2.qr``, ...) the tasks' summed compute,
    transfer and disk (spilling) seconds, and the wall span of each pass (with
    ``busy``, e.g. :meth:`PeakMemory.busy_between`, the GPU's mean utilisation in it)."""
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


def cluster_cpu(client) -> Callable[[], float]:
    """``own_cpu`` for :func:`best_of` on a cluster: CPU seconds of this process and
    of every worker process."""
    def own() -> float:
        return time.process_time() + sum(client.run(time.process_time).values())

    return own


# -- memory ------------------------------------------------------------------------
def _proc_tree_rss() -> int:
    """RSS of this process and all its descendants (cluster workers included)."""
    try:
        import psutil

        me = psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except ImportError:
        pass
    # no psutil: walk /proc by parent pid
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry))
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        todo.extend(parents.get(pid, []))
    return total


class _DeviceMemory:
    """Device-wide used bytes (NVML, else the CUDA driver) and CuPy's pool of this process."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.pool = cupy.get_default_memory_pool()
        self.nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            bus = cupy.cuda.Device(0).pci_bus_id
            handle = None
            for key in (bus, bus.encode()):  # str or bytes, depending on the version
                with contextlib.suppress(Exception):
                    handle = handle or pynvml.nvmlDeviceGetHandleByPciBusId(key)
            self.nvml = (pynvml, handle) if handle is not None else None
        except Exception:  # noqa: BLE001 - no NVML: the driver's memGetInfo instead
            self.nvml = None

    def sample(self) -> dict[str, int]:
        busy = {}
        if self.nvml is not None:
            pynvml, handle = self.nvml
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            # percent of NVML's last sample period with a kernel running on the device
            busy = {"gpu_busy": int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)}
        else:
            free, total = self.cupy.cuda.runtime.memGetInfo()
            used = int(total - free)
        return {"device_used": used, "pool_used": int(self.pool.used_bytes()),
                "pool_total": int(self.pool.total_bytes()), **busy}


def rmm_options(rmm: str) -> dict[str, Any]:
    """``src_dask.cluster`` options for an RMM allocator: ``"async"`` (its default,
    stream-ordered pool) or ``"pool"`` (a classic RMM pool grown as needed, which
    CUDA IPC between GPUs over UCX maps once)."""
    return {} if rmm == "async" else {"rmm_async": False, "rmm_pool_size": "16GB"}


class PeakMemory:
    """Peak memory while the ``with`` block runs, sampled every ``interval`` seconds.

    Host: RSS of this process and its descendants (cluster workers). Device
    (GPU runs): device-wide used memory (NVML, else ``cudaMemGetInfo``; it
    includes other processes on the device, such as cluster workers) and
    CuPy's default pool in this process (``used_bytes``, ``total_bytes``).
    Baselines are taken on entry, so peaks can be read as increases. Short
    spikes between samples can be missed.
    """

    def __init__(self, device: Device, interval: float = 0.02):
        self.device_mem = _DeviceMemory() if device.is_gpu else None
        self.interval = interval
        self.peak: dict[str, int] = {}
        self.baseline: dict[str, int] = {}
        self.busy: list[tuple[float, int]] = []  # (time.time(), GPU utilisation percent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[str, int]:
        out = {"host_rss": _proc_tree_rss()}
        if self.device_mem is not None:
            out.update(self.device_mem.sample())
        return out

    def _record(self) -> None:
        sample = self._sample()
        busy = sample.pop("gpu_busy", None)
        if busy is not None:
            self.busy.append((time.time(), busy))
        for key, value in sample.items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def busy_between(self, start: float, stop: float) -> float | None:
        """Mean GPU utilisation (percent, NVML, the first GPU) sampled between two
        ``time.time()`` instants; None without NVML samples there."""
        values = [b for t, b in self.busy if start <= t <= stop]
        return round(sum(values) / len(values), 1) if values else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._record()

    def __enter__(self) -> PeakMemory:
        self.baseline = self._sample()
        self.baseline.pop("gpu_busy", None)
        self.peak = dict(self.baseline)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._record()

    def result(self) -> dict[str, int | None]:
        """``peak_*`` and ``baseline_*`` bytes per quantity (device ones None on a CPU run)."""
        out: dict[str, int | None] = {}
        for key in ("host_rss", "device_used", "pool_used", "pool_total"):
            out[f"peak_{key}_bytes"] = self.peak.get(key)
            out[f"baseline_{key}_bytes"] = self.baseline.get(key)
        out["mean_gpu_busy_percent"] = self.busy_between(-math.inf, math.inf)
        return out


# -- spilling in Dask workers ---------------------------------------------------------
def _worker_spill_counters(dask_worker) -> dict[str, Any]:
    """Cumulative bytes this worker has spilled so far (run on the worker by ``client.run``).

    distributed's ``SpillBuffer`` (a CPU worker with a memory limit) keeps
    ``cumulative_metrics``; dask-cuda's ``DeviceHostFile`` does not, so on its
    zict buffers (``device_buffer``: device -> host, ``host_buffer``: host ->
    disk) a callback is installed on first call that adds up what they evict.
    Anything else (no memory limit: a plain dict) reports no spilling.
    """
    data = dask_worker.data
    out: dict[str, Any] = {"data": type(data).__name__}
    metrics = getattr(data, "cumulative_metrics", None)
    if metrics is not None:
        out["host_to_disk"] = float(metrics.get(("disk-write", "bytes"), 0.0))
        out["disk_to_host"] = float(metrics.get(("disk-read", "bytes"), 0.0))
        return out
    counters = getattr(dask_worker, "_bench_spill_counters", None)
    if counters is None:
        counters = {}
        for attr, label in (("device_buffer", "device_to_host"), ("host_buffer", "host_to_disk")):
            buf = getattr(data, attr, None)
            if buf is None or not hasattr(buf, "fast_to_slow_callbacks"):
                continue
            counters[label] = 0.0

            def add(key, value, *, label=label, weight=buf.weight):
                counters[label] += float(weight(key, value))

            buf.fast_to_slow_callbacks.append(add)
        dask_worker._bench_spill_counters = counters
    out.update(counters)
    if not counters:
        out["note"] = "no spill buffer with counters on this worker"
    return out


def spill_counters(client) -> dict[str, dict[str, Any]]:
    """Every worker's cumulative spill counters (see :func:`_worker_spill_counters`)."""
    return client.run(_worker_spill_counters)


#: The counters that count bytes leaving a tier (unspilling, disk -> host, is not spilling).
SPILL_OUT = ("device_to_host", "host_to_disk")


def spilled_between(before: dict[str, dict[str, Any]],
                    after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Bytes moved per direction, summed over workers, between two counter readings;
    ``total_bytes`` counts only spilling (device -> host, host -> disk)."""
    total: dict[str, float] = {}
    for worker, now in after.items():
        then = before.get(worker, {})
        for key, value in now.items():
            if isinstance(value, float):
                total[key] = total.get(key, 0.0) + value - then.get(key, 0.0)
    out = {key: total[key] for key in SPILL_OUT if key in total}
    return {"bytes": total, "total_bytes": sum(out.values()) if out else 0.0,
            "worker_data": sorted({v["data"] for v in after.values()})}
