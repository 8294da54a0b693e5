# ruff: noqa: T201
"""What page-locking host memory does to the other threads of a process (issue 31).

A GPU worker's event loop stalled while its task threads page-locked new buffers for
their reads. Here one thread page-locks 2 GiB while another ticks every 10 ms and,
per case, only sleeps (does it need the GIL?), also faults in fresh pages (the kernel's
memory-map lock?) and also makes CUDA calls (the driver's lock, as the loop's
``cudaFreeAsync`` does). The ways of page-locking:

- ``hostAlloc``: ``cudaHostAlloc`` as CuPy's pinned pool calls it, 256 MiB or 32 MiB a
  call, and CuPy's pool itself;
- ``register``: anonymous ``mmap`` pages faulted in first (with transparent huge pages
  or without), then ``cudaHostRegister``, whole or 32 MiB a call: what ``src_dask``
  does (``_pinned``).

Then the host-to-device copy rate from each kind of memory. A case's record: seconds
taken, ticks, the latest tick, ticks later than 50 ms and their total.

    PYTHONPATH=src:benchmarks python benchmarks/tools/pin_stalls.py --out F.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MB = 1 << 20
TOTAL = 2048 * MB
MADV_HUGEPAGE = 14


def ticker(stop: threading.Event, late: list[float], touch: int, cuda: bool) -> None:
    """Every 10 ms: how late the tick is; ``touch``: bytes of fresh pages faulted in a
    tick; ``cuda``: a CUDA call and an event recorded a tick."""
    import cupy

    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(0.01)
        if touch:
            np.empty(touch, np.uint8)[::4096] = 1
        if cuda:
            cupy.cuda.runtime.getDevice()
            cupy.cuda.Event().record()
        late.append(time.perf_counter() - t - 0.01)


def host_alloc(piece: int) -> float:
    from cupy.cuda import runtime

    t0 = time.perf_counter()
    pointers = [runtime.hostAlloc(piece, 0) for _ in range(TOTAL // piece)]
    seconds = time.perf_counter() - t0
    for p in pointers:
        runtime.freeHost(p)
    return seconds


def cupy_pool(piece: int) -> float:
    import cupy

    pool = cupy.cuda.PinnedMemoryPool()
    t0 = time.perf_counter()
    blocks = [pool.malloc(piece) for _ in range(TOTAL // piece)]
    seconds = time.perf_counter() - t0
    del blocks
    pool.free_all_blocks()
    return seconds


def mapped(nbytes: int, huge: bool) -> tuple[mmap.mmap, np.ndarray]:
    """Anonymous private pages, advised huge or not, faulted in."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(MADV_HUGEPAGE)
    pages = np.frombuffer(m, np.uint8)
    pages[::4096] = 0
    return m, pages


def register(piece: int, huge: bool) -> dict[str, float]:
    from cupy.cuda import runtime

    t0 = time.perf_counter()
    m, pages = mapped(TOTAL, huge)
    faulted = time.perf_counter() - t0
    for off in range(0, TOTAL, piece):
        runtime.hostRegister(pages.ctypes.data + off, piece, 0)
    seconds = time.perf_counter() - t0
    for off in range(0, TOTAL, piece):
        runtime.hostUnregister(pages.ctypes.data + off)
    del pages
    m.close()
    return {"seconds": seconds, "faulting_in_s": faulted}


def case(name: str, fn: Callable[[], Any], touch: int, cuda: bool) -> dict[str, Any]:
    stop, late = threading.Event(), []
    thread = threading.Thread(target=ticker, args=(stop, late, touch, cuda))
    thread.start()
    time.sleep(0.1)
    result = fn()
    time.sleep(0.05)
    stop.set()
    thread.join()
    ticks = np.array(late)
    stalls = ticks[ticks > 0.05]
    rec = {"case": name, "touch_bytes": touch, "cuda_calls": cuda, "result": result,
           "ticks": len(ticks), "latest_s": float(ticks.max()), "stalls_50ms": len(stalls),
           "stalled_s": float(stalls.sum())}
    print(json.dumps(rec), flush=True)
    return rec


def copy_rate(kind: str, nbytes: int = 512 * MB) -> float:
    """GB/s of a host-to-device copy from ``kind`` of page-locked memory."""
    import cupy
    from cupy.cuda import runtime

    device = cupy.empty(nbytes, cupy.uint8)
    if kind == "hostAlloc":
        ptr = runtime.hostAlloc(nbytes, 0)
        undo = [lambda: runtime.freeHost(ptr)]
    else:
        m, pages = mapped(nbytes, huge=kind == "register huge")
        ptr = pages.ctypes.data
        runtime.hostRegister(ptr, nbytes, 0)
        undo = [lambda: runtime.hostUnregister(ptr), m.close]
        del pages
    stream = cupy.cuda.Stream(non_blocking=True)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        device.data.copy_from_host_async(ptr, nbytes, stream)
        stream.synchronize()
        best = min(best, time.perf_counter() - t0)
    for u in undo:
        u()
    return nbytes / best / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import cupy

    cupy.zeros(1)  # the context, before the clock
    cases = []
    for touch, cuda in ((0, False), (4 * MB, False), (0, True)):
        cases.append(case("hostAlloc 256 MiB", lambda: host_alloc(256 * MB), touch, cuda))
    busy = (4 * MB, True)
    cases.append(case("hostAlloc 32 MiB", lambda: host_alloc(32 * MB), *busy))
    cases.append(case("CuPy pinned pool 256 MiB", lambda: cupy_pool(256 * MB), *busy))
    for huge in (False, True):
        for piece in (TOTAL, 32 * MB):
            cases.append(case(f"register{' huge' if huge else ''} {piece // MB} MiB",
                              lambda piece=piece, huge=huge: register(piece, huge), *busy))
    rates = {kind: copy_rate(kind) for kind in ("hostAlloc", "register", "register huge")}
    print(json.dumps({"copy_GBps": rates}))
    if args.out is not None:
        args.out.write_text(json.dumps({"total_bytes": TOTAL, "cases": cases,
                                        "copy_GBps": rates}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
