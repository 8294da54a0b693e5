"""Out-of-memory halving: a block that does not fit is computed in halves.

Dask's ``retries=`` would re-run a task unchanged, so the split belongs
inside the task. A kernel over a block of sketch columns that raises an
out-of-memory error (CuPy, RMM, cuBLAS/cuSOLVER workspaces, or ``MemoryError``)
frees the memory pool's cached blocks and is computed again as two halves
along the sketch axis, recursively down to one column; the halves are joined,
so the result is unchanged. The split that worked is remembered in the worker
process for the rest of the run, so later blocks start from it instead of
failing again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("src_dask")

#: (run token, step) -> the most columns a block of that step has fitted in
_FITS: dict[tuple[str, str], int] = {}


def is_oom(err: BaseException) -> bool:
    if isinstance(err, MemoryError):  # cupy's OutOfMemoryError and RMM's are MemoryErrors
        return True
    text = str(err)
    return "ALLOC_FAILED" in text or "out of memory" in text.lower()


def _free_cached(xp: Any) -> None:
    if xp.__name__ == "cupy":
        xp.get_default_memory_pool().free_all_blocks()
        xp.get_default_pinned_memory_pool().free_all_blocks()


def halving(compute: Callable[[int, int], Any], columns: int, *, xp: Any, run: str, step: str,
            site: int, bytes_per_column: int) -> Any:
    """``compute(0, columns)``, or the same computed in pieces if it does not fit.

    Pieces are written into one output buffer as they come, so a split run
    needs the block's input and output plus one piece's temporaries.
    """
    out = _Output(xp, columns)
    _in_pieces(compute, 0, columns, out, (run, step), site, bytes_per_column)
    return out.array


class _Output:
    """The block's result, allocated when its first piece arrives."""

    def __init__(self, xp: Any, rows: int):
        self.xp, self.rows, self.array = xp, rows, None

    def put(self, a: int, b: int, part: Any) -> None:
        if a == 0 and b == self.rows:
            self.array = part
            return
        if self.array is None:
            self.array = self.xp.empty((self.rows, *part.shape[1:]), dtype=part.dtype)
        self.array[a:b] = part


def _in_pieces(compute, a: int, b: int, out: _Output, key: tuple[str, str], site: int,
               per_col: int) -> None:
    """Columns a:b in pieces of the size that fits so far (re-read before each piece:
    a failure here, or in a concurrent task of the run, shrinks it)."""
    lo = a
    while lo < b:
        hi = min(b, lo + _FITS.get(key, b - a))
        _attempt(compute, lo, hi, out, key, site, per_col)
        lo = hi


def _attempt(compute, a: int, b: int, out: _Output, key: tuple[str, str], site: int,
             per_col: int) -> None:
    try:
        out.put(a, b, compute(a, b))
        return
    except Exception as err:
        if not is_oom(err):
            raise
        if b - a == 1:
            raise MemoryError(
                f"site {site}, {key[1]}: one sketch column does not fit in {_memory(out.xp)}; "
                f"it needs about {per_col / 2**20:.1f} MiB for its block and temporaries "
                f"({_remedy(out.xp)})"
            ) from err
    # Out of the except clause: the failed attempt's temporaries, which its
    # traceback holds on to, are released before the pool is emptied.
    _free_cached(out.xp)
    half = (b - a + 1) // 2
    _FITS[key] = min(_FITS.get(key, half), half)
    log.warning("site %d, %s: out of %s on %d sketch columns (about %.1f MiB); "
                "computing it in blocks of %d columns from now on", site, key[1],
                _memory(out.xp), b - a, per_col * (b - a) / 2**20, _FITS[key])
    _in_pieces(compute, a, b, out, key, site, per_col)


def naming_the_site(kernel: Callable[..., Any], *, site: int, step: str) -> Callable[..., Any]:
    """``kernel`` whose out-of-memory errors say which site and step ran out, and
    what to change.

    For the per-site steps that have no sketch axis to split (the QR and the
    projections of pass 2, which the plan cuts in row blocks instead).
    """
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except Exception as err:
            if not is_oom(err):
                raise
            xp = _namespace(args)
            raise MemoryError(
                f"site {site}, {step}: out of {_memory(xp)} ({err}); this step is not split "
                "in halves: lower the Dask config src_dask.projection-block-size (now "
                f"{_config_size('projection-block-size')}) so that pass 2 makes the "
                f"projected core in smaller row blocks, or {_remedy(xp)}") from err
    return run


def _memory(xp: Any) -> str:
    return "device memory" if getattr(xp, "__name__", "") == "cupy" else "host memory"


def _remedy(xp: Any) -> str:
    if getattr(xp, "__name__", "") == "cupy":
        return ("give each GPU worker more free device memory (dask-cuda's "
                "device_memory_limit, fewer tasks per GPU, a larger GPU) or sketch fewer "
                "columns (chi_out + oversample)")
    return ("give each worker more memory (memory_limit / --memory-limit, fewer threads "
            "per worker) or sketch fewer columns (chi_out + oversample)")


def _namespace(args: tuple[Any, ...]) -> Any:
    """``numpy`` or ``cupy``: that of the first array among a kernel's arguments."""
    import numpy as np

    for a in args:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if type(x).__module__.startswith("cupy"):
                import cupy

                return cupy
    return np


def _config_size(key: str) -> str:
    from . import config

    return str(config.get(key))
