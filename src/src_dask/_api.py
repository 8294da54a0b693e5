"""The public entry points: ``src``, ``apply`` and ``compress``."""

from __future__ import annotations

import logging
import math
import numbers
from functools import partial
from typing import Any

import dask

from . import _graph, _random
from ._stack import Stack, make_stack
from .trains import TensorTrain

log = logging.getLogger("src_dask")

#: Largest sketch-environment block a default ``chunk`` aims for.
_BLOCK_BYTES = 256 * 2**20


def src(*trains: Any, chi_out: int, oversample: int | str = 0, cutoff: float = 0.0,
        dtype: Any = None, seed: int | None = None, chunk: int | None = None,
        client: Any = None) -> TensorTrain:
    """Compress the product ``trains[0]·trains[1]·…`` to bond dimension ``chi_out``.

    Successive randomized compression (Camaño, Epperly & Tropp, 2025) run as
    one Dask task graph. The product may be MPO·MPS, MPO·MPO, MPO^k·MPS, a bra
    MPS·MPO^k (not conjugated) or a single train to compress.

    Parameters
    ----------
    *trains
        The factors, leftmost first: sequences of per-site arrays in quimb's
        layouts (NumPy, Dask or Zarr), quimb MPS/MPO objects or TensorTrains.
    chi_out
        Bond dimension of the result.
    oversample
        Extra sketch columns ``p >= 0``, or ``"auto"`` for ``max(ceil(chi_out/2), 10)``.
        With ``p > 0`` the result is rounded exactly to ``chi_out`` by an SVD
        sweep; this brings the error close to the optimal truncation.
    cutoff
        Relative singular-value threshold in ``[0, 1)``: directions below
        ``cutoff * sigma_max`` are dropped (in the QR, or in the rounding when
        oversampling).
    dtype
        Working and output dtype (float32, float64, complex64, complex128);
        promoted from the inputs by default.
    seed
        Seed of the Gaussian sketch. The result depends on it alone, not on
        ``chunk`` nor on the number of workers.
    chunk
        Sketch columns per block, the unit of parallelism and of memory.
    client
        A ``distributed.Client``; by default the current client, else Dask's
        local threaded scheduler.

    Returns
    -------
    TensorTrain
        An MPS (if a factor is an MPS) or an MPO, in quimb's layouts, as NumPy
        arrays. Without oversampling it is right-canonical (all the norm in
        site 0); after rounding it is left-canonical (the norm in the last site).
    """
    chi_out = _positive_int(chi_out, "chi_out")
    extra = _oversample(oversample, chi_out)
    cutoff = _cutoff(cutoff)
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ValueError(f"seed: expected None or a non-negative int, got {seed!r}")
    if chunk is not None:
        chunk = _positive_int(chunk, "chunk")
    scheduler = _scheduler(client)
    stack = make_stack(trains, dtype)

    sketch = chi_out + extra
    plan = _graph.Plan(
        sketch=sketch,
        chunk=min(chunk or _default_chunk(stack, sketch, scheduler), sketch),
        chi_out=chi_out,
        cutoff=cutoff,
        key=_random.seed_key(seed),
        round=extra > 0,
    )
    log.info("src: %d sites, depth %d, %s, sketch %d in blocks of %d, dtype %s",
             stack.n, stack.depth, "bra" if stack.bra else "ket", sketch, plan.chunk,
             stack.dtype)
    if isinstance(scheduler, str):
        graph = _graph.build(stack, plan)
    else:
        graph = _graph.build(stack, plan, sorted(scheduler.scheduler_info()["workers"]),
                             partial(scheduler.scatter, hash=False))
    (cores,) = dask.compute(graph, scheduler=scheduler)
    return TensorTrain(list(cores), stack.kind, name="result")


def apply(mpo: Any, x: Any, chi_out: int, **options: Any) -> TensorTrain:
    """``mpo · x`` compressed to ``chi_out`` (``x`` an MPS or an MPO); see :func:`src`."""
    return src(mpo, x, chi_out=chi_out, **options)


def compress(train: Any, chi_out: int, **options: Any) -> TensorTrain:
    """One train compressed to bond dimension ``chi_out``; see :func:`src`."""
    return src(train, chi_out=chi_out, **options)


# -- option checks ---------------------------------------------------------------
def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _positive_int(x: Any, what: str) -> int:
    if not _is_int(x) or x < 1:
        raise ValueError(f"{what}: expected a positive int, got {x!r}")
    return int(x)


def _oversample(p: Any, chi_out: int) -> int:
    if isinstance(p, str):
        if p != "auto":
            raise ValueError(f"oversample: expected an int >= 0 or 'auto', got {p!r}")
        return max(math.ceil(chi_out / 2), 10)
    if not _is_int(p) or p < 0:
        raise ValueError(f"oversample: expected an int >= 0 or 'auto', got {p!r}")
    return int(p)


def _cutoff(c: Any) -> float:
    if not isinstance(c, numbers.Real) or isinstance(c, bool) or not 0 <= c < 1:
        raise ValueError(f"cutoff: expected a number in [0, 1), got {c!r}")
    return float(c)


def _scheduler(client: Any) -> Any:
    """The scheduler to compute on: the given client, the current one, or threads."""
    from distributed import Client

    if client is not None:
        if not isinstance(client, Client):
            raise TypeError(f"client: expected a distributed.Client, got {type(client).__name__}")
        return client
    try:
        return Client.current(allow_global=True)
    except ValueError:
        return "threads"


def _default_chunk(stack: Stack, sketch: int, scheduler: Any) -> int:
    """Columns per block: one block per worker thread, none over ``_BLOCK_BYTES``."""
    slots = 1 if isinstance(scheduler, str) else max(1, sum(scheduler.nthreads().values()))
    per_column = max(math.prod(stack.left_bonds(j)) for j in range(stack.n))
    per_column *= stack.dtype.itemsize
    blocks = max(slots, math.ceil(sketch * per_column / _BLOCK_BYTES))
    return math.ceil(sketch / blocks)
